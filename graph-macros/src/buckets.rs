//! `buckets(batch = [1, 2, 4, 8], fallback = "eager")`: one graph per batch size.
//!
//! The key names the function's batch parameter (a by-value integer); the list gives the
//! bucket sizes. Every input and output is batched along its first dimension: the family's
//! `capture` takes, for each of them, the number of elements in one row.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, Meta, Token};

use crate::ctxt::Ctxt;
use crate::model::{GraphFn, Role};

/// The parsed `buckets(…)` argument.
pub struct BucketArgs {
    /// The batch parameter's name.
    pub param: Ident,
    /// Bucket sizes, ascending, without duplicates.
    pub sizes: Vec<usize>,
    /// Whether batches above the largest bucket run eagerly.
    pub eager_fallback: bool,
}

/// Parses the inside of `buckets(…)`, recording every problem in `cx`.
pub fn parse(list: &syn::MetaList, cx: &mut Ctxt) -> Option<BucketArgs> {
    let metas = match list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
        Ok(m) => m,
        Err(e) => {
            cx.error_at(
                e.span(),
                format!(
                    "malformed `buckets(…)`: {e}; write `buckets(batch = [1, 2, 4, 8])`, naming the batch parameter \
                     and listing the batch sizes to capture"
                ),
            );
            return None;
        }
    };
    let mut param: Option<(Ident, Vec<usize>)> = None;
    let mut eager_fallback = false;
    for meta in metas {
        let Meta::NameValue(nv) = &meta else {
            cx.error_spanned_by(
                &meta,
                "expected `name = [sizes]` or `fallback = \"eager\"` inside `buckets(…)`",
            );
            continue;
        };
        let Some(key) = nv.path.get_ident() else {
            cx.error_spanned_by(
                &nv.path,
                "expected the batch parameter's name or `fallback`",
            );
            continue;
        };
        if key == "fallback" {
            match &nv.value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(s), ..
                }) if s.value() == "eager" => eager_fallback = true,
                Expr::Lit(ExprLit {
                    lit: Lit::Str(s), ..
                }) if s.value() == "error" => eager_fallback = false,
                other => {
                    cx.error_spanned_by(
                        other,
                        "`fallback` is \"error\" (the default: a batch above the largest bucket is an error) or \
                         \"eager\" (such a batch runs the function eagerly)",
                    );
                }
            }
            continue;
        }
        let Expr::Array(array) = &nv.value else {
            cx.error_spanned_by(
                &nv.value,
                format!("`{key}` needs a list of batch sizes, e.g. `{key} = [1, 2, 4, 8]`"),
            );
            continue;
        };
        if let Some((first, _)) = &param {
            cx.error_spanned_by(
                key,
                format!("`buckets(…)` takes one batch parameter, and `{first}` is already given"),
            );
            continue;
        }
        let mut sizes = Vec::new();
        for elem in &array.elems {
            match elem {
                Expr::Lit(ExprLit {
                    lit: Lit::Int(n), ..
                }) => match n.base10_parse::<usize>() {
                    Ok(0) => {
                        cx.error_spanned_by(n, "a bucket must hold at least one row");
                    }
                    Ok(v) if sizes.contains(&v) => {
                        cx.error_spanned_by(n, format!("bucket {v} is listed twice"));
                    }
                    Ok(v) => sizes.push(v),
                    Err(_) => {
                        cx.error_spanned_by(n, "bucket sizes are whole numbers");
                    }
                },
                other => {
                    cx.error_spanned_by(other, "bucket sizes must be integer literals");
                }
            }
        }
        if array.elems.is_empty() {
            cx.error_spanned_by(array, "list at least one bucket size");
        }
        sizes.sort_unstable();
        param = Some((key.clone(), sizes));
    }
    let Some((param, sizes)) = param else {
        cx.error_spanned_by(
            list,
            "`buckets(…)` must name the batch parameter and list its sizes, e.g. `buckets(batch = [1, 2, 4, 8])`",
        );
        return None;
    };
    // Returned even when some size was invalid (the errors are in `cx`), so that the batch
    // parameter is still recognised and does not draw an error of its own.
    Some(BucketArgs {
        param,
        sizes,
        eager_fallback,
    })
}

