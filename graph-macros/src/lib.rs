//! The `#[cuda_graph]` attribute. Use it through `graph_runtime`, which re-exports it and
//! holds everything the generated code calls.
//!
//! The crate is thin on purpose, one step per module (parse → model → check → expand):
//! `args` parses the attribute, `model` gives every parameter its role, `check` walks the
//! body against one rule table with what the model knows about the parameters, `expand`
//! emits the graph type (or the bucket family), and on any error the user's function is
//! emitted unchanged next to every error at once (`ctxt` collects them).
//!
//! Every module imports only modules below it, and no file imports its folder's parent:
//!
//! | layer | modules | what they own |
//! | --- | --- | --- |
//! | entry points | `lib.rs` | the macros, nothing else |
//! | expansion | `expand.rs`, `expand/` | the pipeline of one `#[cuda_graph]`, the graph type or bucket family (`graph.rs`), what a family adds (`buckets.rs`) and the pieces both generate (`parts.rs`) |
//! | checks | `check/` | what a body must not do, found on its tokens |
//! | model, arguments | `model.rs`, `args.rs`, `args/` | the role of every parameter; the attribute's keys |
//! | ground | `ctxt.rs`, `tokens.rs` | the error collector; paths and visibilities rewritten for the generated module |
//!
//! `derive.rs` (`#[derive(DeviceState)]`) stands apart, on `ctxt` alone. The layer table in
//! CONTRIBUTING.md ("How graph-macros is laid out") is the one `tests/layers.rs` holds the
//! code to.

mod args;
mod check;
mod ctxt;
mod derive;
mod expand;
mod model;
#[cfg(test)]
mod style_tests;
mod tokens;

use proc_macro::TokenStream;

