//! The expansion: the user's function, unchanged, plus its graph type.
//!
//! Everything that can be ordinary Rust lives in `graph_runtime`; the generated code only
//! moves buffers into place and calls `__private::capture` and `Graph::replay_with`.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::ItemFn;

use crate::args::{self, GraphArgs};
use crate::check;
use crate::ctxt::Ctxt;
use crate::model::{self, GraphFn, Role};

/// Entry point: `#[cuda_graph(args)] item`.
pub fn cuda_graph(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let item: ItemFn = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(e) => {
            let msg = syn::Error::new(
                e.span(),
                format!(
                    "`#[cuda_graph]` goes on a free function (`fn name(rt: &Runtime, …)`): {e}"
                ),
            )
            .to_compile_error();
            return quote!(#msg #item);
        }
    };
    let args = args::parse(args, &mut cx);
    check::check_body(&item, &args, &mut cx);
    let before = cx.count();
    let bucket_param = args.buckets.as_ref().map(|b| b.param.clone());
    let model = model::analyze(item, bucket_param.as_ref(), &mut cx);
    let signature_ok = cx.count() == before;
    if !cx.has_errors() {
        return expand(&model, &args);
    }
    if signature_ok {
        // Only the body or the arguments are wrong: emit the graph type anyway (with the
        // default for any invalid argument), so that code using it does not add errors of
        // its own to the ones that matter.
        let mut out = expand(&model, &args);
        out.extend(cx.to_compile_errors());
        return out;
    }
    fallback(&model.item, &cx)
}

/// On a signature error: the user's function (so the rest of the crate and the IDE keep
/// working) and every error.
fn fallback(item: &ItemFn, cx: &Ctxt) -> TokenStream {
    let errors = cx.to_compile_errors();
    quote!(#item #errors)
}

/// The `GraphSite` literal of the function: its name, warmup count and capture mode.
fn site_tokens(model: &GraphFn, args: &GraphArgs) -> TokenStream {
    let krate = args.krate();
    let name = model.item.sig.ident.to_string();
    let warmup = args.warmup();
    let mode = Ident::new(args.mode().variant(), Span::call_site());
    quote!(#krate::__private::GraphSite {
        name: #name,
        warmup: #warmup,
        mode: #krate::__private::CaptureMode::#mode,
    })
}

