//! The graph type of a function without buckets: `FooGraph` with its `capture`, `replay`,
//! `verify` and state access, and the `FooInputs` / `FooOutputs` / `FooState` views.
//!
//! Imports `parts.rs`, `args`, `model` and `tokens`; never its parent (`expand.rs`),
//! `buckets.rs` or `check`.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use super::parts::{capture_generic, debug_view, CaptureParam, Parts};
use crate::args::{GraphArgs, VerifyEvery};
use crate::model::{Param, Role};
use crate::tokens::relocated;

/// The graph type of the function and its views, as the items of the generated module,
/// and the names to re-export from it.
pub(super) fn expand_graph(parts: &Parts, args: &GraphArgs) -> (TokenStream, Vec<Ident>) {
    let (model, krate, pr, vis) = (parts.model, parts.krate, &parts.pr, &parts.vis);
    let (fn_name, item) = (&parts.fn_name, &model.item);
    let (inputs, outputs, states) = (&parts.inputs, &parts.outputs, &parts.states);
    let graph_ty = parts.type_name("Graph");
    let inputs_ty = parts.type_name("Inputs");
    let outputs_ty = parts.type_name("Outputs");
    let state_ty = parts.type_name("State");
    let warmup = args.warmup();
    let ty = |p: &Param| parts.ty(p);

    // Struct fields: static buffers and held state, all private to the generated module.
    let static_fields = model
        .of(|r| matches!(r, Role::Input | Role::Output))
        .map(|p| {
            let (i, t) = (&p.ident, ty(p));
            quote!(#i: #t)
        });
    let state_fields = parts.state_fields();
    let const_fields = parts.const_fields();
    // A returned value (`-> Result<Tensor>`): a static buffer filled inside the graph.
    let result_ty = model.result.as_ref().map(relocated);
    let result_field = result_ty.iter().map(|t| quote!(result: #t));

    // `capture`: generics and parameters, in the function's order.
    let capture_params: Vec<CaptureParam> = model
        .params
        .iter()
        .enumerate()
        .map(|(n, p)| {
            let (i, t) = (&p.ident, ty(p));
            match p.role {
                Role::Input => {
                    let g = capture_generic(n);
                    (
                        Some(quote!(#g: ?Sized + #pr::InputSource<#t>)),
                        quote!(#i: &#g),
                    )
                }
                // A `CudaSlice` output is given by its length: the docs then read `y: usize`.
                Role::Output if is_cuda_slice(&p.ty) => (None, quote!(#i: usize)),
                Role::Output => (None, quote!(#i: <#t as #pr::StaticBuffer>::Shape)),
                _ => parts.held_capture_param(n, p),
            }
        })
        .collect();
    let hold_states = parts.hold_states();
    let stage = model.params.iter().enumerate().filter_map(|(n, p)| {
        let (i, t) = (&p.ident, ty(p));
        let local = local(n);
        let name = i.to_string();
        match p.role {
            Role::Input => Some(quote_spanned!(p.ty.span()=>
                let #local: #t = #pr::stage_input::<#t, _>(rt, __site, #name, #i)?;
            )),
            Role::Output => Some(quote_spanned!(p.ty.span()=>
                let mut #local: #t = #pr::alloc_static::<#t>(rt, __site, #name, #i)?;
            )),
            _ => None,
        }
    });
    let static_locals: Vec<Ident> = model
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p.role, Role::Input | Role::Output))
        .map(|(n, _)| local(n))
        .collect();
    // The address book: state first (indices 0.. are what replays check), then outputs.
    let checked: Vec<(Ident, TokenStream, TokenStream)> = states
        .iter()
        .map(|p| {
            let i = &p.ident;
            (i.clone(), quote!(&*#i), parts.recorded_kind(p))
        })
        .chain(model.params.iter().enumerate().filter_map(|(n, p)| {
            let local = local(n);
            (p.role == Role::Output).then(|| {
                (
                    p.ident.clone(),
                    quote!(&#local),
                    quote!(#pr::Recorded::Output),
                )
            })
        }))
        .collect();
    let records = checked.iter().enumerate().map(|(k, (i, value, restore))| {
        let name = i.to_string();
        let index = format_ident!("__index{}", k);
        quote!(let #index = __book.record(#name, #value, #restore);)
    });
    let capture_checks: Vec<TokenStream> = checked
        .iter()
        .enumerate()
        .map(|(k, (_, value, _))| {
            let index = format_ident!("__index{}", k);
            quote!(__book.check(#index, #value, __when)?;)
        })
        .collect();
    let call_args: Vec<TokenStream> = model
        .params
        .iter()
        .enumerate()
        .map(|(n, p)| {
            let i = &p.ident;
            let local = local(n);
            match p.role {
                Role::Input => quote!(&#local),
                Role::Output => quote!(&mut #local),
                _ => parts.held_arg(p, quote!(#i)),
            }
        })
        .collect();
    let result_init = result_ty.iter().map(|_| quote!(result: __result_value));
    let init_fields = model.params.iter().enumerate().filter_map(|(n, p)| {
        let i = &p.ident;
        let local = local(n);
        match p.role {
            Role::Input | Role::Output => Some(quote!(#i: #local)),
            Role::State { .. } | Role::Constant => Some(quote!(#i)),
            Role::Bucket => None,
        }
    });

    // `verify`: the eager call on copies of the inputs into shadow outputs.
    let verify_inputs = inputs.iter().map(|p| {
        let (i, t) = (&p.ident, ty(p));
        let copy = format_ident!("__copy_{}", i);
        let name = i.to_string();
        quote!(let #copy: #t = #pr::stage_input::<#t, _>(&__rt, __site, #name, #i)?;)
    });
    let verify_shadows = outputs.iter().map(|p| {
        let (i, t) = (&p.ident, ty(p));
        let shadow = format_ident!("__shadow_{}", i);
        let name = i.to_string();
        quote!(let mut #shadow: #t = #pr::alloc_static::<#t>(&__rt, __site, #name, #pr::StaticBuffer::shape(&self.#i))?;)
    });
    let verify_call_args: Vec<TokenStream> = model
        .params
        .iter()
        .map(|p| {
            let i = &p.ident;
            match p.role {
                Role::Input => {
                    let copy = format_ident!("__copy_{}", i);
                    quote!(&#copy)
                }
                Role::Output => {
                    let shadow = format_ident!("__shadow_{}", i);
                    quote!(&mut #shadow)
                }
                Role::State { .. } => parts.held_arg(p, quote!(self.#i)),
                // The whole argument at the constant's type, `self.` included.
                Role::Constant | Role::Bucket => {
                    quote_spanned!(p.ty.span()=> #pr::constant(&self.#i))
                }
            }
        })
        .collect();
    let verify_eager_outputs = outputs
        .iter()
        .map(|p| {
            let i = &p.ident;
            let shadow = format_ident!("__shadow_{}", i);
            let name = i.to_string();
            quote!(__verifier.eager_output(#name, &#shadow)?;)
        })
        .chain(
            result_ty
                .iter()
                .map(|_| quote!(__verifier.eager_output("result", &__shadow_result)?;)),
        );
    let verify_replay_outputs = outputs
        .iter()
        .map(|p| {
            let i = &p.ident;
            let name = i.to_string();
            quote!(__verifier.replay_output(#name, &self.#i)?;)
        })
        .chain(
            result_ty
                .iter()
                .map(|_| quote!(__verifier.replay_output("result", &self.result)?;)),
        );
    let replay_args: Vec<&Ident> = inputs.iter().map(|p| &p.ident).collect();
    let verify_schedule = verify_schedule_tokens(args, pr);

    // Replays check every state's addresses (their indices are 0..) before launching.
    let replay_checks = parts.replay_checks();
    let (replay_generics, replay_params) = parts.replay_inputs();
    let shape_checks: Vec<TokenStream> = inputs
        .iter()
        .map(|p| {
            let i = &p.ident;
            let name = i.to_string();
            quote!(#pr::check_shape(__site, #name, &self.#i, #i)?;)
        })
        .collect();
    let copies: Vec<TokenStream> = inputs
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let i = &p.ident;
            quote!(#pr::feed_input(__staging, #k, #i, #pr::DeviceState::lend(&mut self.#i))?;)
        })
        .collect();
    let register_inputs = model
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.role == Role::Input)
        .map(|(n, _)| {
            let local = local(n);
            quote!(__inputs.add(&#local);)
        });

    let input_view_fields = inputs.iter().map(|p| {
        let (i, t) = (&p.ident, ty(p));
        let doc =
            format!("The static buffer of input `{i}`: write here, then [`{graph_ty}::launch`].");
        quote!(#[doc = #doc] pub #i: <#t as #pr::DeviceState>::Lent<'g>)
    });
    let input_view_init = inputs.iter().map(|p| {
        let i = &p.ident;
        quote!(#i: #pr::DeviceState::lend(&mut self.#i))
    });
    let output_view_fields = outputs
        .iter()
        .map(|p| {
            let (i, t) = (&p.ident, ty(p));
            let doc = format!("Output `{i}`, as the last replay left it.");
            quote!(#[doc = #doc] pub #i: &'g #t)
        })
        .chain(result_ty.iter().map(|t| {
            let doc = format!(
                "What `{fn_name}` returned, copied into the graph's static buffer by the last replay."
            );
            quote!(#[doc = #doc] pub result: &'g #t)
        }));
    let output_view_init = outputs
        .iter()
        .map(|p| {
            let i = &p.ident;
            quote!(#i: &self.#i)
        })
        .chain(result_ty.iter().map(|_| quote!(result: &self.result)));
    let state_view_fields = states.iter().map(|p| {
        let (i, t) = (&p.ident, ty(p));
        match p.role {
            Role::State { mutable: true } => {
                let doc = format!(
                    "State `{i}`, lent back between replays (a `CudaSlice` as a `CudaViewMut`): \
                     write into it in place; the graph reads it by address."
                );
                quote!(#[doc = #doc] pub #i: <#t as #pr::DeviceState>::Lent<'g>)
            }
            _ => {
                let doc = format!("State `{i}` (read-only while the graph lives).");
                quote!(#[doc = #doc] pub #i: &'g #t)
            }
        }
    });
    let state_view_init = states.iter().map(|p| {
        let i = &p.ident;
        match p.role {
            Role::State { mutable: true } => quote!(#i: #pr::DeviceState::lend(&mut *self.#i)),
            _ => quote!(#i: &*self.#i),
        }
    });

    let ctx_call = parts.ctx_call(quote!(rt));
    let verify_ctx = parts.ctx_call(quote!(&__rt));
    let body_result = parts.body_result();
    // The body's call during warmup and capture, and in `verify`'s eager run.
    let call = parts.call(&call_args);
    let verify_call = parts.call(&verify_call_args);
    let body_value = quote_spanned!(item.sig.output.span()=> #pr::BodyValue::into_graph_value);
    let run_body = match &result_ty {
        None => quote!(#body_result(#call)),
        Some(t) => {
            quote!({
                let __value = #body_value(#call)?;
                #pr::store_result::<#t>(rt, __site, &mut __result_slot, &__value)
            })
        }
    };
    let verify_verb = match &result_ty {
        None => quote!(#body_result(#verify_call)?;),
        Some(t) => {
            quote!(
                let __value = #body_value(#verify_call)?;
                __shadow_result = #pr::copy_result::<#t>(&__rt, __site, &__value)?;
            )
        }
    };
    let result_slot = result_ty
        .iter()
        .map(|t| quote!(let mut __result_slot: ::core::option::Option<#t> = ::core::option::Option::None;));
    let result_take = result_ty.iter().map(|_| {
        quote!(let __result_value = __result_slot.ok_or(#krate::GraphError::EmptyGraph { graph: __site.name })?;)
    });
    let shadow_result_decl = result_ty.iter().map(|t| quote!(let __shadow_result: #t;));

    let times = match warmup {
        1 => "once".to_string(),
        2 => "twice".to_string(),
        n => format!("{n} times"),
    };
    let runs = if warmup == 1 {
        "1 eager run".to_string()
    } else {
        format!("{warmup} eager runs")
    };
    let struct_doc = format!(
        "The CUDA graph of [`{fn_name}`], generated by `#[cuda_graph(warmup = {warmup})]`.\n\n\
         [`{graph_ty}::capture`] runs `{fn_name}` {times} eagerly on the runtime's stream, records it \
         once and instantiates the graph; [`{graph_ty}::replay`] copies new inputs into the graph's static \
         buffers and launches it. The outputs are lent out until the next replay.\n\n\
         The graph keeps its runtime alive and holds its state for its whole life: borrowed (the graph is \
         `{graph_ty}<'s>`), shared through an `Arc`, or owned (a `{graph_ty}<'static>` can live in a struct \
         of yours). Before every replay it checks that the state still holds the buffers it was captured \
         with."
    );
    let capture_doc = format!(
        "Warms up `{fn_name}` ({runs} on the runtime's stream), captures it and instantiates \
         the graph.\n\nInputs are copied into static buffers of the same shape (the warmup and capture run \
         on those values); outputs are given by shape (a length for a `CudaSlice`) and start zeroed; state is given as `&T` / `&mut T` \
         (borrowed for the graph's lifetime), as an `Arc<T>` (read-only state) or by value (the graph owns \
         it); `&mut` state is snapshotted before the warmup and restored after it unless marked \
         `#[state(no_restore)]`; constants are frozen into the graph."
    );
    let replay_doc = "Copies the inputs into the graph's static buffers and launches the graph, all on the \
                      runtime's stream; returns as soon as the work is queued.\n\nEvery input's shape and \
                      every state's addresses are checked before anything is queued: a mismatch is \
                      [`GraphError::InputShape`] or [`GraphError::StateMoved`] and launches \
                      nothing.\n\n[`GraphError::InputShape`]: graph_runtime::GraphError::InputShape\n\
                      [`GraphError::StateMoved`]: graph_runtime::GraphError::StateMoved";
    let verify_doc = "Checks one replay against the eager function on the same inputs: runs the \
                      function eagerly on copies of the inputs into shadow outputs, undoes what that \
                      run did to the `&mut` state and the random generators, replays the graph, and \
                      compares every output and every `&mut` state element by element \
                      (`Tolerance::BITWISE`, or within a tolerance). Afterwards everything is as a \
                      plain `replay` leaves it; the outputs hold the replay's values.";
    let graph_name = graph_ty.to_string();

    // `capture`: the warmup and capture of the body on static buffers.
    let closure = parts.body_closure(
        ctx_call,
        quote!(__step: #pr::Step),
        quote!(#pr::Step::Run(_) => #run_body,),
        &capture_checks,
    );
    let capture = parts.site_and_capture(
        &capture_doc,
        capture_params,
        quote! {
            #(#hold_states)*
            #(#stage)*
            let __static_bytes = 0 #(+ #pr::static_bytes(&#static_locals))*;
            let mut __book = #pr::AddressBook::new(__site.name);
            #(#records)*
            let mut __inputs = #pr::InputNodes::new();
            #(#register_inputs)*
            #(#result_slot)*
            let __graph = {
                #closure
                #pr::capture(rt, __site, __book, &__inputs, __static_bytes, &mut __body)?
            };
            #(#result_take)*
            ::core::result::Result::Ok(Self {
                __graph,
                __book,
                __verify: #verify_schedule,
                #(#result_init,)*
                #(#init_fields,)*
                __state: ::core::marker::PhantomData,
            })
        },
    );

    let outputs_debug = debug_view(&outputs_ty);
    let inputs_debug = debug_view(&inputs_ty);
    let state_debug = debug_view(&state_ty);

    let body = quote! {
        #[doc = #struct_doc]
        #[must_use = "a captured graph does nothing until it is replayed"]
        #vis struct #graph_ty<'s> {
            __graph: #pr::Graph,
            __book: #pr::AddressBook,
            __verify: #pr::VerifySchedule,
            #(#static_fields,)*
            #(#result_field,)*
            #(#state_fields,)*
            #(#const_fields,)*
            __state: ::core::marker::PhantomData<&'s ()>,
        }

        /// The static input buffers of the graph, lent as views to fill in place before a
        /// `launch` (no copy at replay); a view can be written into, not replaced.
        #vis struct #inputs_ty<'g> {
            #(#input_view_fields,)*
            #[doc(hidden)]
            pub __marker: ::core::marker::PhantomData<&'g mut ()>,
        }

        /// The graph's outputs, borrowed from the graph: they stay valid
        /// until the next replay, which cannot start while they are held.
        #vis struct #outputs_ty<'g> {
            #(#output_view_fields,)*
            #[doc(hidden)]
            pub __marker: ::core::marker::PhantomData<&'g ()>,
        }

        /// The state the graph reads by address, lent back between replays.
        #vis struct #state_ty<'g> {
            #(#state_view_fields,)*
            #[doc(hidden)]
            pub __marker: ::core::marker::PhantomData<&'g mut ()>,
        }

        impl ::core::fmt::Debug for #graph_ty<'_> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(#graph_name)
                    .field("info", self.__graph.info())
                    .finish_non_exhaustive()
            }
        }

        #outputs_debug

        #inputs_debug

        #state_debug

        /// The graph's summary: nodes by kind, kernels by name, edges, memory, timings.
        impl ::core::fmt::Display for #graph_ty<'_> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                ::core::fmt::Display::fmt(&self.__graph, f)
            }
        }

        #[allow(dead_code)]
        impl<'s> #graph_ty<'s> {
            /// Eager runs before the capture.
            pub const WARMUP: u32 = #warmup;

            #capture

            #[doc = #replay_doc]
            #[inline]
            #[allow(clippy::too_many_arguments)]
            #vis fn replay<#(#replay_generics),*>(
                &mut self,
                #(#replay_params),*
            ) -> ::core::result::Result<#outputs_ty<'_>, #krate::GraphError> {
                if let ::core::option::Option::Some(__tolerance) = self.__verify.due() {
                    self.verify(#(#replay_args,)* __tolerance)?.into_result()?;
                    return ::core::result::Result::Ok(self.outputs());
                }
                let __site = Self::__site();
                #(#shape_checks)*
                #(#replay_checks)*
                #pr::replay(&self.__graph, |__staging| {
                    #(#copies)*
                    ::core::result::Result::Ok(())
                })?;
                ::core::result::Result::Ok(self.outputs())
            }

            #[doc = #verify_doc]
            #[allow(clippy::too_many_arguments)]
            #vis fn verify<#(#replay_generics),*>(
                &mut self,
                #(#replay_params,)*
                tolerance: #krate::Tolerance,
            ) -> ::core::result::Result<#krate::VerifyReport, #krate::GraphError> {
                let __site = Self::__site();
                #(#shape_checks)*
                #(#replay_checks)*
                let __rt = ::core::clone::Clone::clone(self.__graph.runtime());
                let mut __verifier = #pr::Verifier::begin(&__rt, &self.__book, tolerance)?;
                #(#verify_inputs)*
                #(#verify_shadows)*
                #(#shadow_result_decl)*
                {
                    let __ctx = #verify_ctx;
                    #verify_verb
                }
                #(#verify_eager_outputs)*
                __verifier.rewind()?;
                #pr::replay(&self.__graph, |__staging| {
                    #(#copies)*
                    ::core::result::Result::Ok(())
                })?;
                #(#verify_replay_outputs)*
                __verifier.finish()
            }

            /// Launches the graph with the inputs as they are in its static buffers
            /// (see `inputs_mut`): a replay without copies. The state's addresses are
            /// checked first, as in `replay`.
            #[inline]
            #vis fn launch(&mut self) -> ::core::result::Result<#outputs_ty<'_>, #krate::GraphError> {
                #(#replay_checks)*
                #pr::launch_as_is(&self.__graph)?;
                ::core::result::Result::Ok(self.outputs())
            }

            /// The static input buffers, lent as views to write the next inputs in place.
            #vis fn inputs_mut(&mut self) -> #inputs_ty<'_> {
                #inputs_ty { #(#input_view_init,)* __marker: ::core::marker::PhantomData }
            }

            /// The outputs as the last replay left them.
            #vis fn outputs(&self) -> #outputs_ty<'_> {
                #outputs_ty { #(#output_view_init,)* __marker: ::core::marker::PhantomData }
            }

            /// The state, lent back between replays: `&mut` state in its `DeviceState::Lent`
            /// form (a `CudaSlice` as a `CudaViewMut`), read-only state as `&T`. When some
            /// state lives on a stream other than the runtime's, this first waits for the
            /// replays in flight (`Graph::settle`).
            #vis fn state_mut(&mut self) -> #state_ty<'_> {
                self.__graph.settle();
                #state_ty { #(#state_view_init,)* __marker: ::core::marker::PhantomData }
            }

            /// Node count, memory and timings of the capture.
            #vis fn info(&self) -> &#krate::GraphInfo {
                self.__graph.info()
            }

            /// The instantiated graph (its facts and raw handles).
            #vis fn graph(&self) -> &#krate::Graph {
                &self.__graph
            }
        }
    };
    (body, vec![graph_ty, inputs_ty, outputs_ty, state_ty])
}

/// When the graph's replays verify themselves: `verify = "never" | "first" | "every"` with
/// `verify_every = N`, and `verify_tolerance`; by default the first replay in debug builds.
fn verify_schedule_tokens(args: &GraphArgs, pr: &TokenStream) -> TokenStream {
    let every = match args.verify {
        None => quote!(if ::core::cfg!(debug_assertions) {
            #pr::VerifySchedule::FIRST
        } else {
            #pr::VerifySchedule::NEVER
        }),
        Some(VerifyEvery::Never) => quote!(#pr::VerifySchedule::NEVER),
        Some(VerifyEvery::First) => quote!(#pr::VerifySchedule::FIRST),
        Some(VerifyEvery::Every(n)) => quote!(#n),
    };
    let tolerance = match args.verify_tolerance {
        None => quote!(#pr::Tolerance::BITWISE),
        Some(t) => quote!(#pr::Tolerance::new(#t, #t)),
    };
    quote!(#pr::VerifySchedule::new(#every, #tolerance))
}

/// Whether `t` is written as a `CudaSlice<…>` (any path ending in it), whose shape is a length.
fn is_cuda_slice(t: &syn::Type) -> bool {
    match t {
        syn::Type::Path(p) if p.qself.is_none() => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "CudaSlice"),
        _ => false,
    }
}

/// The capture-time local holding parameter `n`'s static buffer.
fn local(n: usize) -> Ident {
    format_ident!("__static{}", n)
}
