//! The `#[cuda_graph]` attribute. Use it through `graph_runtime`, which re-exports it and
//! holds everything the generated code calls.

mod args;
mod buckets;
mod check;
mod ctxt;
mod expand;
mod model;

use proc_macro::TokenStream;

/// Turns a function that launches GPU work into the same function plus a CUDA graph type.
///
/// See the `graph_runtime` crate documentation for the full guide.
///
/// # Arguments
/// * `warmup = N`: eager runs before the capture (default 3, at least 1);
/// * `mode = "thread_local" | "global" | "relaxed"`: the CUDA capture mode (default
///   `"thread_local"`);
/// * `crate = "path"`: where the runtime crate is, if renamed;
/// * `host_effects_not_replayed`: lets the body print, log, do I/O, sleep, read clocks and
///   update host collections; those effects run in the warmup runs and the capture, never
///   on replay.
///
/// # Compile-time capture checks
/// The body is checked for calls that a capture refuses or that would run only at capture
/// (host synchronisation, device-to-host reads, new streams, the legacy stream, CPU random
/// numbers, host effects, …); each is an error at the call, naming the CUDA failure it
/// prevents and what to write instead. `graph_runtime::coverage` lists them all.
#[proc_macro_attribute]
pub fn cuda_graph(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::cuda_graph(args.into(), item.into()).into()
}
