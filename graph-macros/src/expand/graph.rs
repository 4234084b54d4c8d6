//! The graph type of a function without buckets: `FooGraph`, a wrapper around the runtime's
//! `TypedGraph<FooBody>`, and the `FooInputs` / `FooOutputs` / `FooState` views.
//!
//! The expansion is thin: the macro fills in the runtime's `GraphBody` trait for the
//! function's static buffers (`FooBody`: run the body, record and check addresses, lend the
//! views) and `ReplayInputs` for the tuple of a replay's inputs (check shapes, stage them,
//! the eager run of `verify`); `TypedGraph` supplies everything else once. Only the typed
//! `capture`, `replay` and `verify` stay generated, `replay` and `verify` forwarding in a
//! line. One function per generated item, as serde_derive's `ser.rs` does; the generated
//! locals are named after the user's parameters.
//!
//! Imports `parts.rs`, `args`, `model` and `tokens`; never its parent (`expand.rs`),
//! `buckets.rs` or `check`.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use super::parts::{capture_generic, CaptureParam, Parts};
use crate::args::{GraphArgs, VerifyEvery};
use crate::model::{Param, Role};
use crate::tokens::relocated;

/// The graph type of the function and its views, as the items of the generated module,
/// and the names to re-export from it.
pub(super) fn expand_graph(parts: &Parts, args: &GraphArgs) -> (TokenStream, Vec<Ident>) {
    let g = Gen::new(parts, args);
    let (pr, graph_ty, body_ty) = (g.pr, &g.graph_ty, &g.body_ty);
    let (inputs_ty, outputs_ty, state_ty) = (&g.inputs_ty, &g.outputs_ty, &g.state_ty);
    let types = g.types();
    let views = g.views();
    let graph_body = g.graph_body();
    let replay_inputs = g.replay_inputs();
    let methods = g.methods();
    let body = quote! {
        #types
        #views
        #pr::graph_type_impls!(#graph_ty, #body_ty, #inputs_ty, #outputs_ty, #state_ty);
        #graph_body
        #replay_inputs
        #methods
    };
    let names = vec![
        graph_ty.clone(),
        inputs_ty.clone(),
        outputs_ty.clone(),
        state_ty.clone(),
    ];
    (body, names)
}

/// `FooBody` → `__FooBody`, for the generated types users never name.
trait Hidden {
    fn hidden(self) -> Ident;
}

impl Hidden for Ident {
    fn hidden(self) -> Ident {
        format_ident!("__{}", self, span = self.span())
    }
}

/// What every generated item of a single graph needs: the function's parts, the graph's
/// arguments and the generated types' names.
struct Gen<'p, 'm> {
    parts: &'p Parts<'m>,
    args: &'p GraphArgs,
    pr: &'p TokenStream,
    vis: &'p TokenStream,
    graph_ty: Ident,
    body_ty: Ident,
    statics_ty: Ident,
    inputs_ty: Ident,
    outputs_ty: Ident,
    state_ty: Ident,
    /// A returned value (`-> Result<Tensor>`): a static buffer filled inside the graph.
    result_ty: Option<TokenStream>,
}

impl<'p, 'm> Gen<'p, 'm> {
    fn new(parts: &'p Parts<'m>, args: &'p GraphArgs) -> Self {
        Gen {
            parts,
            args,
            pr: &parts.pr,
            vis: &parts.vis,
            graph_ty: parts.type_name("Graph"),
            // Hidden: named so that a type of the user's module is not shadowed by them.
            body_ty: parts.type_name("Body").hidden(),
            statics_ty: parts.type_name("Statics").hidden(),
            inputs_ty: parts.type_name("Inputs"),
            outputs_ty: parts.type_name("Outputs"),
            state_ty: parts.type_name("State"),
            result_ty: parts.model.result.as_ref().map(relocated),
        }
    }

    fn ty(&self, p: &Param) -> TokenStream {
        self.parts.ty(p)
    }