/// Turns a function that launches GPU work into the same function plus a CUDA graph type.
///
/// ```no_run
/// # use graph_runtime::cudarc::driver::CudaSlice;
/// # use graph_runtime::{cuda_graph, GraphError, Runtime};
/// #[cuda_graph(warmup = 3)]
/// fn step(
///     rt: &Runtime,                   // 1st: the execution context (&Runtime, &Arc<CudaStream>, &CudaStream)
///     x: &CudaSlice<f32>,             // input: a static buffer, refilled by every replay
///     #[state] w: &CudaSlice<f32>,    // state: read in place, borrowed while the graph lives
///     #[state] kv: &mut CudaSlice<f32>, // mutable state: updated in place, lent back by state_mut()
///     y: &mut CudaSlice<f32>,         // output: a static buffer the graph owns
///     #[constant] eps: f32,           // a host value frozen into the graph at capture
/// ) -> Result<(), GraphError> {
///     // cudarc launches on rt.stream(), cuBLAS via rt.blas()
/// #   let _ = (rt, x, w, kv, y, eps);
///     Ok(())
/// }
/// # fn main() -> Result<(), GraphError> {
/// # let rt = Runtime::new(0)?;
/// # let (x, w) = (rt.stream().alloc_zeros::<f32>(64)?, rt.stream().alloc_zeros::<f32>(64)?);
/// # let mut kv = rt.stream().alloc_zeros::<f32>(64)?;
/// # let x_new = rt.stream().alloc_zeros::<f32>(64)?;
/// let mut graph = StepGraph::capture(&rt, &x, &w, &mut kv, 64, 1e-5)?; // y_len = 64
/// let y = graph.replay(&x_new)?.y;
/// # let _ = y;
/// # Ok(()) }
/// ```
///
/// A graph holds at most 16 inputs and 16 outputs; group more buffers into a
/// `#[derive(DeviceState)]` struct passed as `#[state]`.
///
/// You keep `step`, unchanged and callable eagerly, and get `StepGraph<'s>`:
///
/// | item | what it does |
/// | --- | --- |
/// | `StepGraph::capture(&rt, &x, &w, &mut kv, y_len, eps)` | allocates the static buffers (inputs shaped like the example `x`, outputs by length), runs `step` `warmup` times eagerly on the runtime's stream, captures one run, instantiates and uploads the graph |
/// | `graph.replay(&x_new)` | checks the input's shape, copies it into the static input, launches the graph; returns `StepOutputs { y: &CudaSlice<f32> }`, borrowed until the next replay |
/// | `graph.launch()` | replays with the static inputs as they are (write them through `inputs_mut()`) |
/// | `graph.state_mut()` | lends the `&mut` state back between replays |
/// | `graph.info()` | node count, temporaries, static bytes, warmup/capture/instantiate time |
///
/// # Equivalent code without `#[cuda_graph]`
/// What `StepGraph::capture` and `replay` do, written by hand with the runtime:
///
/// ```no_run
/// # use graph_runtime::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
/// # use graph_runtime::cudarc::driver::CudaSlice;
/// # use graph_runtime::{GraphError, Runtime};
/// # fn step(rt: &Runtime, x: &CudaSlice<f32>, w: &CudaSlice<f32>, kv: &mut CudaSlice<f32>,
/// #         y: &mut CudaSlice<f32>, eps: f32) -> Result<(), GraphError> { Ok(()) }
/// # use CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
/// # const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: CUgraphInstantiate_flags =
/// #     CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let rt = Runtime::new(0)?;
/// # let (x, w) = (rt.stream().alloc_zeros::<f32>(64)?, rt.stream().alloc_zeros::<f32>(64)?);
/// # let (mut kv, x_new, y_len, eps) = (rt.stream().alloc_zeros::<f32>(64)?, x.clone(), 64, 1e-5);
/// // capture
/// let mut x_static = rt.stream().alloc_zeros::<f32>(x.len())?;
/// rt.stream().memcpy_dtod(&x, &mut x_static)?;
/// let mut y_static = rt.stream().alloc_zeros::<f32>(y_len)?;
/// for _ in 0..3 {
///     step(&rt, &x_static, &w, &mut kv, &mut y_static, eps)?;      // warmup, eager
/// }
/// rt.stream().synchronize()?;
/// rt.stream().begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
/// let body = step(&rt, &x_static, &w, &mut kv, &mut y_static, eps); // recorded, not run
/// let graph = rt.stream().end_capture(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)?; // even if `body` failed
/// body?;
/// let graph = graph.ok_or("nothing was recorded")?;
/// graph.upload()?;
///
/// // replay
/// assert_eq!(x_new.len(), x_static.len());
/// rt.stream().memcpy_dtod(&x_new, &mut x_static)?;
/// graph.launch()?;
/// let y: &CudaSlice<f32> = &y_static; // nothing stops you from holding it across the next launch
/// # let _ = y;
/// # Ok(()) }
/// ```
///
/// The generated code adds what the hand-written version leaves to you: the capture is
/// ended even when the body returns an error or panics; CUDA's error codes come back as
/// typed errors naming `step`; copies of pageable host memory recorded into the graph are
/// refused; random generators are restored after the warmup; `w` cannot be freed while the
/// graph exists and `y` cannot be held across the next replay (both are borrow errors).
///
/// # Arguments
/// * `warmup = N`: eager runs before the capture (default 3, at least 1);
/// * `mode = "thread_local" | "global" | "relaxed"`: the CUDA capture mode (default
///   `"thread_local"`);
/// * `name = DecodeStep`: what the generated types' names start with (`DecodeStepGraph`,
///   `DecodeStepInputs`, `DecodeStepOutputs`, `DecodeStepState`; `DecodeStepBuckets`,
///   `DecodeStepBucketOutputs` and `DecodeStepBucketState` for a bucket family) instead of
///   the function's name in camel case, when those names are taken in your module (errors
///   and logs still name the function);
/// * `crate = "path"`: where the runtime crate is, if renamed;
/// * `host_effects_not_replayed`: lets the body print, log, do I/O, sleep, read clocks and
///   update host collections; those effects run in the warmup runs and the capture, never
///   on replay;
/// * `buckets(batch = [1, 2, 4, 8], fallback = "eager", lazy = 2)`: one graph per batch size. `batch`
///   names a by-value integer parameter that receives the bucket size; every input and
///   output holds `batch` rows. The generated `StepBuckets::capture` takes the elements per
///   row of each input and output, and `replay` runs the smallest bucket that holds the
///   input's rows (padding rows zero-filled, only the valid output rows handed out). A batch
///   above the largest bucket is `GraphError::BatchAboveBuckets`, or runs eagerly with
///   `fallback = "eager"`. With `lazy = N`, `capture` captures no bucket: each is captured
///   on the first replay that needs it, and at most `N` graphs stay live (the least recently
///   replayed one is dropped to make room; a batch above the largest bucket is never
///   captured). `family.buckets().stats()` counts replays, captures, evictions and padded
///   rows per bucket. Each bucket's graph verifies its replays (the `verify` keys below, each
///   bucket on its own schedule, against the function run eagerly on the bucket's rows) and
///   may have eager islands, as a single graph does;
/// * `verify = "never" | "first" | "doubling" | "every"` or `verify_every = N`: which replays
///   verify themselves like `graph.verify(…)` (run the body eagerly on the same inputs and
///   compare every output and `&mut` state with the replay's); default `"doubling"` (replays
///   1, 2, 4, 8, …) in debug builds, `"never"` in release builds;
/// * `verify_tolerance = 1e-5`: those replays' tolerance (absolute and relative); bitwise
///   when left out;
/// * `check_determinism` (or `= true` / `= false`): capture twice and compare the two graphs
///   node by node (default: on in debug builds).
///
/// # Returned values
/// A body may return `Result<T, E>` with `T` a device buffer (`CudaSlice<_>`, or candle's
/// `Tensor`: `-> Result<Tensor>`) instead of writing an output parameter: the returned value
/// is copied into a static buffer inside the graph and handed out as the outputs' `result`.
///
/// # Compile-time capture checks
/// The body is checked for calls that a capture refuses or that would run only at capture
/// (host synchronisation, device-to-host reads, new streams, the legacy stream, CPU random
/// numbers, threads, module loads, host effects, …), also through cudarc's raw `result` and
/// `sys` layers; each is an error at the call, naming the CUDA failure it prevents and what
/// to write instead. `graph_runtime::coverage` lists them all, and what the checks cannot
/// tell apart. Functions and `macro_rules!` declared in the body are checked like it; `&mut`
/// state that lives on the host (`&mut u64`, also under an alias) is refused at the
/// parameter; a bare `println!`/`info!`/… that a macro of yours reaches is refused where it
/// is reached. Where a message can misfire on code of yours that only shares a name, it names
/// the per-statement opt-out, `graph_runtime::replays_as_captured!{ … }`.
#[proc_macro_attribute]
pub fn cuda_graph(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::cuda_graph(args.into(), item.into()).into()
}

