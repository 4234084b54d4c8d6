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
//! | runtime | one device: context, the capture stream, cuBLAS with its workspace, the NVRTC kernel cache; a cheap `Clone` handle that every graph keeps, so a graph cannot outlive it. Made on a device, or on a context or stream you already have (candle's, your own) | [`Runtime`], [`Runtime::from_context`], [`Runtime::from_stream`], [`Runtime::find_by_stream`] |
//! | capture stream | the non-blocking stream that warmup, capture and replay all use; never the legacy default stream | [`Runtime::stream`] |
//! | warmup | `warmup = N` eager runs of the body before capture, so that lazy work (NVRTC, module loads, cuBLAS heuristics, allocations) happens outside the graph | `warmup = N` in the attribute |
//! | capture | recording the body once into a CUDA graph; an error or panic in the body ends the capture and leaves the runtime usable | [`GraphInfo`] |
//! | input (`&T`) | a static device buffer the graph owns; every `replay` checks the new value's shape and fills the buffer: a device source on the runtime's stream through the graph's own first node (one node update, no copy launch), any other source by a copy before the launch | generated `replay`, [`NodeKinds::input_copies`] |
//! | state (`#[state] &T` / `&mut T`) | device data read (or updated) in place by address; borrowed for the graph's lifetime so it cannot be freed or reallocated under the graph; its addresses are recorded at capture and checked at every replay (a buffer swapped behind the borrow is [`GraphError::StateMoved`]; memory the graph addresses but does not hold, such as a framework's workspace, is checked by buffer ID, [`GraphError::ForeignMemoryMoved`]); `&mut` state is snapshotted around the warmup so warmup runs do not change it | [`DeviceState`], `#[derive(DeviceState)]`, generated `FooGraph<'s>` |
//! | owned or shared state | the graph holds its state (by value, or in an `Arc`) instead of borrowing it: `FooGraph<'static>` fits in your own struct | [`StateArg`], [`StateArgMut`], [`Held`], [`HeldMut`] |
//! | output (`&mut T`) | a static device buffer the graph owns; `replay` lends it out until the next replay | generated `FooOutputs<'g>` |
//! | constant (`#[constant] T`) | a host value fixed at capture (plain `Copy` data: device memory goes in state); the graph replays with the captured value | [`GraphConstant`], generated `capture` |
//! | temporaries | buffers the body allocates become graph allocation nodes: fixed addresses for the graph's life, freed inside the graph | [`GraphInfo::temp_bytes`] |
//! | graph memory pool | where the temporaries of every graph live; graphs of one runtime launch on one stream, so they share its physical memory: the pool holds the largest graph's temporaries, not the sum; dropping the device's last graph with temporaries trims it | [`Runtime::graph_memory`] |
//! | shape buckets | `buckets(batch = [1, 2, 4, 8])`: one graph per batch size, captured largest first, sharing static buffers and the pool; a replay pads to the smallest bucket that fits; `lazy = N` captures each bucket on first use and keeps at most N live (LRU); per-bucket counts in `buckets().stats()` | `buckets(...)` in the attribute, generated `FooBuckets` |
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
//! | eager islands | `rt.eager(\|\| { … })?;` in a body: the graph stops there for host code of yours (a host read, a sampler, a shape known only on the host, a call that cannot be captured, a cache grown by concatenation) and goes on in the next segment; each segment is its own graph, a replay launches them in order and runs the islands' code between them; what crosses an island is checked at compile time | [Eager islands](#eager-islands), `#[island]` state, [`GraphError::Island`] |
//! | capture checks | what `#[cuda_graph]` rejects in a body at compile time (syncs, host reads, new streams, host effects, …) and the opt-in `host_effects_not_replayed` | [`coverage`] |
//!
//! # What the macro generates
//! Next to `fn step` (kept as written, callable eagerly), `#[cuda_graph]` adds to your module,
//! with the function's visibility (`#[cuda_graph(name = DecodeStep)]` makes the names start
//! with `DecodeStep` instead of `Step`, when `StepState` or another is taken):
//!
//! | item | what it is |
//! | --- | --- |
//! | `StepGraph<'s>` | the captured graph: `StepGraph::capture(&rt, …)` (inputs by example value, outputs by shape, state, constants, in the function's order), `replay(…)` (the inputs) and `verify(…, tolerance)`; through `Deref`, `launch()`, `inputs_mut()`, `outputs()`, `state_mut()`, `info()`, `graph()`; `Debug` and `Display` (the graph's summary); `StepGraph::WARMUP` |
//! | `StepInputs<'g>` | the static inputs lent by `inputs_mut()`, one field per input |
//! | `StepOutputs<'g>` | what `replay` and `launch` return: one field per output (and `result` for a returned value), borrowed until the next replay |
//! | `StepState<'g>` | the state lent by `state_mut()`, one field per state parameter |
//! | `StepBuckets<'s>`, `StepBucketOutputs<'g>`, `StepBucketState<'g>` | instead of the four above, with `buckets(…)`: the family (`capture`, `replay(…)`, `verify(…, tolerance)`, `BUCKETS`; through `Deref`, `outputs()`, `state_mut()`, `buckets()`; `Debug` and `Display`, each live bucket's graph), its outputs (the valid rows) and its state |
//!
//! The code behind them lives in a module `__cuda_graph_step` (`__StepBody<'s>`, the held
//! state and constants, is the runtime's `__private::GraphBody`, which names the static
//! inputs and outputs as tuples; what `StepGraph` dereferences to is the generic
//! `__private::TypedGraph`, which owns them; a family's, `__private::TypedFamily`, runs the
//! same body). For a `pub` function, `cargo doc` lists the
//! four types where the function is (the module is hidden); for a private one (the usual
//! case in a binary's `main.rs`), `cargo doc --document-private-items` shows them in the
//! module `__cuda_graph_step`, since rustdoc does not inline a private re-export. Or read the
//! table above: every name and method is derived from the function's.
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
//!    NCCL collectives captured on every rank; `24-allreduce-floor`: what one all-reduce
//!    costs inside a graph (NCCL, NCCL over symmetric buffers, the one-shot kernel) against
//!    PyTorch's graphed all-reduce;
//! 10. `12-candle-mlp`, `13-candle-decoder` and `16-candle-llama-decode` (feature
//!     `candle`): candle code as a graph, against candle eager (16: against
//!     candle-transformers' own Llama); `17-candle-bert`, `18-candle-resnet` and
//!     `19-candle-llama-window`: candle-transformers' models as they are, held through
//!     `candle::ModelState`, against candle eager and PyTorch; `25-tensor-parallel-llama`
//!     (features `candle` and `nccl`): a candle Llama split over 1, 2 or 4 GPUs, its
//!     all-reduces and gathers inside one graph per rank, against PyTorch's;
//! 11. `14-decode-loop` and `15-jacobi-solve`: loops that stop on device data inside one
//!     graph launch (`graph_while`): decoding until the end token, iterating until the
//!     residual is small;
//! 12. `21-islands-decoder`, `22-islands-sampler` and `23-islands-compaction`: eager islands
//!     between graphed segments: a KV cache grown by concatenation, a host-side top-p
//!     sampler, a shape known only on the host;
//! 13. `26-bucket-family`: batches that change size served by a family of graphs, one per
//!     bucket, captured on first use; `27-island-sampler`: a host sampler in an eager island
//!     between two graphed segments (both use this crate alone: copy them).
//!
//! # Eager islands
//! A body does not have to be all static. `rt.eager(|| { … })?;`, a statement of its own
//! anywhere in the body (in a loop too, not in a closure), where `rt` is the function's
//! context parameter, is an *island*: host code that every replay runs where the body has it.
//! The body is split there into segments, each captured as its own graph (the segments share
//! the runtime's graph memory pool); a replay launches segment 1, runs island 1's code, launches
//! segment 2, and so on, all on the runtime's stream. Eagerly (the plain function, the warmup,
//! `verify`'s eager run) the island's code simply runs in place.
//!
//! ```no_run
//! # use graph_runtime::cudarc::driver::CudaSlice;
//! # use graph_runtime::{cuda_graph, GraphError, Runtime};
//! # fn top_p(scores: &[f32], rng: &mut Sampler) -> i32 { 0 }
//! #[derive(Clone)]
//! struct Sampler(u64);
//!
//! #[cuda_graph(warmup = 2)]
//! fn step(
//!     rt: &Runtime,
//!     logits: &CudaSlice<f32>,
//!     #[island] rng: &mut Sampler, // state only islands use: any `Clone` type
//!     scores: &mut CudaSlice<f32>,
//!     token: &mut CudaSlice<i32>,
//! ) -> Result<(), GraphError> {
//!     rt.stream().memcpy_dtod(logits, &mut *scores)?; // segment 1 (graphed)
//!     rt.eager(|| {
//!         // island: anything goes, on every replay
//!         let host = rt.stream().clone_dtoh(&scores)?;
//!         rt.stream().memcpy_htod(&[top_p(&host, rng)], &mut token)?;
//!         Ok(())
//!     })?;
//!     // segment 2 (graphed): kernels that read `token` on the device
//!     Ok(())
//! }
//! # fn main() {}
//! ```
//!
//! Inside an island the body checks are lifted (syncs, device reads, prints, host randomness,
//! shapes that change from call to call, calls that cannot be captured); in the segments they
//! all apply. What the island's code may touch is checked at compile time:
//!
//! - it sees the function's parameters by name: inputs and read-only state by `&`, outputs and
//!   `&mut` state as their `DeviceState::Lent` views (written into, never replaced: `y = …` or
//!   `*kv = …` in an island is an error), `#[island]` state by `&mut`, constants by value;
//! - it takes copies of the body's host values (a count, a layer index, a kernel handle: the
//!   closure is `move` and kept by the graph); device data of the body (a temporary
//!   `CudaSlice`, a `Tensor`) is refused;
//! - a local of the body made before an island and used after it, by a later segment, must be
//!   a host value: a temporary of an earlier segment is device data the later segment's graph
//!   does not own, and is refused (keep it in an output or `#[state]`);
//! - `#[island]` state is for islands only: a segment that uses it does not compile (a replay
//!   does not run the segments' Rust code). The warmup's changes to it are undone by cloning,
//!   and `verify` undoes its eager run's changes before the replay.
//!
//! What a replay costs above the islands' own host time is one graph launch per segment
//! (`21-islands-decoder` measures it). `graph.segments()` are the segments' [`Graph`]s
//! (`info()`, `write_dot`), `graph.islands()` where the islands are, and the graph's `Display`
//! lists the segments with the islands between them. An island that fails on a replay is
//! [`GraphError::Island`], naming it; the segments after it are not launched, and the graph
//! stays usable. `verify` and `check_determinism` compare across islands (segment by
//! segment); in a bucket family each bucket's graph has its segments, its islands seeing the
//! bucket's rows. Islands are not available inside `graph_while` / `graph_if` bodies and
//! forks ([`GraphError::IslandMisuse`] at run time, an error at compile time where the macro
//! sees it).
//!
//! # Feature flags
//! No feature is on by default; without any, the crate builds on a machine with no GPU and
//! no CUDA toolkit.
//!
//! | feature | what it adds | what it needs |
//! | --- | --- | --- |
//! | `nccl` | `graph_runtime::nccl`: NCCL all-reduce, all-gather, reduce-scatter and broadcast inside a body, captured on every rank (errors as `GraphError::Collective`) | at run time, libnccl 2.14 or newer loadable as `libnccl.so`; the NCCL version of cudarc's bindings is your binary's (from `nccl.h`, else cudarc's newest) |
//! | `candle` | `graph_runtime::candle` and `Runtime::from_candle`: candle code as a graph, candle's `&Device` as a body's context | nvcc at build time: candle-core's `cuda` feature compiles its kernels and links the CUDA libraries |
//!
//! On docs.rs the pages are built with `nccl` (items marked "Available on crate feature
//! `nccl` only") but not `candle`, which needs nvcc; `cargo doc --features candle` builds
//! them locally.
//!
//! # Debug and release builds
//! Unless the attribute says otherwise, a debug build (`debug_assertions` on) captures every
//! graph twice and compares the two node by node (`check_determinism`), and verifies
//! replays 1, 2, 4, 8, … bitwise against an eager run (`verify = "doubling"`); a release
//! build does neither. The doubling schedule is the net under the compile-time checks: a
//! host value frozen into the graph at capture (a learning rate read from a schedule object,
//! a counter kept in a host struct) or host work a replay skips shows as a
//! [`GraphError::VerifyMismatch`] naming the graph, the output and the replay as soon as it
//! changes an output, for one eager run per doubling of the replay count (20 eager runs over
//! a million replays). A kernel with float atomics sums in a different order on each run, so
//! its verified replays fail in debug builds only: give `verify_tolerance = …` or
//! `verify = "never"` for such a function.
//!
//! # Bring your own context or stream
//! A runtime does not have to own its device. [`Runtime::from_context`] makes one on a
//! context you created (event tracking must be off: the runtime adds a second stream, and
//! cudarc's cross-stream events make a capture fail with CUDA error 905, so this is refused
//! as [`GraphError::EventTracking`] with the fix). [`Runtime::from_stream`] captures and
//! replays on a stream you already use (candle's `CudaDevice::cuda_stream()`), so graphs
//! run in order with the rest of your work and buffers made before the runtime are used as
//! they are. A body whose context parameter is a stream reaches the kernel cache through
//! [`function_for_stream`] / [`Runtime::find_by_stream`].
//!
//! # Without a GPU
//! Everything builds without a GPU, a driver or a CUDA toolkit: cudarc loads libcuda,
//! NVRTC and cuBLAS when they are first used. On a machine without a driver,
//! [`Runtime::new`] returns [`GraphError::NoDriver`] instead of panicking and
//! [`driver_available`] answers without touching CUDA, so a program can say why it
//! cannot run.
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
//! body allocates (graph allocation nodes in the runtime's graph memory pool), and the
//! executable graph itself (`exec_bytes`, measured when the runtime is asked to with
//! [`Runtime::set_measure_executable_memory`]); the state it borrows is yours. Replays allocate
//! nothing. Out of memory during a capture is [`GraphError::OutOfMemory`], naming the graph,
//! what it was allocating and the free memory, and the runtime stays usable.
//!
//! Temporaries are reported three ways, because adding up allocation sizes misleads:
//! * `temp_requested_bytes`: every allocation of the body added up;
//! * `temp_bytes`: what the graph needs mapped, its own high-water mark (CUDA reuses the
//!   addresses of a temporary freed earlier in the graph, so this is often far less);
//! * `pool_added_bytes` and `pool_shared_bytes`: how much of that the runtime's graph memory
//!   pool had to map anew when the graph was uploaded, and how much it already held for the
//!   runtime's other graphs (graphs of one runtime run one after another and share that
//!   memory; the pool holds what the largest needs, not the sum).
//!
//! [`GraphInfo::device_bytes`] adds up what keeping the graph costs the device:
//! static buffers, what its upload added to the pool, the executable graph. While it
//! captures, a graph with `&mut` state also holds a snapshot of that state
//! (`state_snapshot_bytes`), freed once the capture ends. The pool's live figures are
//! [`Runtime::graph_memory`].
//!
//! ## Sizing memory (a KV cache, say)
//! Capture first, size what is left afterwards. To learn what a set of graphs will cost
//! before deciding how large to make a cache, capture them as probes against a small cache
//! (the graphs' temporaries do not depend on the cache's length when the body writes the
//! cache in place), read their figures, drop them, and capture for real:
//!
//! ```ignore
//! use graph_runtime::GRAPH_MAP_GRANULE;
//! rt.set_measure_executable_memory(true); // exec_bytes too, for 8-60 µs a capture
//! let probes = [DecodeGraph::capture(&rt, &tokens_1, &small_cache)?,
//!               DecodeGraph::capture(&rt, &tokens_8, &small_cache)?];
//! // Graphs of one runtime share the pool: the largest `temp_bytes` is what all of them need,
//! // mapped by the driver in 32 MiB granules; the static buffers and executables add up.
//! let pool = probes.iter().map(|g| g.info().temp_bytes).max().unwrap_or(0);
//! let pool = pool.next_multiple_of(GRAPH_MAP_GRANULE);
//! let own: usize = probes
//!     .iter()
//!     .map(|g| g.info().static_bytes + g.info().exec_bytes.unwrap_or(0))
//!     .sum();
//! // A capture's warmup runs the body eagerly first: its temporaries are allocated then
//! // too, beside the pool, and stay cached by CUDA's stream-ordered allocator.
//! let warmup = probes.iter().map(|g| g.info().temp_requested_bytes).max().unwrap_or(0);
//! let snapshot = probes.iter().map(|g| g.info().state_snapshot_bytes).max().unwrap_or(0);
//! drop(probes); // dropping the last graph with temporaries gives the pool back
//! rt.set_measure_executable_memory(false);
//! // A capture refuses temporaries that would leave less than one granule free.
//! let headroom = 2 * GRAPH_MAP_GRANULE;
//! let (free, _) = rt.mem_info()?;
//! let for_cache = free - pool - own - warmup - snapshot - headroom;
//! ```
//!
//! `snapshot` matters only while capturing with `&mut` state: opt out with
//! `#[state(no_restore)]` when the warmup does not need undoing. The pool is kept while any
//! graph with temporaries lives on the device: between two replays CUDA counts a graph's
//! temporaries as unused, and giving them back would make its next replay map them again
//! ([`Runtime::trim_graph_memory`] gives the pool back only when no such graph is left).
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
//! * Captures record on a capture stream of the runtime's own, so a runtime shared by threads
//!   keeps working for the others while one thread captures: their replays, reads and drops
//!   are never recorded into its graph (see [`Runtime`], "Threads"). A replay inside a body
//!   (on the capturing thread) is refused ([`GraphError::StreamCapturing`]); the check costs
//!   one atomic load per replay.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations)]