    /// `FooGraph<'s>`, the user's type, and `FooBody<'s>`, the static buffers, the held
    /// state and the constants.
    fn types(&self) -> TokenStream {
        let (pr, vis, graph_ty, body_ty) = (self.pr, self.vis, &self.graph_ty, &self.body_ty);
        let statics_ty = &self.statics_ty;
        let static_fields = self
            .parts
            .model
            .of(|r| matches!(r, Role::Input | Role::Output))
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                quote!(#i: #t)
            });
        let state_fields = self.parts.state_fields();
        let const_fields = self.parts.const_fields();
        let result_field = self
            .result_ty
            .iter()
            .map(|t| quote!(result: ::core::option::Option<#t>));
        let doc = self.struct_doc();
        quote! {
            #[doc = #doc]
            #[must_use = "a captured graph does nothing until it is replayed"]
            #vis struct #graph_ty<'s>(#pr::TypedGraph<#body_ty<'s>>);

            #[doc(hidden)]
            #vis struct #body_ty<'s> {
                __statics: #statics_ty,
                #(#state_fields,)*
                #(#const_fields,)*
                __state: ::core::marker::PhantomData<&'s ()>,
            }

            #[doc(hidden)]
            #vis struct #statics_ty {
                #(#static_fields,)*
                #(#result_field,)*
            }
        }
    }

    fn struct_doc(&self) -> String {
        let (fn_name, graph_ty, warmup) = (&self.parts.fn_name, &self.graph_ty, self.args.warmup());
        format!(
            "The CUDA graph of [`{fn_name}`], generated by `#[cuda_graph(warmup = {warmup})]`: \
             [`{graph_ty}::capture`] warms it up, records it and instantiates the graph; \
             [`{graph_ty}::replay`] copies new inputs in and launches it. `launch`, `inputs_mut`, \
             `outputs`, `state_mut`, `info` and `graph` come from the runtime's `TypedGraph` \
             (see \"What the macro generates\" in the `graph_runtime` docs)."
        )
    }

    /// The three views: `FooInputs` (static inputs lent to fill in place), `FooOutputs`
    /// (outputs borrowed until the next replay) and `FooState` (state lent between replays).
    fn views(&self) -> TokenStream {
        let (vis, inputs_ty, outputs_ty, state_ty) =
            (self.vis, &self.inputs_ty, &self.outputs_ty, &self.state_ty);
        let input_fields = self.input_view_fields();
        let output_fields = self.output_view_fields();
        let state_fields = self.state_view_fields();
        quote! {
            /// The static input buffers of the graph, lent as views to fill in place before a
            /// `launch` (no copy at replay); a view can be written into, not replaced.
            #vis struct #inputs_ty<'g> {
                #(#input_fields,)*
                #[doc(hidden)]
                pub __marker: ::core::marker::PhantomData<&'g mut ()>,
            }

            /// The graph's outputs, borrowed from the graph: they stay valid
            /// until the next replay, which cannot start while they are held.
            #vis struct #outputs_ty<'g> {
                #(#output_fields,)*
                #[doc(hidden)]
                pub __marker: ::core::marker::PhantomData<&'g ()>,
            }

            /// The state the graph reads by address, lent back between replays.
            #vis struct #state_ty<'g> {
                #(#state_fields,)*
                #[doc(hidden)]
                pub __marker: ::core::marker::PhantomData<&'g mut ()>,
            }
        }
    }

    fn input_view_fields(&self) -> Vec<TokenStream> {
        let pr = self.pr;
        self.parts
            .inputs
            .iter()
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                let doc = format!("Input `{i}`'s static buffer.");
                quote!(#[doc = #doc] pub #i: <#t as #pr::DeviceState>::Lent<'g>)
            })
            .collect()
    }

    fn output_view_fields(&self) -> Vec<TokenStream> {
        let fn_name = &self.parts.fn_name;
        self.parts
            .outputs
            .iter()
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                let doc = format!("Output `{i}`.");
                quote!(#[doc = #doc] pub #i: &'g #t)
            })
            .chain(self.result_ty.iter().map(|t| {
                let doc = format!("What `{fn_name}` returned.");
                quote!(#[doc = #doc] pub result: &'g #t)
            }))
            .collect()
    }

    fn state_view_fields(&self) -> Vec<TokenStream> {
        let pr = self.pr;
        self.parts
            .states
            .iter()
            .map(|p| {
                let (i, t) = (&p.ident, self.ty(p));
                let doc = format!("State `{i}`.");
                match p.role {
                    Role::State { mutable: true } => {
                        quote!(#[doc = #doc] pub #i: <#t as #pr::DeviceState>::Lent<'g>)
                    }
                    _ => quote!(#[doc = #doc] pub #i: &'g #t),
                }
            })
            .collect()
    }

    /// `impl GraphBody for FooBody`: what the runtime's `TypedGraph` needs of the function.
    fn graph_body(&self) -> TokenStream {
        let (pr, body_ty) = (self.pr, &self.body_ty);
        let (inputs_ty, outputs_ty, state_ty) = (&self.inputs_ty, &self.outputs_ty, &self.state_ty);
        let statics_ty = &self.statics_ty;
        let graph_name = self.graph_ty.to_string();
        let site = &self.parts.site;
        let ctx_ty = self.parts.ctx_ty();
        let ctx_assoc = quote_spanned!(ctx_ty.span()=> type Ctx = #ctx_ty;);
        let run = self.run_body();
        let (records, checks) = self.records_and_checks();
        let statics: Vec<&Ident> = self
            .parts
            .model
            .of(|r| matches!(r, Role::Input | Role::Output))
            .map(|p| &p.ident)
            .collect();
        let register = self.parts.inputs.iter().map(|p| &p.ident);
        let captured = self.result_ty.iter().map(|_| {
            quote! {
                fn captured(&self) -> #pr::Result<()> {
                    match self.__statics.result {
                        ::core::option::Option::Some(_) => ::core::result::Result::Ok(()),
                        ::core::option::Option::None => ::core::result::Result::Err(
                            #pr::GraphError::EmptyGraph { graph: Self::site().name },
                        ),
                    }
                }
            }
        });
        let accessors = self.view_accessors();
        quote! {
            impl<'s> #pr::GraphBody for #body_ty<'s> {
                #ctx_assoc
                type Inputs<'g> = #inputs_ty<'g> where Self: 'g;
                type Outputs<'g> = #outputs_ty<'g> where Self: 'g;
                type State<'g> = #state_ty<'g> where Self: 'g;
                type Statics = #statics_ty;
                const GRAPH_TYPE: &'static str = #graph_name;
                fn site() -> &'static #pr::GraphSite {
                    static SITE: #pr::GraphSite = #site;
                    &SITE
                }
                fn statics(&mut self) -> &mut #statics_ty {
                    &mut self.__statics
                }
                fn run(&mut self, __ctx: &Self::Ctx, rt: &#pr::Runtime) -> #pr::Result<()> {
                    #run
                }
                fn record(&self, __book: &mut #pr::AddressBook) {
                    #(#records)*
                }
                fn check(&self, __book: &#pr::AddressBook, __when: #pr::When, __outputs: bool) -> #pr::Result<()> {
                    #checks
                    ::core::result::Result::Ok(())
                }
                fn register_inputs(&self, __inputs: &mut #pr::InputNodes) {
                    #(__inputs.add(&self.__statics.#register);)*
                }
                fn static_bytes(&self) -> usize {
                    0 #(+ #pr::static_bytes(&self.__statics.#statics))*
                }
                #(#captured)*
                #accessors
            }
        }
    }

    /// The body's run during warmup and capture: the user's function on the static buffers,
    /// its returned value stored in the graph's result buffer if it has one.
    fn run_body(&self) -> TokenStream {
        let pr = self.pr;
        let call_args: Vec<TokenStream> = self
            .parts
            .model
            .params
            .iter()
            .map(|p| {
                let i = &p.ident;
                match p.role {
                    Role::Input => quote!(&self.__statics.#i),
                    Role::Output => quote!(&mut self.__statics.#i),
                    Role::State { .. } => self.parts.held_arg(p, quote!(self.#i)),
                    // The whole argument at the constant's type, `self.` included.
                    Role::Constant | Role::Bucket => {
                        quote_spanned!(p.ty.span()=> #pr::constant(&self.#i))
                    }
                }
            })
            .collect();
        let call = self.parts.call(&call_args);
        match &self.result_ty {
            None => {
                let body_result = self.parts.body_result();
                quote!(#body_result(#call))
            }
            Some(t) => {
                let body_value = self.body_value();
                quote! {
                    let __value = #body_value(#call)?;
                    #pr::store_result::<#t>(rt, Self::site(), &mut self.__statics.result, &__value)
                }
            }
        }
    }

    fn body_value(&self) -> TokenStream {
        let pr = self.pr;
        quote_spanned!(self.parts.model.item.sig.output.span()=> #pr::BodyValue::into_graph_value)
    }

    /// The address book's records (state first, then outputs: indices `0..`) and the checks
    /// of the same addresses, the outputs' only when `__outputs`.
    fn records_and_checks(&self) -> (Vec<TokenStream>, TokenStream) {
        let pr = self.pr;
        let states = self.parts.states.iter().map(|p| {
            let i = &p.ident;
            (i, quote!(&*self.#i), self.parts.recorded_kind(p))
        });
        let outputs = self.parts.outputs.iter().map(|p| {
            let i = &p.ident;
            (i, quote!(&self.__statics.#i), quote!(#pr::Recorded::Output))
        });
        let all: Vec<_> = states.chain(outputs).collect();
        let records = all
            .iter()
            .map(|(i, value, kind)| {
                let name = i.to_string();
                quote!(__book.record(#name, #value, #kind);)
            })
            .collect();
        let check = |k: usize| {
            let value = &all[k].1;
            quote!(__book.check(#k, #value, __when)?;)
        };
        let n = self.parts.states.len();
        let state_checks = (0..n).map(check);
        let output_checks: Vec<TokenStream> = (n..all.len()).map(check).collect();
        let output_checks =
            (!output_checks.is_empty()).then(|| quote!(if __outputs { #(#output_checks)* }));
        (records, quote!(#(#state_checks)* #output_checks))
    }

    /// `inputs_mut`, `outputs`, `state_mut` and `outputs_to` of `GraphBody`.
    fn view_accessors(&self) -> TokenStream {
        let pr = self.pr;
        let (inputs_ty, outputs_ty, state_ty) = (&self.inputs_ty, &self.outputs_ty, &self.state_ty);
        let statics_ty = &self.statics_ty;
        let input_init = self.parts.inputs.iter().map(|p| {
            let i = &p.ident;
            quote!(#i: #pr::DeviceState::lend(&mut self.__statics.#i))
        });
        let held = quote!(.expect("a captured graph holds its result"));
        let output_init = self
            .parts
            .outputs
            .iter()
            .map(|p| {
                let i = &p.ident;
                quote!(#i: &self.__statics.#i)
            })
            .chain(
                self.result_ty
                    .iter()
                    .map(|_| quote!(result: self.__statics.result.as_ref() #held)),
            );
        let state_init = self.parts.states.iter().map(|p| {
            let i = &p.ident;
            match p.role {
                Role::State { mutable: true } => quote!(#i: #pr::DeviceState::lend(&mut *self.#i)),
                _ => quote!(#i: &*self.#i),
            }
        });
        let outputs_to = self
            .parts
            .outputs
            .iter()
            .map(|p| {
                let i = &p.ident;
                let name = i.to_string();
                quote!(__verifier.output(__eager, #name, &__statics.#i)?;)
            })
            .chain(self.result_ty.iter().map(
                |_| quote!(__verifier.output(__eager, "result", __statics.result.as_ref() #held)?;),
            ));
        quote! {
            fn inputs_mut(&mut self) -> #inputs_ty<'_> {
                #inputs_ty { #(#input_init,)* __marker: ::core::marker::PhantomData }
            }
            fn outputs(&self) -> #outputs_ty<'_> {
                #outputs_ty { #(#output_init,)* __marker: ::core::marker::PhantomData }
            }
            fn state_mut(&mut self) -> #state_ty<'_> {
                #state_ty { #(#state_init,)* __marker: ::core::marker::PhantomData }
            }
            fn outputs_to(__statics: &#statics_ty, __verifier: &mut #pr::Verifier<'_>, __eager: bool) -> #pr::Result<()> {
                #(#outputs_to)*
                ::core::result::Result::Ok(())
            }
        }
    }

    /// `impl ReplayInputs<FooBody> for (&X, …)`: a replay's inputs, one source per input,
    /// check their shapes, stage themselves and make the copies of `verify`'s eager run.
    fn replay_inputs(&self) -> TokenStream {
        let (pr, body_ty) = (self.pr, &self.body_ty);
        let statics_ty = &self.statics_ty;
        let (generics, _) = self.parts.replay_inputs();
        let sources: Vec<TokenStream> = (0..self.parts.inputs.len())
            .map(|n| {
                let g = format_ident!("__R{}", n);
                quote!(&'__a #g)
            })
            .collect();
        let names: Vec<&Ident> = self.parts.inputs.iter().map(|p| &p.ident).collect();
        let shape_checks = names.iter().map(|i| {
            let name = i.to_string();
            quote!(#pr::check_shape(__site, #name, &__body.__statics.#i, #i)?;)
        });
        let copies = names.iter().enumerate().map(|(k, i)| {
            quote!(#pr::feed_input(__staging, #k, #i, #pr::DeviceState::lend(&mut __body.__statics.#i))?;)
        });
        let eager = self.eager_statics();
        let result = quote!(#pr::Result<()>);
        quote! {
            impl<'s, '__a, #(#generics),*> #pr::ReplayInputs<#body_ty<'s>> for (#(#sources,)*) {
                fn check_shapes(&self, __body: &#body_ty<'s>, __site: &'static #pr::GraphSite) -> #result {
                    let (#(#names,)*) = *self;
                    #(#shape_checks)*
                    ::core::result::Result::Ok(())
                }
                fn stage(&self, __body: &mut #body_ty<'s>, __staging: &#pr::Staging<'_>) -> #result {
                    let (#(#names,)*) = *self;
                    #(#copies)*
                    ::core::result::Result::Ok(())
                }
                fn eager_statics(&self, __body: &#body_ty<'s>, __rt: &#pr::Runtime, __site: &'static #pr::GraphSite) -> #pr::Result<#statics_ty> {
                    let (#(#names,)*) = *self;
                    #eager
                }
            }
        }
    }

    /// `verify`'s eager statics: a copy of each input, a shadow of each output shaped like
    /// the graph's, an empty result buffer (in the order the buffers were made before).
    fn eager_statics(&self) -> TokenStream {
        let (pr, parts, statics_ty) = (self.pr, self.parts, &self.statics_ty);
        let copies = parts.inputs.iter().map(|p| {
            let (i, t) = (&p.ident, self.ty(p));
            let name = i.to_string();
            quote!(let #i: #t = #pr::stage_input::<#t, _>(__rt, __site, #name, #i)?;)
        });
        let shadows = parts.outputs.iter().map(|p| {
            let (i, t) = (&p.ident, self.ty(p));
            let name = i.to_string();
            quote!(let #i: #t = #pr::alloc_static::<#t>(__rt, __site, #name, #pr::StaticBuffer::shape(&__body.__statics.#i))?;)
        });
        let fields = parts
            .model
            .of(|r| matches!(r, Role::Input | Role::Output))
            .map(|p| &p.ident);
        let result = self
            .result_ty
            .iter()
            .map(|_| quote!(result: ::core::option::Option::None));
        quote! {
            #(#copies)*
            #(#shadows)*
            ::core::result::Result::Ok(#statics_ty { #(#fields,)* #(#result,)* })
        }
    }

    /// `WARMUP` and the typed methods: `capture`, and `replay` and `verify` forwarding to the
    /// runtime's `TypedGraph` in a line.
    fn methods(&self) -> TokenStream {
        let (pr, vis, graph_ty, outputs_ty) = (self.pr, self.vis, &self.graph_ty, &self.outputs_ty);
        let warmup = self.args.warmup();
        let capture = self.capture();
        let (generics, params) = self.parts.replay_inputs();
        let names: Vec<&Ident> = self.parts.inputs.iter().map(|p| &p.ident).collect();
        let replay_doc = "Copies the inputs into the graph's static buffers and launches the graph, all on the \
                          runtime's stream; returns as soon as the work is queued. Every input's shape and \
                          every state's addresses are checked first: a mismatch is `GraphError::InputShape` \
                          or `GraphError::StateMoved` and launches nothing.";
        let verify_doc = "Checks one replay against the eager function on the same inputs: runs the \
                          function eagerly on copies of the inputs into shadow outputs, undoes what that \
                          run did to the `&mut` state and the random generators, replays the graph, and \
                          compares every output and every `&mut` state (`Tolerance::BITWISE`, or within a \
                          tolerance).";
        quote! {
            #[allow(dead_code)]
            impl<'s> #graph_ty<'s> {
                /// Eager runs before the capture.
                pub const WARMUP: u32 = #warmup;

                #capture

                #[doc = #replay_doc]
                #[inline]
                #[allow(clippy::too_many_arguments)]
                #vis fn replay<#(#generics),*>(&mut self, #(#params),*) -> ::core::result::Result<#outputs_ty<'_>, #pr::GraphError> {
                    self.0.replay_inputs((#(#names,)*))
                }

                #[doc = #verify_doc]
                #[allow(clippy::too_many_arguments)]
                #vis fn verify<#(#generics),*>(&mut self, #(#params,)* tolerance: #pr::Tolerance) -> ::core::result::Result<#pr::VerifyReport, #pr::GraphError> {
                    self.0.verify_inputs((#(#names,)*), tolerance)
                }
            }
        }
    }

    /// `capture`'s parameters after the runtime, with their generics, in the function's
    /// order.
    fn capture_params(&self) -> Vec<CaptureParam> {
        let pr = self.pr;
        self.parts
            .model
            .params
            .iter()
            .enumerate()
            .map(|(n, p)| {
                let (i, t) = (&p.ident, self.ty(p));
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
                    _ => self.parts.held_capture_param(n, p),
                }
            })
            .collect()
    }

    /// `capture`: the state held, each input and output turned into its static buffer (a
    /// local of the parameter's own name), then the runtime's warmup and capture.
    fn capture(&self) -> TokenStream {
        let (pr, body_ty) = (self.pr, &self.body_ty);
        let hold_states = self.parts.hold_states();
        let stage = self.parts.model.params.iter().filter_map(|p| {
            let (i, t) = (&p.ident, self.ty(p));
            let name = i.to_string();
            match p.role {
                Role::Input => Some(quote_spanned!(p.ty.span()=>
                    let #i: #t = #pr::stage_input::<#t, _>(rt, __site, #name, #i)?;
                )),
                Role::Output => Some(quote_spanned!(p.ty.span()=>
                    let #i: #t = #pr::alloc_static::<#t>(rt, __site, #name, #i)?;
                )),
                _ => None,
            }
        });
        let statics = self
            .parts
            .model
            .of(|r| matches!(r, Role::Input | Role::Output))
            .map(|p| &p.ident);
        let held = self
            .parts
            .model
            .of(|r| matches!(r, Role::State { .. } | Role::Constant))
            .map(|p| &p.ident);
        let result = self
            .result_ty
            .iter()
            .map(|_| quote!(result: ::core::option::Option::None));
        let statics_ty = &self.statics_ty;
        let verify_schedule = verify_schedule_tokens(self.args, pr);
        let (generics, params): (Vec<_>, Vec<_>) = self.capture_params().into_iter().unzip();
        let generics = generics.into_iter().flatten();
        let vis = self.vis;
        let doc = self.capture_doc();
        quote! {
            #[doc = #doc]
            #[allow(clippy::too_many_arguments)]
            #vis fn capture<#(#generics),*>(rt: &#pr::Runtime, #(#params),*) -> ::core::result::Result<Self, #pr::GraphError> {
                let __site = <#body_ty<'s> as #pr::GraphBody>::site();
                #(#hold_states)*
                #(#stage)*
                let __statics = #statics_ty { #(#statics,)* #(#result,)* };
                let __body = #body_ty { __statics, #(#held,)* __state: ::core::marker::PhantomData };
                #pr::TypedGraph::capture(rt, __body, #verify_schedule).map(Self)
            }
        }
    }

    fn capture_doc(&self) -> String {
        let fn_name = &self.parts.fn_name;
        let warmup = self.args.warmup();
        format!(
            "Warms up `{fn_name}` ({warmup} eager run(s) on the runtime's stream), captures it and \
             instantiates the graph. Inputs are copied into static buffers; outputs are given by \
             shape (a length for a `CudaSlice`); state as `&T` / `&mut T` (borrowed for the graph's \
             life), `Arc<T>` or by value; constants are frozen."
        )
    }
}
/// When the graph's replays verify themselves: `verify = "never" | "first" | "every"` with
/// `verify_every = N`, and `verify_tolerance`; by default the first replay in debug builds.
fn verify_schedule_tokens(args: &GraphArgs, pr: &TokenStream) -> TokenStream {
    let every = match args.verify {
        None => quote!(#pr::VerifySchedule::first_if(::core::cfg!(debug_assertions))),
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