/// Checks a helper function that `#[cuda_graph]` bodies call as if it were a body: a sync, a
/// device-to-host read, a new stream, CPU randomness, a print, a clock read… inside it is a
/// compile error at the line, with the message a body gets. The function is emitted as
/// written. The checks cannot follow a call from a body into a function declared outside
/// it; mark the helpers you call from bodies, and they can.
///
/// ```
/// # use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
/// # use graph_runtime::{graph_helper, GraphError, Runtime};
/// #[graph_helper]
/// fn copy(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
///     rt.stream().memcpy_dtod(x, y)?; // fine: GPU work on the runtime's stream
///     // rt.stream().synchronize()?;  // would not compile: the capture cannot record it
///     Ok(())
/// }
/// # fn main() {}
/// ```
#[proc_macro_attribute]
pub fn graph_helper(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::graph_helper(args.into(), item.into()).into()
}

/// Implements `graph_runtime::DeviceState` for a struct or enum of yours, so that a graph can
/// hold it as `#[state]`: the runtime learns where its device buffers are (field by field, in
/// declaration order), compares their addresses before every replay, and snapshots them
/// around the warmup when the state is `&mut`.
///
/// ```
/// # use graph_runtime::cudarc::driver::CudaSlice;
/// # use graph_runtime::DeviceState;
/// # #[derive(DeviceState)]
/// # struct Layer { w: CudaSlice<f32> }
/// #[derive(DeviceState)]
/// struct Decoder {
///     layers: Vec<Layer>,          // each `Layer` derives `DeviceState` too
///     kv: CudaSlice<f32>,
///     #[device_state(skip)]
///     name: String,                // holds no device memory (plain scalars need no `skip`)
/// }
/// ```
///
/// Every field's type must implement `DeviceState` or be marked `#[device_state(skip)]`.
/// Lent back by a graph's `state_mut()` as `&mut Self`; a buffer replaced through it is found
/// before the next replay and refused with `GraphError::StateMoved`. Use
/// `#[device_state(crate = "path")]` on the type if the runtime crate is renamed.
#[proc_macro_derive(DeviceState, attributes(device_state))]
pub fn derive_device_state(item: TokenStream) -> TokenStream {
    derive::derive(item.into()).into()
}