pub use cudarc;
pub use graph_macros::{cuda_graph, graph_helper};
/// The `half` crate, whose `f16` and `bf16` are the 16-bit element types generators fill.
pub use half;

mod buckets;
mod buffer;
#[cfg(feature = "candle")]
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
pub mod candle;
mod capture;
pub mod conditional;
mod constant;
mod driver;
mod error;
mod fingerprint;
mod foreign;
mod fork;
mod framework;
mod generator;
mod graph;
mod inputs;
pub mod launch;
#[cfg(feature = "nccl")]
#[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
pub mod nccl;
mod phase;
mod recorded;
mod region;
mod report;
pub mod rng;
mod runtime;
mod site;
mod snapshot;
pub mod state;
mod timer;
mod typed;
pub mod verify;
mod watchdog;

#[doc(hidden)]
pub mod __private;

/// The crate's README (its page on a registry), compiled as doc tests so that its first
/// program stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Coverage of known CUDA-graph failures: what the types, the macro and the runtime catch.
///
#[doc = include_str!("coverage.md")]
pub mod coverage {}

/// Your word, for one statement of a `#[cuda_graph]` body, that it **does on every replay
/// what it did at capture**, so that the compile-time capture checks do not look into it.
///
/// The checks see tokens, not types: a method of your own named like a CUDA operation
/// (`self.jobs.synchronize()`), a function of your own named like an imported one
/// (`spawn(…)`, `fill(&mut buf)`), a copy into a pinned buffer reached through a field,
/// look to them like the mistakes they exist to catch. Every message that can misfire this
/// way names this macro. It expands to its tokens unchanged, statements or an expression:
///
/// ```no_run
/// use graph_runtime::cudarc::driver::CudaSlice;
/// use graph_runtime::{cuda_graph, replays_as_captured, GraphError, Runtime};
///
/// /// A job queue of yours: its `synchronize` and `query` touch nothing of the GPU.
/// struct Jobs;
/// impl Jobs {
///     fn synchronize(&self) {}
///     fn query(&self, _what: &str) -> Result<usize, GraphError> { Ok(0) }
/// }
/// static JOBS: Jobs = Jobs;
///
/// #[cuda_graph(warmup = 2)]
/// fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
///     rt.stream().memcpy_dtod(x, y)?;
///     replays_as_captured! { JOBS.synchronize(); } // my job queue, not a stream
///     let _rows = replays_as_captured!(JOBS.query("pending"))?;
///     Ok(())
/// }
/// # fn main() {}
/// ```
///
/// What it does not change: a synchronize, a device-to-host read or a query whose receiver
/// is provably CUDA's (the context parameter, `rt.stream()`, a stream bound from it) is
/// still a compile error inside it, since no statement makes those replay as captured; the
/// runtime's own guards still run (a real stream sync the macro cannot see is refused at
/// capture with a typed error); and a host effect inside it still runs only at warmup and
/// capture. Wrap only what you have checked; for host effects you want
/// to run only then, the `host_effects_not_replayed` attribute key says so for the body.
#[macro_export]
macro_rules! replays_as_captured {
    ($($tokens:tt)*) => {
        $($tokens)*
    };
}

