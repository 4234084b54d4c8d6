//! `#[gpu_test]` and `#[cpu_test]`: a test declared once, where it is written.
//!
//! Each attribute keeps the function as it is and registers it with the harness of
//! `workloads::testing` (through `inventory`), which a test binary built with
//! `harness = false` runs from its `main`. Use them through `workloads::testing`; the
//! expansion names only `::workloads::testing::__private`.
//!
//! This crate owns the two attributes and nothing else; it imports only syn, quote and
//! proc-macro2.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{parse_macro_input, FnArg, ItemFn};

/// A test that needs a GPU: `fn name(rt: Runtime) -> Result<(), E>` (or `-> ()`), given a
/// fresh `Runtime` on device 0. Without a usable GPU the harness counts it as ignored and
/// says why; with `CUDA_GRAPH_REQUIRE_GPU=1` it fails instead.
///
/// ```ignore
/// use workloads::testing::gpu_test;
///
/// #[gpu_test]
/// fn replays_like_eager(rt: Runtime) -> Result<(), GraphError> {
///     // …
///     Ok(())
/// }
///
/// fn main() -> std::process::ExitCode {
///     workloads::testing::run_tests()
/// }
/// ```
#[proc_macro_attribute]
pub fn gpu_test(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = parse_macro_input!(item as ItemFn);
    expand(args.into(), item, Kind::Gpu).into()
}

/// A test that runs on the CPU, in a test binary whose other tests use `#[gpu_test]`:
/// `fn name()` (or `-> Result<(), E>`). It always runs.
#[proc_macro_attribute]
pub fn cpu_test(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = parse_macro_input!(item as ItemFn);
    expand(args.into(), item, Kind::Cpu).into()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Gpu,
    Cpu,
}

fn expand(args: TokenStream2, item: ItemFn, kind: Kind) -> TokenStream2 {
    match check(&args, &item, kind) {
        Ok(()) => register(item, kind),
        // Keep the function, so that the user's other errors still show.
        Err(e) => {
            let e = e.to_compile_error();
            quote!(#item #e)
        }
    }
}

fn check(args: &TokenStream2, item: &ItemFn, kind: Kind) -> syn::Result<()> {
    let attr = match kind {
        Kind::Gpu => "#[gpu_test]",
        Kind::Cpu => "#[cpu_test]",
    };
    if !args.is_empty() {
        return Err(syn::Error::new(
            args.span(),
            format!("{attr} takes no arguments"),
        ));
    }
    let sig = &item.sig;
    if let Some(a) = &sig.asyncness {
        return Err(syn::Error::new(
            a.span(),
            format!("{attr} requires a non-async fn"),
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.generics.span(),
            format!("{attr} requires a fn without generic parameters"),
        ));
    }
    if let Some(FnArg::Receiver(r)) = sig.inputs.first() {
        return Err(syn::Error::new(
            r.span(),
            format!("{attr} requires a free fn, not a method"),
        ));
    }
    match (kind, sig.inputs.len()) {
        (Kind::Gpu, 1) | (Kind::Cpu, 0) => Ok(()),
        (Kind::Gpu, _) => Err(syn::Error::new(
            sig.inputs.span(),
            "#[gpu_test] requires exactly one parameter, the runtime: `rt: Runtime`",
        )),
        (Kind::Cpu, _) => Err(syn::Error::new(
            sig.inputs.span(),
            "#[cpu_test] requires a fn without parameters (a GPU test is #[gpu_test] with `rt: Runtime`)",
        )),
    }
}

fn register(item: ItemFn, kind: Kind) -> TokenStream2 {
    let name = &item.sig.ident;
    let p = quote!(::workloads::testing::__private);
    let test = match kind {
        Kind::Gpu => {
            let ty = match item.sig.inputs.first() {
                Some(FnArg::Typed(t)) => &t.ty,
                _ => unreachable!("checked: one typed parameter"),
            };
            // The runtime is passed as the parameter's own type, so a wrong type is reported
            // at the parameter.
            let call = quote_spanned!(ty.span()=> |rt: #ty| #p::outcome(#name(rt)));
            quote!(#p::Test::gpu(::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name)), #call))
        }
        Kind::Cpu => quote!(#p::Test::cpu(
            ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name)),
            || #p::outcome(#name())
        )),
    };
    quote! {
        #item
        #p::inventory::submit! { #test }
    }
}
