//! CUDA graphs for Rust GPU code written against [cudarc].
//!
//! Put [`#[cuda_graph]`](macro@cuda_graph) on a function that launches GPU work and you get
//! the function back, unchanged and callable eagerly, plus a graph type that warms it up,
//! captures it once into a CUDA graph and replays that graph with new inputs: one
//! `cuGraphLaunch` instead of one launch per kernel.
//!
//! ```no_run
//! use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
//! use graph_runtime::{cuda_graph, GraphError, Runtime};
//!
//! const SRC: &str = r#"
//! extern "C" __global__ void scale_add(const float *x, const float *w, float *y, int n) {
//!     int i = blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < n) y[i] = w[i] * x[i] + 1.0f;
//! }"#;
//!
//! #[cuda_graph(warmup = 3)]
//! fn scale_add(
//!     rt: &Runtime,                 // the execution context: always first
//!     x: &CudaSlice<f32>,           // input: copied into a static buffer on every replay
//!     #[state] w: &CudaSlice<f32>,  // state: read in place, borrowed while the graph lives
//!     y: &mut CudaSlice<f32>,       // output: a static buffer the graph owns
//! ) -> Result<(), GraphError> {
//!     let f = rt.function(SRC, "scale_add")?;
//!     let n = x.len() as i32;
//!     let mut launch = rt.stream().launch_builder(&f);
//!     launch.arg(x).arg(w).arg(y).arg(&n);
//!     // SAFETY: the kernel reads `n` elements of `x` and `w` and writes `n` of `y`.
//!     unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32)) }?;
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), GraphError> {
//! let rt = Runtime::new(0)?;
//! let w = rt.stream().clone_htod(&vec![2.0f32; 1024])?;
//! let x = rt.stream().clone_htod(&vec![1.0f32; 1024])?;
//!
//! let mut graph = ScaleAddGraph::capture(&rt, &x, &w, 1024)?; // warmup ×3, capture, upload
//! let out = graph.replay(&vec![5.0f32; 1024])?;                // copy input, one launch
//! let y = rt.stream().clone_dtoh(out.y)?;                     // read after replay
//! assert_eq!(y[0], 11.0);
//! # Ok(()) }
//! ```
//!
//! # Concepts
//!
//! | concept | what it is | where |
//! | --- | --- | --- |
//! | runtime | one device: context, the capture stream, cuBLAS with its workspace, the NVRTC kernel cache; a cheap `Clone` handle that every graph keeps, so a graph cannot outlive it. Made on a device, or on a context or stream you already have (candle's, your own) | [`Runtime`], [`Runtime::from_context`], [`Runtime::from_stream`], [`Runtime::for_stream`] |
//! | capture stream | the non-blocking stream that warmup, capture and replay all use; never the legacy default stream | [`Runtime::stream`] |
//! | warmup | `warmup = N` eager runs of the body before capture, so that lazy work (NVRTC, module loads, cuBLAS heuristics, allocations) happens outside the graph | [`GraphSite::warmup`] |
//! | capture | recording the body once into a CUDA graph; an error or panic in the body ends the capture and leaves the runtime usable | [`GraphInfo`] |
//! | input (`&T`) | a static device buffer the graph owns; every `replay` checks the new value's shape and fills the buffer: a device source on the runtime's stream through the graph's own first node (one node update, no copy launch), any other source by a copy before the launch | [`InputSource`], [`StaticBuffer`], [`NodeKinds::input_copies`] |
//! | state (`#[state] &T` / `&mut T`) | device data read (or updated) in place by address; borrowed for the graph's lifetime so it cannot be freed or reallocated under the graph; its addresses are recorded at capture and checked at every replay (a buffer swapped behind the borrow is [`GraphError::StateMoved`]); `&mut` state is snapshotted around the warmup so warmup runs do not change it | [`DeviceState`], `#[derive(DeviceState)]`, generated `FooGraph<'s>` |
//! | owned or shared state | the graph holds its state (by value, or in an `Arc`) instead of borrowing it: `FooGraph<'static>` fits in your own struct | [`StateArg`], [`StateArgMut`], [`Held`], [`HeldMut`] |
//! | output (`&mut T`) | a static device buffer the graph owns; `replay` lends it out until the next replay | generated `FooOutputs<'g>` |
//! | constant (`#[constant] T`) | a host value fixed at capture (plain `Copy` data: device memory goes in state); the graph replays with the captured value | [`GraphConstant`], generated `capture` |
//! | temporaries | buffers the body allocates become graph allocation nodes: fixed addresses for the graph's life, freed inside the graph | [`GraphInfo::temp_bytes`] |
//! | graph memory pool | where the temporaries of every graph live; graphs of one runtime launch on one stream, so they share its physical memory: the pool holds the largest graph's temporaries, not the sum; dropping a graph trims it | [`Runtime::graph_memory`] |
//! | shape buckets | `buckets(batch = [1, 2, 4, 8])`: one graph per batch size, captured largest first, sharing static buffers and the pool; a replay pads to the smallest bucket that fits | [`Buckets`] |
//! | random numbers | Philox generators whose seed and offset live on the device and advance inside the graph: fresh numbers every replay, no registration, warmup undone | [`rng`], [`Runtime::rng`], [`Generator`] |
//! | random numbers in your kernels | a CUDA device API (`philox_begin`, `philox_group`, `philox_end`, the library's conversions) plus the generator's state pointer: a kernel of yours draws what the library draws and stays graph-safe | [`rng::PHILOX_DEVICE_API`], [`philox_device_api!`], [`Generator::kernel_arg`] |
//! | capture errors | CUDA 900–908 as one [`GraphError`] variant each, naming the graph and the fix | [`GraphError`] |
//! | verification | the generated `verify` runs the body eagerly on the same inputs and compares every output with the replay's (bitwise or within a tolerance); `verify = "first"`/`"every"`/`verify_every = N` do it on replays; `check_determinism` captures twice and compares the two graphs node by node | [`verify`], [`VerifyReport`], [`Tolerance`] |
//! | inspection | node counts by kind, the graph as Graphviz, timings of capture and replay, raw handles for what the library does not wrap | [`GraphInfo`], [`Graph::write_dot`], [`GraphTimer`], [`Graph::cu_graph_exec`] |
//! | phase | whether this thread is running eagerly, warming up or capturing | [`phase`], [`ensure_not_capturing`] |
//! | early launch | a kernel started while the one before it finishes (programmatic dependent launch, sm_90+): it loads what no running kernel writes, then waits; captured as a programmatic graph edge | [`launch`], [`Runtime::launch_early`], [`GraphInfo::early_edges`] |
//! | fork/join | a parallel branch on a side stream made before the capture, always rejoined; the branch borrows the buffers it reads and writes, so the borrow checker rejects a race between the branches | [`Runtime::fork`], [`fork_join`], [`ForkedStream`] |
//! | collectives (feature `nccl`) | NCCL all-reduce, all-gather, reduce-scatter and broadcast on the runtime's stream, one thread and runtime per GPU; every rank captures together and the ranks' collective sequences are compared before instantiation | `graph_runtime::nccl` (`CommGroup`, `Communicator`) |
//! | loops and branches on the GPU | `graph_while` / `graph_if` / `graph_if_else` with a [`Condition`] that a kernel sets: captured, CUDA conditional nodes (one launch runs a data-dependent loop); eagerly, the same loop on the host, reading the condition (the only host read a body may contain) | [`conditional`], [`Runtime::graph_while`], [`Runtime::graph_if`], [`condition_device_api!`] |
//! | candle (feature `candle`) | a function written with candle ops as a graph: candle's `&Device` as context, `&Tensor` inputs copied into static tensors, candle-nn models as state, a returned `Tensor` copied into a static result inside the graph; candle's small uploads served from its cache during capture | `graph_runtime::candle`, `Runtime::from_candle` |
//! | capture checks | what `#[cuda_graph]` rejects in a body at compile time (syncs, host reads, new streams, host effects, …) and the opt-in `host_effects_not_replayed` | [`coverage`] |
//!
//! # Learning path
//! The examples are numbered and build on each other:
//! 1. `01-first-graph`: annotate a cudarc function, capture, replay, compare with eager;
//! 2. `02-chain`: launch overhead of N tiny kernels, eager vs graph vs a raw cudarc capture
//!    vs PyTorch (the main benchmark);
//! 3. `03-rng-fill`: graph-safe random numbers, and their bandwidth;
//! 4. `04-mlp-inference`: one graph per batch size, cuBLAS and cuBLASLt in a graph, early
//!    launch between layers;
//! 5. `05-decode-step`: a transformer decode step whose token and position live on the
//!    device, so one graph serves every token; the graph lives in the decoder's own struct;
//! 6. `06-train-step` and `07-dropout-train`: a whole training step as one graph, then with
//!    dropout drawn from a graph-safe generator;
//! 7. `08-report`: every benchmark, PyTorch's included, in one report;
//! 8. `09-user-rng-kernel`: your own kernel drawing the library's random numbers;
//! 9. `10-tensor-parallel-mlp` and `11-data-parallel-train` (feature `nccl`, two GPUs):
//!    NCCL collectives captured on every rank;
//! 10. `12-candle-mlp`, `13-candle-decoder` and `16-candle-llama-decode` (feature
//!     `candle`): candle code as a graph, against candle eager (16: against
//!     candle-transformers' own Llama);
//! 11. `14-decode-loop` and `15-jacobi-solve`: loops that stop on device data inside one
//!     graph launch (`graph_while`): decoding until the end token, iterating until the
//!     residual is small.
//!
//! # Bring your own context or stream
//! A runtime does not have to own its device. [`Runtime::from_context`] makes one on a
//! context you created (event tracking must be off: the runtime adds a second stream, and
//! cudarc's cross-stream events make a capture fail with CUDA error 905, so this is refused
//! as [`GraphError::EventTracking`] with the fix). [`Runtime::from_stream`] captures and
//! replays on a stream you already use (candle's `CudaDevice::cuda_stream()`), so graphs
//! run in order with the rest of your work and buffers made before the runtime are used as
//! they are. A body whose context parameter is a stream reaches the kernel cache through
//! [`function`] / [`Runtime::for_stream`].
//!
//! # Without a GPU
//! Everything builds without a GPU, a driver or a CUDA toolkit: cudarc loads libcuda,
//! NVRTC and cuBLAS when they are first used. On a machine without a driver,
//! [`Runtime::new`] returns [`GraphError::NoDriver`] instead of panicking and
//! [`driver_available`] answers without touching CUDA, so a program can say why it
//! cannot run. This workspace's GPU tests count as ignored there (and fail with
//! `CUDA_GRAPH_REQUIRE_GPU=1`).
//!
//! # Requirements
//! * An NVIDIA driver for CUDA 12 or newer; tested with driver 580 (CUDA 13.0) on H100 and
//!   H200.
//! * Loops and branches on the GPU ([`conditional`]) need a driver for CUDA 12.4 (driver 550)
//!   or newer, `graph_if_else` CUDA 12.8 (driver 570); older drivers get
//!   [`GraphError::ConditionalUnsupported`].
//! * Early launch needs compute capability 9.0 (Hopper) or newer; on older GPUs the launch
//!   attribute is ignored and the kernels run in order (see [`launch`]).
//! * cudarc's linking and CUDA-version features belong to your binary: this crate asks for
//!   `fallback-dynamic-loading` and `cuda-version-from-build-system` with `fallback-latest`,
//!   so it builds beside candle-core's `cuda` (which links the libraries) and cubecl-cuda, and
//!   alone on a machine without a CUDA toolkit (newest bindings, loaded at run time).
//!
//! # Logging
//! The library logs through [`tracing`](https://docs.rs/tracing) and prints nothing. Each
//! capture is a `cuda_graph_capture` span at `debug` level with a `trace` event when the
//! warmup is done and a `debug` summary (nodes, memory, warmup, capture and instantiate
//! times); each replay is a `cuda_graph_replay` span at `trace` level; bucket families log
//! each bucket's capture at `info` level, so a long family shows its progress. Install any
//! subscriber, for example `tracing-subscriber` with `RUST_LOG=graph_runtime=debug`.
//!
//! # Memory
//! A graph holds three kinds of memory, all reported in [`GraphInfo`]: its static inputs and
//! outputs (`static_bytes`, allocated at capture, freed with the graph), the temporaries its
//! body allocates (`temp_bytes`, graph allocation nodes in the runtime's graph memory pool),
//! and the borrowed state (not owned). Replays allocate nothing. Out of memory during a
//! capture is [`GraphError::OutOfMemory`], naming the graph, what it was allocating and the
//! free memory, and the runtime stays usable.
//!
//! # What the runtime takes care of
//! * cudarc's per-buffer event tracking is turned off on the runtime's context: with it on and
//!   two streams, capture fails with error 905 (see [`Runtime`]).
//! * cuBLAS gets its workspace up front ([`CUBLAS_WORKSPACE_BYTES`]) so a GEMM never allocates
//!   while capturing.
//! * Kernels compile once per process and load once per runtime ([`Runtime::function`]).
//! * Graphs are instantiated with auto-free-on-launch and uploaded right away, so the first
//!   replay costs what every other one does.
//! * Every captured copy is inspected: one that reads or writes pageable host memory (a
//!   `Vec` the body copied to or from) would touch freed memory on replay and is refused
//!   ([`GraphError::PageableCopyCaptured`]).
//! * A replay attempted while another thread captures on the same stream is refused
//!   ([`GraphError::StreamCapturing`]) instead of being recorded into that graph; the check
//!   costs two uncontended atomic operations per replay.
//!
//! # How the crate is laid out
//! Imports run one way, from the top of this list to the bottom; no file imports a file
//! above it, and no files import each other in a circle. Inside a folder, either the parent
//! file only names and re-exports its parts (`error.rs`), or the parts import the parent and
//! the parent imports none of its parts' names (`state.rs`, `conditional.rs`, `rng/mod.rs`).
//!
//! | layer | files | may import |
//! |---|---|---|
//! | entry | `lib.rs` (this page, re-exports), `__private.rs` (re-exports for generated code) | everything |
//! | families | `buckets.rs` | the capture and below |
//! | capture | `capture.rs` (warmup, capture, the guard) | the graph and below |
//! | graphs | `graph.rs`, `candle.rs` | buffers and below |
//! | buffers | `buffer.rs` (static buffers, sources, `Staging`), `fingerprint.rs` | input nodes, constructs and below |
//! | work in a body | `inputs.rs`, `fork.rs`, `timer.rs`, `conditional/`, `verify/`, `nccl/`, `state/snapshot.rs`, `rng/` draws | one another (never in a circle), the runtime and below |
//! | runtime | `runtime/` (context, streams, cuBLAS, kernel cache, library probes) | the generator core and below |
//! | core data | `rng/generator.rs`, `launch.rs`, `state/` (address book), `phase.rs`, `site.rs` | errors and driver calls |
//! | ground | `error/`, `driver/` (one thin function per raw driver call, each linking NVIDIA's documentation), `region.rs`, `constant.rs` | nothing of the crate (`error/` only the report and NCCL error it carries) |

#![warn(missing_docs)]

pub use cudarc;
pub use graph_macros::cuda_graph;
/// The `half` crate, whose `f16` and `bf16` are the 16-bit element types generators fill.
pub use half;

mod buckets;
mod buffer;
#[cfg(feature = "candle")]
pub mod candle;
mod capture;
pub mod conditional;
mod constant;
mod driver;
mod error;
mod fingerprint;
mod fork;
mod graph;
mod inputs;
pub mod launch;
#[cfg(feature = "nccl")]
pub mod nccl;
mod phase;
mod region;
pub mod rng;
mod runtime;
mod site;
pub mod state;
mod timer;
pub mod verify;

#[doc(hidden)]
pub mod __private;

/// Coverage of known CUDA-graph failures: what the types, the macro and the runtime catch.
///
#[doc = include_str!("coverage.md")]
pub mod coverage {}

pub use buckets::Buckets;
pub use buffer::{InputSource, Staging, StaticBuffer};
pub use conditional::{Compare, Condition, ConditionArg, ConditionValue};
pub use constant::GraphConstant;
pub use error::{BoxError, GraphError, When};
pub use fork::{fork_join, ForkedStream, SideLaunch, SideMut, SideRead, SideRef};
pub use graph::{Graph, GraphInfo, NodeKinds};
pub use graph_macros::DeviceState;
pub use launch::EarlyLaunch;
pub use phase::{ensure_not_capturing, is_capturing, phase, Phase};
pub use rng::{Generator, RngAdvance, RngKernelArg, RngState};
pub use runtime::{
    driver_available, function, library_available, GraphMemory, Runtime, CUBLAS_WORKSPACE_BYTES,
};
pub use site::{CaptureMode, GraphSite};
pub use state::{DeviceRegion, DeviceState, Elem, Held, HeldMut, StateArg, StateArgMut};
pub use timer::GraphTimer;
pub use verify::{Tolerance, VerifyReport};

use std::sync::Arc;

use cudarc::driver::CudaStream;

/// Types the first parameter of a `#[cuda_graph]` function may borrow: what the body uses to
/// reach the GPU. The graph passes the runtime's own objects, so the body's work lands on
/// the capture stream.
#[diagnostic::on_unimplemented(
    message = "the first parameter of a `#[cuda_graph]` function must borrow the execution context, not `{Self}`",
    label = "expected `&Runtime`, `&Arc<CudaStream>`, `&CudaStream`, or candle's `&Device` (feature `candle`)",
    note = "the graph passes its runtime (or the runtime's stream) here during warmup and capture"
)]
pub trait FromRuntime {
    /// Borrows `Self` out of the runtime.
    fn from_runtime(rt: &Runtime) -> &Self;