/// `scale_add` → `ScaleAdd`.
pub fn camel(ident: &Ident) -> String {
    let name = ident.to_string();
    let name = name.strip_prefix("r#").unwrap_or(&name);
    name.split('_')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut c = s.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

fn expand(model: &GraphFn, args: &GraphArgs) -> TokenStream {
    if let Some(buckets) = &args.buckets {
        let krate = args.krate();
        let item = &model.item;
        let base = camel(&item.sig.ident);
        let site = site_tokens(model, args);
        let family = crate::buckets::expand(model, &krate, site, buckets, &base);
        return quote!(#item #family);
    }
    let krate = args.krate();
    let pr = quote!(#krate::__private);
    let item = &model.item;
    let vis = &item.vis;
    let fn_ident = &item.sig.ident;
    let fn_name = fn_ident.to_string();
    let base = camel(fn_ident);
    let graph_ty = format_ident!("{}Graph", base, span = fn_ident.span());
    let inputs_ty = format_ident!("{}Inputs", base, span = fn_ident.span());
    let outputs_ty = format_ident!("{}Outputs", base, span = fn_ident.span());
    let state_ty = format_ident!("{}State", base, span = fn_ident.span());
    let warmup = args.warmup();
    let site = site_tokens(model, args);
    let ctx_ty = &model.context.as_ref().expect("checked by analyze").ty;

    let inputs: Vec<_> = model.of(|r| r == Role::Input).collect();
    let outputs: Vec<_> = model.of(|r| r == Role::Output).collect();
    let states: Vec<_> = model.of(|r| matches!(r, Role::State { .. })).collect();

    // Struct fields.
    let input_fields = inputs.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        quote!(#i: #t)
    });
    let output_fields = outputs.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        quote!(#i: #t)
    });
    let state_fields = states.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        match p.role {
            Role::State { mutable: true } => quote!(#i: &'s mut #t),
            _ => quote!(#i: &'s #t),
        }
    });

    // `capture` parameters, in the function's order.
    let capture_params = model.params.iter().enumerate().map(|(n, p)| {
        let (i, t) = (&p.ident, &p.ty);
        match p.role {
            Role::Input => {
                let s = format_ident!("__S{}", n);
                quote!(#i: &#s)
            }
            Role::Output => quote!(#i: <#t as #pr::StaticBuffer>::Shape),
            Role::State { mutable: true } => quote!(#i: &'s mut #t),
            Role::State { mutable: false } => quote!(#i: &'s #t),
            // Only bucket families have a batch parameter; they are expanded elsewhere.
            Role::Constant | Role::Bucket => quote!(#i: #t),
        }
    });
    let capture_generics = model
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.role == Role::Input)
        .map(|(n, p)| {
            let s = format_ident!("__S{}", n);
            let t = &p.ty;
            quote!(#s: ?Sized + #pr::InputSource<#t>)
        });
    let stage = model.params.iter().enumerate().filter_map(|(n, p)| {
        let (i, t) = (&p.ident, &p.ty);
        let local = local(n);
        let name = i.to_string();
        match p.role {
            Role::Input => Some(quote_spanned!(t.span()=>
                let #local: #t = #pr::stage_input::<#t, _>(rt, __site, #name, #i)?;
            )),
            Role::Output => Some(quote_spanned!(t.span()=>
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
    let call_args = model.params.iter().enumerate().map(|(n, p)| {
        let i = &p.ident;
        let local = local(n);
        match p.role {
            Role::Input => quote!(&#local),
            Role::Output => quote!(&mut #local),
            Role::State { mutable: true } => quote!(&mut *#i),
            Role::State { mutable: false } => quote!(#i),
            Role::Constant | Role::Bucket => {
                quote_spanned!(p.ty.span()=> ::core::clone::Clone::clone(&#i))
            }
        }
    });
    let init_fields = model
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.role != Role::Constant)
        .map(|(n, p)| {
            let i = &p.ident;
            let local = local(n);
            match p.role {
                Role::Input | Role::Output => quote!(#i: #local),
                _ => quote!(#i),
            }
        });

    // `replay` parameters: the inputs, in order.
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
    let shape_checks = inputs.iter().map(|p| {
        let i = &p.ident;
        let name = i.to_string();
        quote!(#pr::check_shape(__site, #name, &self.#i, #i)?;)
    });
    let copies = inputs.iter().map(|p| {
        let i = &p.ident;
        quote!(#pr::InputSource::copy_into(#i, &mut self.#i, __staging)?;)
    });

    let input_view_fields = inputs.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        let doc =
            format!("The static buffer of input `{i}`: write here, then [`{graph_ty}::launch`].");
        quote!(#[doc = #doc] pub #i: &'g mut #t)
    });
    let input_view_init = inputs.iter().map(|p| {
        let i = &p.ident;
        quote!(#i: &mut self.#i)
    });
    let output_view_fields = outputs.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        let doc = format!("Output `{i}`, as the last replay left it.");
        quote!(#[doc = #doc] pub #i: &'g #t)
    });
    let output_view_init = outputs.iter().map(|p| {
        let i = &p.ident;
        quote!(#i: &self.#i)
    });
    let state_view_fields = states.iter().map(|p| {
        let (i, t) = (&p.ident, &p.ty);
        match p.role {
            Role::State { mutable: true } => {
                let doc = format!(
                    "State `{i}`, lent back between replays; the graph reads it by address."
                );
                quote!(#[doc = #doc] pub #i: &'g mut #t)
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
            Role::State { mutable: true } => quote!(#i: &mut *self.#i),
            _ => quote!(#i: self.#i),
        }
    });

    let ctx_call = quote_spanned!(ctx_ty.span()=> <#ctx_ty as #pr::FromRuntime>::from_runtime(rt));
    let body_result = quote_spanned!(item.sig.output.span()=> #pr::BodyResult::into_graph_result);

    let struct_doc = format!(
        "The CUDA graph of [`{fn_name}`], generated by `#[cuda_graph(warmup = {warmup})]`.\n\n\
         [`{graph_ty}::capture`] runs `{fn_name}` {warmup} time(s) eagerly on the runtime's stream, records it \
         once and instantiates the graph; [`{graph_ty}::replay`] copies new inputs into the graph's static \
         buffers and launches it. The outputs are lent out until the next replay."
    );
    let capture_doc = format!(
        "Warms up `{fn_name}` ({warmup} eager run(s) on the runtime's stream), captures it and instantiates \
         the graph.\n\nInputs are copied into static buffers of the same shape (the warmup and capture run \
         on those values); outputs are given by shape and start zeroed; state is borrowed for the graph's \
         lifetime; constants are frozen into the graph."
    );
    let replay_doc = "Copies the inputs into the graph's static buffers and launches the graph, all on the \
                      runtime's stream; returns as soon as the work is queued.\n\nEvery input's shape is \
                      checked before anything is queued: a mismatch is [`GraphError::InputShape`] and launches \
                      nothing.\n\n[`GraphError::InputShape`]: graph_runtime::GraphError::InputShape";
    let graph_name = graph_ty.to_string();

    quote! {
        #item

        #[doc = #struct_doc]
        #[must_use = "a captured graph does nothing until it is replayed"]
        #[allow(dead_code)]
        #vis struct #graph_ty<'s> {
            __graph: #pr::Graph,
            #(#input_fields,)*
            #(#output_fields,)*
            #(#state_fields,)*
            __state: ::core::marker::PhantomData<&'s ()>,
        }

        /// The static input buffers of the graph, to fill in place before
        /// a `launch` (no copy at replay).
        #[allow(dead_code)]
        #vis struct #inputs_ty<'g> {
            #(#input_view_fields,)*
            __marker: ::core::marker::PhantomData<&'g mut ()>,
        }

        /// The graph's outputs, borrowed from the graph: they stay valid
        /// until the next replay, which cannot start while they are held.
        #[allow(dead_code)]
        #vis struct #outputs_ty<'g> {
            #(#output_view_fields,)*
            __marker: ::core::marker::PhantomData<&'g ()>,
        }

        /// The state the graph reads by address, lent back between replays.
        #[allow(dead_code)]
        #vis struct #state_ty<'g> {
            #(#state_view_fields,)*
            __marker: ::core::marker::PhantomData<&'g mut ()>,
        }

        impl ::core::fmt::Debug for #graph_ty<'_> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(#graph_name)
                    .field("info", self.__graph.info())
                    .finish_non_exhaustive()
            }
        }

        #[allow(dead_code)]
        impl<'s> #graph_ty<'s> {
            /// Eager runs before the capture.
            pub const WARMUP: u32 = #warmup;

            fn __site() -> &'static #pr::GraphSite {
                static SITE: #pr::GraphSite = #site;
                &SITE
            }

            #[doc = #capture_doc]
            #[allow(clippy::too_many_arguments)]
            #vis fn capture<#(#capture_generics),*>(
                rt: &#krate::Runtime,
                #(#capture_params),*
            ) -> ::core::result::Result<Self, #krate::GraphError> {
                let __site = Self::__site();
                #(#stage)*
                let __static_bytes = 0 #(+ #pr::static_bytes(&#static_locals))*;
                let __graph = {
                    let __ctx = #ctx_call;
                    let mut __body = || #body_result(#fn_ident(__ctx, #(#call_args),*));
                    #pr::capture(rt, __site, __static_bytes, &mut __body)?
                };
                ::core::result::Result::Ok(Self {
                    __graph,
                    #(#init_fields,)*
                    __state: ::core::marker::PhantomData,
                })
            }

            #[doc = #replay_doc]
            #[inline]
            #[allow(clippy::too_many_arguments)]
            #vis fn replay<#(#replay_generics),*>(
                &mut self,
                #(#replay_params),*
            ) -> ::core::result::Result<#outputs_ty<'_>, #krate::GraphError> {
                let __site = Self::__site();
                #(#shape_checks)*
                self.__graph.replay_with(|__staging| {
                    #(#copies)*
                    ::core::result::Result::Ok(())
                })?;
                ::core::result::Result::Ok(self.outputs())
            }

            /// Launches the graph with the inputs as they are in its static buffers
            /// (see `inputs_mut`): a replay without copies.
            #[inline]
            #vis fn launch(&mut self) -> ::core::result::Result<#outputs_ty<'_>, #krate::GraphError> {
                self.__graph.launch()?;
                ::core::result::Result::Ok(self.outputs())
            }

            /// The static input buffers, to write the next inputs in place.
            #vis fn inputs_mut(&mut self) -> #inputs_ty<'_> {
                #inputs_ty { #(#input_view_init,)* __marker: ::core::marker::PhantomData }
            }

            /// The outputs as the last replay left them.
            #vis fn outputs(&self) -> #outputs_ty<'_> {
                #outputs_ty { #(#output_view_init,)* __marker: ::core::marker::PhantomData }
            }

            /// The state, lent back between replays (`&mut` state can be updated here).
            #vis fn state_mut(&mut self) -> #state_ty<'_> {
                #state_ty { #(#state_view_init,)* __marker: ::core::marker::PhantomData }
            }

            /// Node count and timings of the capture.
            #vis fn info(&self) -> &#krate::GraphInfo {
                self.__graph.info()
            }

            /// The instantiated graph.
            #vis fn graph(&self) -> &#krate::Graph {
                &self.__graph
            }
        }
    }
}

/// The capture-time local holding parameter `n`'s static buffer.
fn local(n: usize) -> Ident {
    format_ident!("__static{}", n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(args: TokenStream, item: TokenStream) -> String {
        let out = cuda_graph(args, item);
        match syn::parse2::<syn::File>(out.clone()) {
            Ok(file) => prettyplease::unparse(&file),
            Err(_) => out.to_string(),
        }
    }

    #[test]
    fn camel_case_names() {
        assert_eq!(camel(&format_ident!("scale_add")), "ScaleAdd");
        assert_eq!(camel(&format_ident!("mlp")), "Mlp");
        assert_eq!(camel(&format_ident!("decode_step_2")), "DecodeStep2");
    }

    #[test]
    fn expands_to_function_and_graph_type() {
        let out = expand_str(
            quote!(warmup = 2),
            quote! {
                pub fn step(rt: &Runtime, x: &CudaSlice<f32>, #[state] w: &CudaSlice<f32>,
                            #[state] kv: &mut CudaSlice<f32>, y: &mut CudaSlice<f32>,
                            #[constant] n: u32) -> Result<(), GraphError> { body(rt) }
            },
        );
        // The user's function survives, without the role attributes.
        assert!(
            out.contains(
                "pub fn step(\n    rt: &Runtime,\n    x: &CudaSlice<f32>,\n    w: &CudaSlice<f32>,"
            ),
            "{out}"
        );
        assert!(!out.contains("#[state]"));
        for needle in [
            "pub struct StepGraph<'s>",
            "w: &'s CudaSlice<f32>",
            "kv: &'s mut CudaSlice<f32>",
            "pub struct StepOutputs<'g>",
            "pub y: &'g CudaSlice<f32>",
            "pub const WARMUP: u32 = 2u32;",
            "name: \"step\"",
            "mode: ::graph_runtime::__private::CaptureMode::ThreadLocal",
            "y: <CudaSlice<f32> as ::graph_runtime::__private::StaticBuffer>::Shape",
            "n: u32",
            "::graph_runtime::__private::check_shape(__site, \"x\", &self.x, x)?;",
        ] {
            assert!(out.contains(needle), "missing `{needle}` in:\n{out}");
        }
    }

    #[test]
    fn crate_override_and_mode() {
        let out = expand_str(
            quote!(crate = "my_rt", mode = "global"),
            quote!(
                fn f(s: &Arc<CudaStream>, x: &CudaSlice<u8>) {}
            ),
        );
        assert!(
            out.contains("::my_rt::__private::CaptureMode::Global"),
            "{out}"
        );
        assert!(out.contains("pub const WARMUP: u32 = 3u32;"), "{out}");
    }

    #[test]
    fn errors_keep_the_function() {
        let out = cuda_graph(
            quote!(warmup = 0),
            quote!(
                async fn f<T>(rt: &Runtime, #[state] n: u32) {}
            ),
        )
        .to_string();
        assert!(out.contains("async fn f"), "{out}");
        let errors = out.matches("compile_error").count();
        assert_eq!(errors, 4, "warmup, async, generics, by-value state: {out}");
        assert!(!out.contains("struct"), "no graph type on error: {out}");
    }
}
