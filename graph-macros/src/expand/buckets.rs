//! The bucket family of a function with `buckets(batch = [1, 2, 4, 8], fallback = "eager")`:
//! `{Name}Buckets<'s>`, one graph per batch size, and its `{Name}BucketOutputs` view.
//!
//! Imports `parts.rs`, `args/buckets.rs` and `model`; never its parent (`expand.rs`),
//! `graph.rs` or `check`.
//!
//! Every input and output is batched along its first dimension: the family's `capture`
//! takes, for each of them, the number of elements in one row.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use super::parts::{debug_view, CaptureParam, Parts};
use crate::args::buckets::BucketArgs;
use crate::model::{Param, Role};

/// The bucket family type of the function (`{Name}Buckets<'s>`) and its outputs view, as
/// items of the generated module, and the names to re-export from it.
pub(super) fn expand_buckets(parts: &Parts, buckets: &BucketArgs) -> (TokenStream, Vec<Ident>) {
    let (model, krate, pr, vis) = (parts.model, parts.krate, &parts.pr, &parts.vis);
    let fn_name = &parts.fn_name;
    let (inputs, outputs) = (&parts.inputs, &parts.outputs);
    let family = parts.type_name("Buckets");
    let outputs_ty = parts.type_name("BucketOutputs");
    let sizes = &buckets.sizes;
    let fallback = buckets.eager_fallback;
    let batch_ident = &buckets.param;
    let ty = |p: &Param| parts.ty(p);

    let slot_ty = |p: &Param| {
        let t = ty(p);
        quote_spanned!(p.ty.span()=> #pr::BatchedSlot<<#t as #pr::BatchBuffer>::Elem>)
    };
    let batched: Vec<_> = model
        .of(|r| matches!(r, Role::Input | Role::Output))
        .collect();

    let slot_fields = batched.iter().map(|p| {
        let (i, st) = (&p.ident, slot_ty(p));
        quote!(#i: #st)
    });
    let state_fields = parts.state_fields();
    let const_fields = parts.const_fields();

    // `capture` takes the elements in one row of each input and output; the batch
    // parameter is the bucket's size, not an argument.
    let capture_params: Vec<CaptureParam> = model
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.role != Role::Bucket)
        .map(|(n, p)| match p.role {
            Role::Input | Role::Output => {
                let i = &p.ident;
                (None, quote!(#i: usize))
            }
            _ => parts.held_capture_param(n, p),
        })
        .collect();
    let hold_states = parts.hold_states();
    let make_slots = batched.iter().map(|p| {
        let i = &p.ident;
        let name = i.to_string();
        let st = slot_ty(p);
        quote!(let mut #i: #st = #pr::BatchedSlot::new(rt, __site, #name, #i, __largest)?;)
    });
    let slot_idents: Vec<&Ident> = batched.iter().map(|p| &p.ident).collect();
    let records = parts.states.iter().map(|p| {
        let i = &p.ident;
        let name = i.to_string();
        let kind = parts.recorded_kind(p);
        quote!(__book.record(#name, &*#i, #kind);)
    });
    let capture_checks: Vec<TokenStream> = parts
        .states
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let i = &p.ident;
            quote!(__book.check(#k, &*#i, __when)?;)
        })
        .collect();
    let replay_checks = parts.replay_checks();

    // Arguments of the call inside capture (`__b` rows) and of the eager fallback.
    let alias_lets = batched.iter().map(|p| {
        let i = &p.ident;
        let a = format_ident!("__alias_{}", i);
        quote!(let mut #a = #i.alias(__b);)
    });
    // Each output's alias written back: during capture at the step's `__when`, in the eager
    // fallback as a replay.
    let alias_finish = |eager: bool| -> Vec<TokenStream> {
        let when = if eager {
            quote!(#pr::When::Replay)
        } else {
            quote!(__when)
        };
        outputs
            .iter()
            .map(|p| {
                let i = &p.ident;
                let a = format_ident!("__alias_{}", i);
                let name = i.to_string();
                quote!(#a.finish(__site.name, #name, #when)?;)
            })
            .collect()
    };
    let capture_finish = alias_finish(false);
    let eager_finish = alias_finish(true);
    let call_args = |eager: bool| -> Vec<TokenStream> {
        model
            .params
            .iter()
            .map(|p| {
                let i = &p.ident;
                let a = format_ident!("__alias_{}", i);
                let owner = if eager { quote!(self.#i) } else { quote!(#i) };
                match p.role {
                    Role::Input => quote!(&*#a),
                    Role::Output => quote!(&mut *#a),
                    Role::Bucket => {
                        let t = ty(p);
                        quote!(__b as #t)
                    }
                    _ => parts.held_arg(p, owner),
                }
            })
            .collect()
    };
    let capture_call = parts.call(&call_args(false));
    let eager_call = parts.call(&call_args(true));

    let first_input = inputs.first().map(|p| &p.ident);
    let rows_checks = inputs.iter().enumerate().map(|(k, p)| {
        let i = &p.ident;
        let name = i.to_string();
        if k == 0 {
            quote!(let __rows = self.#i.rows_of(__site.name, #i)?;)
        } else {
            quote!(self.__buckets.same_rows(#name, self.#i.rows_of(__site.name, #i)?, __rows)?;)
        }
    });
    let stages = inputs.iter().map(|p| {
        let i = &p.ident;
        quote!(self.#i.stage(#i, __rows, __bucket, __staging)?;)
    });
    let eager_inputs = inputs.iter().map(|p| {
        let i = &p.ident;
        let a = format_ident!("__alias_{}", i);
        quote!(let #a = self.#i.eager_alias(&self.__rt, __rows, ::core::option::Option::Some((#i, &__staging)))?;)
    });
    let eager_outputs = outputs.iter().map(|p| {
        let i = &p.ident;
        let a = format_ident!("__alias_{}", i);
        quote!(let mut #a = self.#i.eager_output(&self.__rt, __rows)?;)
    });
    let (replay_generics, replay_params) = parts.replay_inputs();
    let output_fields = outputs.iter().map(|p| {
        let (i, t) = (&p.ident, ty(p));
        let doc = format!("The valid rows of output `{i}`.");
        quote!(#[doc = #doc] pub #i: #krate::cudarc::driver::CudaView<'g, <#t as #pr::BatchBuffer>::Elem>)
    });
    let output_init = outputs.iter().map(|p| {
        let i = &p.ident;
        quote!(#i: self.#i.valid(self.__rows, self.__eager))
    });
    let init_fields = model
        .params
        .iter()
        .filter(|p| p.role != Role::Bucket)
        .map(|p| &p.ident);
    let ctx_call = parts.ctx_call(quote!(rt));
    let ctx_call_eager = parts.ctx_call(quote!(&self.__rt));
    let body_result = parts.body_result();
    let no_inputs = first_input.is_none();
    let rows_when_no_input = if no_inputs {
        quote!(let __rows = #batch_ident;)
    } else {
        quote!()
    };
    let replay_batch_param = if no_inputs {
        quote!(#batch_ident: usize)
    } else {
        quote!()
    };

    let doc = format!(
        "The bucket family of [`{fn_name}`]: one CUDA graph per batch size in {sizes:?}, generated by \
         `#[cuda_graph(buckets({batch_ident} = {sizes:?}))]`.\n\n`replay` picks the smallest bucket that holds the \
         batch, copies the input rows in, zero-fills the padding rows and hands out only the valid rows of \
         each output. Inputs and outputs share one buffer each, sized for the largest bucket; the graphs' \
         temporaries share the runtime's graph memory pool. The family keeps its runtime alive and holds its \
         state (borrowed, shared or owned), whose addresses it checks before every replay."
    );
    let capture_doc = format!(
        "Captures one graph per bucket, largest first. For each input and output, give the number of \
         elements in one row (its length is `{batch_ident}` rows of that many); state is given as `&T` / \
         `&mut T` (borrowed for the family's lifetime), as an `Arc<T>` (read-only state) or by value; \
         constants are frozen."
    );

    let outputs_debug = debug_view(&outputs_ty);
    // `capture`: one capture of the body per bucket, on slots sized for the largest.
    let closure = parts.body_closure(
        ctx_call,
        quote!(__b: usize, __step: #pr::Step),
        quote! {
            #pr::Step::Run(__when) => {
                #(#alias_lets)*
                let __result = #body_result(#capture_call);
                let _ = __when;
                #(#capture_finish)*
                __result
            }
        },
        &capture_checks,
    );
    let capture = parts.site_and_capture(
        &capture_doc,
        capture_params,
        quote! {
            let __largest = *Self::BUCKETS.last().expect("at least one bucket");
            #(#hold_states)*
            #(#make_slots)*
            let __static_bytes = 0 #(+ #slot_idents.bytes())*;
            let mut __book = #pr::AddressBook::new(__site.name);
            #(#records)*
            let __buckets = {
                #closure
                #pr::Buckets::capture(rt, __site, Self::BUCKETS, #fallback, __book, __static_bytes, &mut __body)?
            };
            ::core::result::Result::Ok(Self {
                __buckets,
                __book,
                __rt: ::core::clone::Clone::clone(rt),
                __rows: 0,
                __eager: false,
                #(#init_fields,)*
                __state: ::core::marker::PhantomData,
            })
        },
    );

    let body = quote! {
        #[doc = #doc]
        #[must_use = "a captured bucket family does nothing until it is replayed"]
        #vis struct #family<'s> {
            __buckets: #pr::Buckets,
            __book: #pr::AddressBook,
            __rt: #krate::Runtime,
            __rows: usize,
            /// Whether the last replay ran eagerly (batch above every bucket).
            __eager: bool,
            #(#slot_fields,)*
            #(#state_fields,)*
            #(#const_fields,)*
            __state: ::core::marker::PhantomData<&'s ()>,
        }

        /// The valid rows of the outputs of the last replay, borrowed from the family until
        /// the next replay.
        #vis struct #outputs_ty<'g> {
            #(#output_fields,)*
            #[doc(hidden)]
            pub __marker: ::core::marker::PhantomData<&'g ()>,
        }

        #outputs_debug

        impl ::core::fmt::Debug for #family<'_> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(::core::stringify!(#family))
                    .field("buckets", &self.__buckets)
                    .finish_non_exhaustive()
            }
        }

        #[allow(dead_code)]
        impl<'s> #family<'s> {
            /// The bucket sizes, ascending.
            pub const BUCKETS: &'static [usize] = &[#(#sizes),*];

            #capture

            /// Runs the bucket that holds the batch of the inputs (their rows), after copying
            /// them in; returns the valid rows of the outputs. A batch above the largest
            /// bucket is an error, or runs eagerly with `fallback = "eager"`. The state's
            /// addresses are checked first.
            #[allow(clippy::too_many_arguments)]
            #vis fn replay<#(#replay_generics),*>(
                &mut self,
                #(#replay_params,)*
                #replay_batch_param
            ) -> ::core::result::Result<#outputs_ty<'_>, #krate::GraphError> {
                let __site = Self::__site();
                #rows_when_no_input
                #(#rows_checks)*
                #(#replay_checks)*
                match self.__buckets.pick(__rows)? {
                    #pr::Pick::Graph { index: __index, bucket: __bucket } => {
                        // The closure writes only the slots, disjoint from `self.__buckets`.
                        #pr::replay(self.__buckets.graph(__index), |__staging| {
                            let _ = (__staging, __bucket);
                            #(#stages)*
                            ::core::result::Result::Ok(())
                        })?;
                        self.__eager = false;
                    }
                    #pr::Pick::Eager => {
                        let __b = __rows;
                        let __ctx = #ctx_call_eager;
                        let __staging = self.__buckets.graph(0).staging();
                        #(#eager_inputs)*
                        #(#eager_outputs)*
                        let __result = #body_result(#eager_call);
                        #(#eager_finish)*
                        __result?;
                        self.__eager = true;
                    }
                }
                self.__rows = __rows;
                ::core::result::Result::Ok(self.outputs())
            }

            /// The valid rows of the outputs as the last replay left them.
            #vis fn outputs(&self) -> #outputs_ty<'_> {
                #outputs_ty { #(#output_init,)* __marker: ::core::marker::PhantomData }
            }

            /// The graphs, one per bucket (ascending), with their capture facts.
            #vis fn buckets(&self) -> &#pr::Buckets {
                &self.__buckets
            }
        }
    };
    (body, vec![family, outputs_ty])
}
