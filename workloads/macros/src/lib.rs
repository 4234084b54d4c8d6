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
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{parse_macro_input, FnArg, ItemFn, LitInt};

/// A test that needs a GPU: `fn name(rt: Runtime) -> Result<(), E>` (or `-> ()`), given a
/// fresh `Runtime` on device 0. Without a usable GPU the harness counts it as ignored and
/// says why; with `CUDA_GRAPH_REQUIRE_GPU=1` it fails instead.
///
/// `#[gpu_test(gpus = N)]` asks for N GPUs: on a machine with fewer (but some) it is ignored,
/// saying how many it needs, also with `CUDA_GRAPH_REQUIRE_GPU=1`; such tests run one at a
/// time. Its parameter may be any `workloads::testing::GpuFixture`: a `Runtime`, or with
/// the `nccl` feature a `CommGroup` of N ranks (a libnccl that does not load then counts
/// like a missing GPU).
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
/// #[gpu_test(gpus = 2)]
/// fn all_reduce_replays_like_eager(group: CommGroup) -> Result<(), GraphError> {
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
    match check(args, &item, kind) {
        Ok(gpus) => register(item, kind, gpus),
        // Keep the function, so that the user's other errors still show.
        Err(e) => {
            let e = e.to_compile_error();
            quote!(#item #e)
        }
    }
}

/// The arguments of `#[gpu_test(…)]`: the GPUs the test needs (1 unless `gpus = N`).
fn gpu_args(args: TokenStream2) -> syn::Result<usize> {
    let mut gpus: Option<usize> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("gpus") {
            if gpus.is_some() {
                return Err(meta.error("`gpus` set multiple times"));
            }
            let lit: LitInt = meta.value()?.parse()?;
            let n: usize = lit.base10_parse()?;
            if n == 0 {
                return Err(syn::Error::new(
                    lit.span(),
                    "`gpus` must be at least 1 (a test without a GPU is #[cpu_test])",
                ));
            }
            gpus = Some(n);
            Ok(())
        } else {
            Err(meta.error("unknown #[gpu_test] argument; expected `gpus = N`"))
        }
    });
    parser.parse2(args)?;
    Ok(gpus.unwrap_or(1))
}

/// Checks the attribute's arguments and the function; the GPUs the test needs (0 for a CPU
/// test).
fn check(args: TokenStream2, item: &ItemFn, kind: Kind) -> syn::Result<usize> {
    let attr = match kind {
        Kind::Gpu => "#[gpu_test]",
        Kind::Cpu => "#[cpu_test]",
    };
    let gpus = match kind {
        Kind::Gpu => gpu_args(args)?,
        Kind::Cpu if args.is_empty() => 0,
        Kind::Cpu => {
            return Err(syn::Error::new(
                args.span(),
                "#[cpu_test] takes no arguments",
            ))
        }
    };
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
        (Kind::Gpu, 1) | (Kind::Cpu, 0) => Ok(gpus),
        (Kind::Gpu, _) => Err(syn::Error::new(
            sig.inputs.span(),
            "#[gpu_test] requires exactly one parameter, the runtime (`rt: Runtime`) or, with `gpus = N`, the group (`group: CommGroup`)",
        )),
        (Kind::Cpu, _) => Err(syn::Error::new(
            sig.inputs.span(),
            "#[cpu_test] requires a fn without parameters (a GPU test is #[gpu_test] with `rt: Runtime`)",
        )),
    }
}

fn register(item: ItemFn, kind: Kind, gpus: usize) -> TokenStream2 {
    let name = &item.sig.ident;
    let p = quote!(::workloads::testing::__private);
    let path = quote!(::core::concat!(
        ::core::module_path!(),
        "::",
        ::core::stringify!(#name)
    ));
    let test = match kind {
        Kind::Gpu => {
            let ty = match item.sig.inputs.first() {
                Some(FnArg::Typed(t)) => &t.ty,
                _ => unreachable!("checked: one typed parameter"),
            };
            // The parameter is set up as its own type, so a type that is no fixture is
            // reported at the parameter.
            let run = quote_spanned!(ty.span()=> |gpus: usize| #p::attempt::<#ty, _>(gpus, #name));
            quote!(#p::Test::gpu(#path, #gpus, #run))
        }
        Kind::Cpu => quote!(#p::Test::cpu(#path, || #p::outcome(#name()))),
    };
    quote! {
        #item
        #p::inventory::submit! { #test }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(args: TokenStream2) -> Result<usize, String> {
        let item: ItemFn = syn::parse_quote!(
            fn t(rt: Runtime) {}
        );
        check(args, &item, Kind::Gpu).map_err(|e| e.to_string())
    }

    #[test]
    fn gpus_default_to_one_and_take_a_count() {
        assert_eq!(gpu(quote!()), Ok(1));
        assert_eq!(gpu(quote!(gpus = 2)), Ok(2));
        assert_eq!(gpu(quote!(gpus = 8)), Ok(8));
    }

    #[test]
    fn bad_gpu_arguments_say_what_to_write() {
        assert_eq!(
            gpu(quote!(gpus = 0)).unwrap_err(),
            "`gpus` must be at least 1 (a test without a GPU is #[cpu_test])"
        );
        assert_eq!(
            gpu(quote!(gpus = 2, gpus = 3)).unwrap_err(),
            "`gpus` set multiple times"
        );
        assert_eq!(
            gpu(quote!(devices = 2)).unwrap_err(),
            "unknown #[gpu_test] argument; expected `gpus = N`"
        );
        assert!(gpu(quote!(gpus = "two")).is_err());
        assert!(gpu(quote!(gpus)).is_err());
    }

    #[test]
    fn cpu_tests_take_no_arguments() {
        let item: ItemFn = syn::parse_quote!(
            fn t() {}
        );
        assert_eq!(check(quote!(), &item, Kind::Cpu).ok(), Some(0));
        let e = check(quote!(gpus = 1), &item, Kind::Cpu).unwrap_err();
        assert_eq!(e.to_string(), "#[cpu_test] takes no arguments");
    }

    #[test]
    fn the_registration_carries_the_gpu_count() {
        let item: ItemFn = syn::parse_quote!(
            fn two(group: CommGroup) -> Result<(), GraphError> {
                Ok(())
            }
        );
        let out = expand(quote!(gpus = 2), item, Kind::Gpu).to_string();
        assert!(out.contains("Test :: gpu"), "{out}");
        assert!(out.contains(", 2usize ,"), "{out}");
        assert!(out.contains("attempt :: < CommGroup , _ >"), "{out}");
    }
}
