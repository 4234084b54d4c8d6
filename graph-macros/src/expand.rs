//! The expansion: the user's function, unchanged, plus its graph type.
//!
//! Imports `args`, `model`, `check`, `ctxt`, `tokens` and its own files; only `lib.rs`
//! imports it, and its own files never do.
//!
//! Everything that can be ordinary Rust lives in `graph_runtime`: the generated code fills
//! in `__private::GraphBody` (its static inputs and outputs named as tuples, which the
//! runtime's `StaticList` and `Sources` handle generically) and wraps
//! `__private::TypedGraph`, which does the rest; a bucket family's wraps
//! `__private::TypedFamily` around the same `GraphBody`, so that it verifies, runs islands
//! and prints through the same code.
//!
//! This file holds the entry point (parse → model → check → expand) and the module that
//! wraps the generated items; `expand/graph.rs` generates the graph type of a function (or
//! its family, with the family's own pieces from `expand/buckets.rs`), and `expand/parts.rs`
//! the pieces every generated type contains.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};
use syn::ItemFn;

use crate::args::{self, GraphArgs};
use crate::check::check_body;
use crate::ctxt::{Ctxt, Message};
use crate::model::{self, GraphFn};
use crate::tokens::{relocated_path, unraw};

mod buckets;
mod graph;
mod islands;
mod parts;
#[cfg(test)]
mod tests;

use graph::expand_graph;
use parts::Parts;

/// Entry point: `#[cuda_graph(args)] item`.
/// `#[graph_helper]`: the function as written, with one `compile_error!` per finding of
/// the body checks (see `check::helper_findings`).
pub fn graph_helper(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let parsed: ItemFn = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(e) => {
            let msg = syn::Error::new(
                e.span(),
                Message::new(format!("`#[graph_helper]` goes on a function: {e}"))
                    .fix("put it on a function that a `#[cuda_graph]` body calls"),
            )
            .to_compile_error();
            return quote!(#msg #item);
        }
    };
    if !args.is_empty() {
        cx.error_spanned_by(&args, Message::new("`#[graph_helper]` takes no arguments"));
    }
    for f in crate::check::helper_findings(&parsed) {
        cx.push(f.to_error());
    }
    let errors = cx.finish();
    quote!(#errors #parsed)
}

pub fn cuda_graph(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let item: ItemFn = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(e) => {
            let msg = syn::Error::new(
                e.span(),
                Message::new(format!("`#[cuda_graph]` goes on a free function: {e}"))
                    .fix("put it on a `fn name(rt: &Runtime, …)`"),
            )
            .to_compile_error();
            return quote!(#msg #item);
        }
    };
    let args = args::parse(args, &mut cx);
    let bucket_param = args.buckets.as_ref().map(|b| b.param.clone());
    let mut model = model::analyze(item, bucket_param.as_ref(), &mut cx);
    let with_islands = islands::has_islands(&model);
    match with_islands.then(|| islands::as_checked(&model)) {
        Some(seen) => check_body(&seen, &args, &mut cx),
        None => check_body(&model, &args, &mut cx),
    }
    let guards = crate::check::state_guards(&model, &args);
    let names = islands::IslandNames::new(&base_name(&model, &args), model.item.sig.ident.span());
    if with_islands && model.usable {
        islands::rewrite(&mut model, &args.krate(), &names, &mut cx);
    }
    let islands = with_islands.then_some(&names);
    if !cx.has_errors() {
        if !with_islands {
            // (A body with islands may print inside them: its macros are not shadowed.)
            crate::check::shadow_host_macros(&mut model, &args);
        }
        let mut out = expand(&model, &args, islands);
        out.extend(guards);
        return out;
    }
    if model.usable {
        // Only the body or the arguments are wrong: emit the graph type anyway (with the
        // default for any invalid argument), so that code using it does not add errors of
        // its own to the ones that matter.
        let mut out = expand(&model, &args, islands);
        out.extend(guards);
        out.extend(cx.finish());
        return out;
    }
    fallback(&model.item, cx)
}

/// What the generated types' names start with: `name = …`, or the function's name in camel
/// case.
fn base_name(model: &GraphFn, args: &GraphArgs) -> String {
    args.name
        .as_ref()
        .map_or_else(|| parts::camel(&model.item.sig.ident), unraw)
}

/// On a signature error: the user's function (so the rest of the crate and the IDE keep
/// working) and every error.
fn fallback(item: &ItemFn, cx: Ctxt) -> TokenStream {
    let errors = cx.finish();
    quote!(#item #errors)
}

/// The `GraphSite` of the function, built by the runtime's const fn `site`: its name, warmup count,
/// determinism check (`debug`, the user's crate's `cfg!(debug_assertions)`, unless
/// `check_determinism` is given) and capture mode (only when it is not the default).
fn site_tokens(model: &GraphFn, args: &GraphArgs, debug: TokenStream) -> TokenStream {
    let determinism = match args.check_determinism {
        Some(on) => quote!(#on),
        None => debug,
    };
    let name = model.item.sig.ident.to_string();
    let warmup = proc_macro2::Literal::u32_unsuffixed(args.warmup());
    let mode = args.mode();
    let mode = (!matches!(mode, crate::args::CaptureMode::ThreadLocal)).then(|| {
        let mode = Ident::new(mode.variant(), Span::call_site());
        quote!(.mode(__cg::CaptureMode::#mode))
    });
    quote!(__cg::site(#name, #warmup, #determinism)#mode)
}

fn expand(
    model: &GraphFn,
    args: &GraphArgs,
    islands: Option<&islands::IslandNames>,
) -> TokenStream {
    let krate = relocated_path(&args.krate());
    let item = &model.item;
    let fn_ident = &item.sig.ident;
    let module = format_ident!("__cuda_graph_{}", unraw(fn_ident), span = fn_ident.span());
    // The site is a constant of the `GraphBody`, where `Self::DEBUG` is the user's crate's
    // `cfg!(debug_assertions)`.
    let mut parts = Parts::new(
        model,
        site_tokens(model, args, quote!(Self::DEBUG)),
        args.name.as_ref(),
    );
    let island_items = islands.map(|names| {
        let family = args.buckets.is_some();
        parts.island_items = islands::graph_body_items(model, names, &parts.pr, family);
        islands::items(model, &args.krate(), names, &item.vis)
    });
    let (body, names) = expand_graph(&parts, args);
    let outer_vis = &item.vis;
    // The module is hidden when the function is public: its types are then documented where
    // the re-export below inlines them. rustdoc does not inline a non-public re-export, so for
    // a private function the module stays visible to `cargo doc --document-private-items`,
    // which is how a binary's user finds the generated types.
    let hidden = matches!(item.vis, syn::Visibility::Public(_)).then(|| quote!(#[doc(hidden)]));
    quote! {
        #item
        #island_items

        #hidden
        #[allow(non_snake_case, unused_mut, unused_variables, unused_imports, dead_code)]
        #[allow(missing_docs, clippy::needless_lifetimes, clippy::too_many_arguments)]
        mod #module {
            use super::*;
            use #krate::__private as __cg;

            #body
        }

        // Inlined: the module is hidden, so the types' documentation appears where they are
        // used from (the crate's docs; a binary's with `--document-private-items`).
        #[doc(inline)]
        #[allow(unused_imports)]
        #outer_vis use self::#module::{#(#names),*};
    }
}