/// The bucket family type of `model`: `{Name}Buckets<'s>`.
pub fn expand(
    model: &GraphFn,
    krate: &syn::Path,
    site: TokenStream,
    buckets: &BucketArgs,
    base: &str,
) -> TokenStream {
    let pr = quote!(#krate::__private);
    let item = &model.item;
    let vis = &item.vis;
    let fn_ident = &item.sig.ident;
    let fn_name = fn_ident.to_string();
    let family = format_ident!("{}Buckets", base, span = fn_ident.span());
    let outputs_ty = format_ident!("{}BucketOutputs", base, span = fn_ident.span());
    let ctx_ty = &model.context.as_ref().expect("checked by analyze").ty;
    let sizes = &buckets.sizes;
    let fallback = buckets.eager_fallback;
    let batch_ident = &buckets.param;

    let slot_ty =
        |t: &syn::Type| quote_spanned!(t.span()=> #pr::BatchedSlot<<#t as #pr::BatchBuffer>::Elem>);
    let batched: Vec<_> = model
        .of(|r| matches!(r, Role::Input | Role::Output))
        .collect();
    let inputs: Vec<_> = model.of(|r| r == Role::Input).collect();
    let outputs: Vec<_> = model.of(|r| r == Role::Output).collect();
    let states: Vec<_> = model.of(|r| matches!(r, Role::State { .. })).collect();
    let constants: Vec<_> = model.of(|r| r == Role::Constant).collect();

    let slot_fields = batched.iter().map(|p| {
        let (i, st) = (&p.ident, slot_ty(&p.ty));
        quote!(#i: #st)
    });
    let state_fields = states.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        match p.role {
            Role::State { mutable: true } => quote!(#i: &'s mut #t),
            _ => quote!(#i: &'s #t),
        }
    });
    let const_fields = constants.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        quote!(#i: #t)
    });

    let capture_params = model
        .params
        .iter()
        .filter(|p| p.role != Role::Bucket)
        .map(|p| {
            let (i, t) = (&p.ident, &p.ty);
            match p.role {
                Role::Input | Role::Output => quote!(#i: usize),
                Role::State { mutable: true } => quote!(#i: &'s mut #t),
                Role::State { mutable: false } => quote!(#i: &'s #t),
                _ => quote!(#i: #t),
            }
        });
    let make_slots = batched.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        let name = i.to_string();
        let st = slot_ty(t);
        quote!(let mut #i: #st = #pr::BatchedSlot::new(rt, __site, #name, #i, __largest)?;)
    });
    let slot_idents: Vec<&Ident> = batched.iter().map(|p| &p.ident).collect();

    // Arguments of the call inside capture (`__b` rows) and of the eager fallback.
    let alias_lets = batched.iter().map(|p| {
        let i = &p.ident;
        let a = format_ident!("__alias_{}", i);
        quote!(let mut #a = #i.alias(__b);)
    });
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
                    Role::State { mutable: true } => quote!(&mut *#owner),
                    Role::State { mutable: false } => quote!(#owner),
                    Role::Constant => {
                        quote_spanned!(p.ty.span()=> ::core::clone::Clone::clone(&#owner))
                    }
                    Role::Bucket => {
                        let t = &p.ty;
                        quote!(__b as #t)
                    }
                }
            })
            .collect()
    };
    let capture_call = call_args(false);
    let eager_call = call_args(true);

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
        quote!(let #a = self.#i.eager_alias(self.__rt, __rows, ::core::option::Option::Some((#i, &__staging)))?;)
    });
    let eager_outputs = outputs.iter().map(|p| {
        let i = &p.ident;
        let a = format_ident!("__alias_{}", i);
        quote!(let mut #a = self.#i.eager_output(self.__rt, __rows)?;)
    });
    let replay_generics = inputs.iter().enumerate().map(|(n, p)| {
        let s = format_ident!("__R{}", n);
        let t = &p.ty;
        quote!(#s: ?Sized + #pr::InputSource<#t>)
    });
    let replay_params = inputs.iter().enumerate().map(|(n, p)| {
        let s = format_ident!("__R{}", n);
        let i = &p.ident;
        quote!(#i: &#s)
    });
    let output_fields = outputs.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
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
    let ctx_call = quote_spanned!(ctx_ty.span()=> <#ctx_ty as #pr::FromRuntime>::from_runtime(rt));
    let ctx_call_eager =
        quote_spanned!(ctx_ty.span()=> <#ctx_ty as #pr::FromRuntime>::from_runtime(self.__rt));
    let body_result = quote_spanned!(item.sig.output.span()=> #pr::BodyResult::into_graph_result);
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
         temporaries share the runtime's graph memory pool."
    );
    let capture_doc = format!(
        "Captures one graph per bucket, largest first. For each input and output, give the number of \
         elements in one row (its length is `{batch_ident}` rows of that many); state is borrowed for the \
         family's lifetime, constants are frozen."
    );

    quote! {
        #[doc = #doc]
        #[must_use = "a captured bucket family does nothing until it is replayed"]
        #[allow(dead_code)]
        #vis struct #family<'s> {
            __buckets: #pr::Buckets,
            __rt: &'s #krate::Runtime,
            __rows: usize,
            /// Whether the last replay ran eagerly (batch above every bucket).
            __eager: bool,
            #(#slot_fields,)*
            #(#state_fields,)*
            #(#const_fields,)*
        }

        /// The valid rows of the outputs of the last replay, borrowed from the family until
        /// the next replay.
        #[allow(dead_code)]
        #vis struct #outputs_ty<'g> {
            #(#output_fields,)*
            __marker: ::core::marker::PhantomData<&'g ()>,
        }

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

            fn __site() -> &'static #pr::GraphSite {
                static SITE: #pr::GraphSite = #site;
                &SITE
            }

            #[doc = #capture_doc]
            #[allow(clippy::too_many_arguments)]
            #vis fn capture(
                rt: &'s #krate::Runtime,
                #(#capture_params),*
            ) -> ::core::result::Result<Self, #krate::GraphError> {
                let __site = Self::__site();
                let __largest = *Self::BUCKETS.last().expect("at least one bucket");
                #(#make_slots)*
                let __static_bytes = 0 #(+ #slot_idents.bytes())*;
                let __buckets = {
                    let __ctx = #ctx_call;
                    let mut __body = |__b: usize| -> ::core::result::Result<(), #krate::GraphError> {
                        #(#alias_lets)*
                        #body_result(#fn_ident(__ctx, #(#capture_call),*))
                    };
                    #pr::Buckets::capture(rt, __site, Self::BUCKETS, #fallback, __static_bytes, &mut __body)?
                };
                ::core::result::Result::Ok(Self {
                    __buckets,
                    __rt: rt,
                    __rows: 0,
                    __eager: false,
                    #(#init_fields,)*
                })
            }

            /// Runs the bucket that holds the batch of the inputs (their rows), after copying
            /// them in; returns the valid rows of the outputs. A batch above the largest
            /// bucket is an error, or runs eagerly with `fallback = "eager"`.
            #[allow(clippy::too_many_arguments)]
            #vis fn replay<#(#replay_generics),*>(
                &mut self,
                #(#replay_params,)*
                #replay_batch_param
            ) -> ::core::result::Result<#outputs_ty<'_>, #krate::GraphError> {
                let __site = Self::__site();
                #rows_when_no_input
                #(#rows_checks)*
                match self.__buckets.pick(__rows)? {
                    #pr::Pick::Graph { index: __index, bucket: __bucket } => {
                        // The closure writes only the slots, disjoint from `self.__buckets`.
                        self.__buckets.graph(__index).replay_with(|__staging| {
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
                        #body_result(#fn_ident(__ctx, #(#eager_call),*))?;
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
    }
}
