//! The `#[cuda_graph]` attribute. Use it through `graph_runtime`, which re-exports it and
//! holds everything the generated code calls.

mod args;
mod check;
mod ctxt;
mod expand;
mod model;

use proc_macro::TokenStream;

/// Turns a function that launches GPU work into the same function plus a CUDA graph type.
///
/// See the `graph_runtime` crate documentation for the full guide.
#[proc_macro_attribute]
pub fn cuda_graph(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::cuda_graph(args.into(), item.into()).into()
}