    /// [`FromRuntime::from_runtime`] for contexts a runtime may lack (candle's `Device` on a
    /// runtime not made from one): what the generated code calls.
    fn try_from_runtime(rt: &Runtime) -> Result<&Self, GraphError> {
        Ok(Self::from_runtime(rt))
    }
}

/// candle's device as a body's context: the device of a runtime made by
/// [`Runtime::from_candle`].
#[cfg(feature = "candle")]
impl FromRuntime for candle::candle_core::Device {
    /// # Panics
    /// On a runtime not made by [`Runtime::from_candle`]; the generated code calls
    /// [`FromRuntime::try_from_runtime`], which returns [`GraphError::NoCandleDevice`] instead.
    fn from_runtime(rt: &Runtime) -> &Self {
        Self::try_from_runtime(rt).expect("the runtime was not made by Runtime::from_candle")
    }

    fn try_from_runtime(rt: &Runtime) -> Result<&Self, GraphError> {
        candle::device_of(rt)
    }
}

/// candle's CUDA device as a body's context (see the `Device` implementation).
#[cfg(feature = "candle")]
impl FromRuntime for candle::candle_core::CudaDevice {
    /// # Panics
    /// As for candle's `Device`.
    fn from_runtime(rt: &Runtime) -> &Self {
        Self::try_from_runtime(rt).expect("the runtime was not made by Runtime::from_candle")
    }

    fn try_from_runtime(rt: &Runtime) -> Result<&Self, GraphError> {
        candle::cuda_device(candle::device_of(rt)?)
    }
}

impl FromRuntime for Runtime {
    fn from_runtime(rt: &Runtime) -> &Self {
        rt
    }
}

impl FromRuntime for Arc<CudaStream> {
    fn from_runtime(rt: &Runtime) -> &Self {
        rt.stream()
    }
}

impl FromRuntime for CudaStream {
    fn from_runtime(rt: &Runtime) -> &Self {
        rt.stream()
    }
}