/// What `#[cuda_graph]` gives a body in place of the host macros it may reach through a
/// macro of the user's (`println!`, `info!`, …): a compile error with the message it is given.
#[doc(hidden)]
#[macro_export]
macro_rules! __refuse_host_macro {
    ($message:literal) => {
        ::core::compile_error!($message)
    };
}

pub use buckets::{BucketCounts, BucketStats, Buckets};
#[doc(hidden)]
pub use buffer::{InputSource, Staging, StaticBuffer};
pub use conditional::{Compare, Condition, ConditionArg, ConditionValue};
pub use constant::GraphConstant;
pub use error::{BoxError, GraphError, When};
pub use fork::{fork_join, ForkedStream, SideLaunch, SideMut, SideRead, SideRef};
pub use graph::{Graph, GraphInfo, NodeKinds, GRAPH_MAP_GRANULE};
pub use graph_macros::DeviceState;
pub use launch::EarlyLaunch;
pub use phase::{ensure_not_capturing, is_capturing, phase, Phase};
pub use rng::{Generator, RngAdvance, RngKernelArg, RngState};
#[doc(hidden)]
pub use runtime::FromRuntime;
pub use runtime::{
    driver_available, function_for_stream, library_available, GraphMemory, Runtime,
    CUBLAS_WORKSPACE_BYTES,
};
#[doc(hidden)]
pub use site::{CaptureMode, GraphSite};
pub use state::{DeviceRegion, DeviceState, Elem, Held, HeldMut, StateArg, StateArgMut};
pub use timer::GraphTimer;
pub use verify::{Tolerance, VerifyReport};
