//! NCCL collectives captured into graphs on every rank (feature `nccl`).
//!
//! Tensor-parallel inference and data-parallel training launch a collective after every
//! few kernels, and every rank waits for the slowest: launch overhead and host syncs cost
//! more on several GPUs than on one. This module lets a `#[cuda_graph]` body issue NCCL
//! collectives (all-reduce, all-gather, reduce-scatter, broadcast) on the runtime's
//! stream; each rank captures the same graph, and a replay on every rank runs compute and
//! communication with one launch per rank. The collectives are NCCL's, through cudarc.
//!
//! ```no_run
//! use graph_runtime::cudarc::driver::CudaSlice;
//! use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp};
//! use graph_runtime::{cuda_graph, GraphError, Runtime};
//!
//! #[cuda_graph(warmup = 2)]
//! fn row_parallel(
//!     rt: &Runtime,
//!     x: &CudaSlice<f32>,
//!     #[state] comm: &Communicator,       // the graph borrows the communicator
//!     y: &mut CudaSlice<f32>,
//! ) -> Result<(), GraphError> {
//!     rt.stream().memcpy_dtod(x, y)?;       // … this rank's partial result …
//!     comm.all_reduce_in_place(y, ReduceOp::Sum)?; // … summed over the ranks
//!     Ok(())
//! }
//!
//! # fn main() -> Result<(), GraphError> {
//! let group = CommGroup::new(2)?;            // loads NCCL, makes the unique id
//! let sums = group.run(&[0, 1], |comm| {     // one thread per GPU, each with its Runtime
//!     let rt = comm.runtime();
//!     let x = rt.stream().clone_htod(&vec![comm.rank() as f32 + 1.0; 1024])?;
//!     // Every rank captures together: the ranks compare their collectives before any
//!     // rank instantiates its graph.
//!     let mut graph = comm.capture(|| RowParallelGraph::capture(rt, &x, comm, 1024))?;
//!     let y = rt.stream().clone_dtoh(graph.replay(&x)?.y)?;
//!     Ok(y[0])
//! })?;
//! assert_eq!(sums, vec![3.0, 3.0]);
//! # Ok(()) }
//! ```
//!
//! # Design
//! * **One thread per GPU, one process.** Each rank has its own [`Runtime`](crate::Runtime)
//!   (context, capture stream, cuBLAS, kernels) and its own thread, which joins the group
//!   and then issues, captures and replays. One thread driving every GPU cannot work with
//!   graphs: a capture runs eager warmup runs first, and the warmup of rank 0 would wait on
//!   the GPU for rank 1's collectives, which that same thread has not issued yet (NCCL
//!   would need every rank's calls between `ncclGroupStart`/`ncclGroupEnd`, which a
//!   capture procedure cannot span). NCCL also documents that one thread launching the
//!   graphs of several GPUs can deadlock in `cudaGraphLaunch`, and that several threads
//!   need CUDA's thread-local capture mode, the runtime's default. A thread per rank also
//!   spreads the host work of launching over cores, and maps one-to-one onto the process
//!   per GPU of multi-node jobs (see "Ranks in several processes").
//! * **Set-up outside any capture.** [`CommGroup::new`] (once, before the ranks start)
//!   loads NCCL, checks its version and makes the communicator's unique id;
//!   [`CommGroup::join`] (on each rank's thread, with its runtime) waits for all ranks,
//!   refuses two ranks on one device and calls `ncclCommInitRank`. [`CommGroup::run`] does
//!   all of it: a thread per device, a runtime, a join, your closure.
//! * **Collectives are methods of [`Communicator`]** and run on the runtime's stream, the
//!   stream every warmup, capture and replay uses. A body takes the communicator as
//!   `#[state] comm: &Communicator`: the graph borrows it, so it cannot be destroyed while
//!   a graph that recorded its collectives lives. Buffer lengths and devices are checked
//!   before NCCL sees them ([`CollectiveError::Shape`], [`CollectiveError::WrongDevice`]).
//! * **Ranks capture together**: [`Communicator::capture`] wraps the `FooGraph::capture`
//!   call on every rank (see "How the ranks stay together").
//!
//! # Finding libnccl
//! cudarc loads NCCL when it is first used, by the names it derives from `nccl`:
//! `libnccl.so`, then
//! `libnccl.so.13`, `.12`, … (for a CUDA 13 build), searched by the dynamic loader
//! (`LD_LIBRARY_PATH` as the process started, the `ldconfig` cache, the system
//! directories). There is no environment variable of its own. NCCL's runtime package and
//! PyTorch's wheel install the library as `libnccl.so.2` only (on the GPU machine:
//! `/usr/lib/x86_64-linux-gnu/libnccl.so.2`, and in PyTorch's
//! `site-packages/nvidia/nccl/lib/`), which cudarc does not try; only the development
//! package adds a `libnccl.so` link. cudarc panics when it finds nothing, so the runtime
//! probes first ([`nccl_available`]) and [`CommGroup::new`] returns
//! [`CollectiveError::LibraryMissing`]: the names tried, the `libnccl.so.2` copies it can
//! see, and the fix, a directory holding a `libnccl.so` link on `LD_LIBRARY_PATH` before
//! the program starts:
//!
//! ```sh
//! mkdir -p ~/.cache/nccl-lib
//! ln -sf /usr/lib/x86_64-linux-gnu/libnccl.so.2 ~/.cache/nccl-lib/libnccl.so
//! LD_LIBRARY_PATH=$HOME/.cache/nccl-lib:$LD_LIBRARY_PATH ./my-program
//! # or, from this repository: bash scripts/with-nccl.sh ./my-program
//! ```
//!
//! The NCCL version of cudarc's bindings is left to your binary: this crate asks cudarc for
//! `nccl-version-from-build-system`, which reads `nccl.h` (`NCCL_HOME`, the CUDA paths) or,
//! without one, takes cudarc's newest bindings. A binary that pins a version through cudarc
//! (its `nccl` feature is the newest bindings, 2.30 in cudarc 0.19) builds beside it when
//! the version found is the same one; on a machine whose `nccl.h` is another version, pin
//! the same version through both, or build where no `nccl.h` is found. The runtime needs at
//! least [`MIN_NCCL`] at run time and calls only functions every later version has.
//!
//! # Inside a body
//! [`all_reduce`](Communicator::all_reduce), [`all_reduce_in_place`](Communicator::all_reduce_in_place),
//! [`all_gather`](Communicator::all_gather), [`reduce_scatter`](Communicator::reduce_scatter)
//! and [`broadcast`](Communicator::broadcast) behave by phase:
//!
//! | phase | what a collective does |
//! | --- | --- |
//! | eager (a plain call of the function) | runs, as NCCL would |
//! | warmup run (inside `comm.capture`) | meets the other ranks on the host, compares, then runs |
//! | capture (inside `comm.capture`) | is recorded into the graph, and into the list compared before instantiation |
//! | replay | runs on every rank, in the order captured |
//!
//! Collectives run on the runtime's stream only: no collective takes a stream, so none can
//! be left on a side stream. To overlap communication with compute, put the compute on a
//! [`Runtime::fork`](crate::Runtime::fork) side branch and issue the collective on the
//! main stream inside the fork's closure; the fork rejoins before it returns. (cudarc's own
//! `nccl::Comm` can issue collectives on any stream; inside a body that is unchecked: a
//! collective on a stream that is not joined back fails the capture with CUDA error 904,
//! one on a stream that is not captured runs once and never on replay.)
//!
//! # The one-shot all-reduce
//! Most all-reduces of tensor-parallel decoding are a few KiB to a few hundred KiB, where
//! NCCL's cost is protocol, not bandwidth. When every rank is a thread of this process and
//! every pair of GPUs can access each other's memory (NVLink or PCIe peer access), the
//! group sets up a one-shot all-reduce at join: [`Communicator::all_reduce`] and
//! [`Communicator::all_reduce_in_place`] of `f32` or `bf16` with [`ReduceOp::Sum`], up to
//! [`CommGroup::one_shot_limit`] bytes ([`DEFAULT_ONE_SHOT_LIMIT`], 256 KiB), run as one
//! kernel per rank that writes the input into every peer's memory with the call's number
//! beside each 4 bytes (so the data is its own arrival flag), and sums every rank's copy in
//! rank order: 6.4–6.9 µs per all-reduce of 4–64 KiB in a graph on two H200s, where NCCL's
//! takes 10.6–11.6 µs. Everything else goes to NCCL. What it keeps:
//!
//! * the ranks' results are bitwise equal (every rank sums in the same order), and eager
//!   calls, warmup runs and replays compute the same bits; with two ranks they equal
//!   NCCL's bit for bit (`a + b` either way);
//! * it replays like any kernel: its call counter lives on the device, so one graph serves
//!   every replay, between eager calls of the same communicator;
//! * it cannot hang: a kernel whose peers never come gives up after the group's timeout,
//!   writes NaN to its output and logs an error when the communicator drops (NCCL would
//!   wait forever);
//! * a communicator's drop waits (up to twice the timeout, longer than a peer's kernel
//!   waits) until every rank has drained its stream before freeing the memory the peers
//!   write into; a rank that never comes leaves that memory allocated, with a warning.
//!
//! `group.set_one_shot_limit(0)` before the ranks join turns it off.
//! `examples/24-allreduce-floor.rs` measures it against NCCL and PyTorch.
//!
//! # Symmetric buffers
//! NCCL 2.27 and newer can run a collective with *symmetric kernels* when its buffers lie in
//! memory every rank registered together as a symmetric window: each rank then reads and
//! writes the others' copies directly over NVLink instead of staging through NCCL's own
//! buffers, which matters most for the small all-reduces of tensor-parallel decoding.
//! [`Communicator::symmetric_buffer`] makes such memory on every rank (a set-up call, made
//! by every rank in the same order with the same length, outside captures; the ranks
//! compare sizes on the host first) and returns a [`SymmetricBuffer`], which every
//! collective takes like a `CudaSlice` and a graph takes as `#[state]`. Write into it from
//! your kernels (or copy an input in) inside the body, and reduce it there:
//!
//! ```ignore
//! #[cuda_graph(warmup = 2)]
//! fn reduce(rt: &Runtime, x: &CudaSlice<f32>, #[state] comm: &Communicator,
//!           #[state(no_restore)] send: &mut SymmetricBuffer<f32>,
//!           #[state(no_restore)] recv: &mut SymmetricBuffer<f32>,
//!           y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
//!     rt.stream().memcpy_dtod(x, send)?;
//!     comm.all_reduce(send, recv, ReduceOp::Sum)?;
//!     rt.stream().memcpy_dtod(recv, y)?;
//!     Ok(())
//! }
//! ```
//!
//! NCCL keeps a window until the communicator is destroyed (deregistering one earlier is a
//! collective of its own), so a dropped buffer's memory returns to the system when the
//! communicator drops. `examples/24-allreduce-floor.rs` measures what the windows give.
//!
//! # How the ranks stay together
//! NCCL matches collectives by their order alone: if rank 1 captures one more all-reduce
//! than rank 0, both graphs wait forever on their first replay. So
//! [`Communicator::capture`] runs the capture on every rank as a session, and the ranks
//! meet on the host (a mutex and condition variable shared by the threads: never a
//! collective, which could itself hang) at these points, each with a timeout
//! ([`CommGroup::set_timeout`]):
//!
//! 1. before each collective of a warmup run (warmup runs execute their collectives: a
//!    disagreement must stop the ranks before one of them waits on the GPU);
//! 2. after each capture ends and before it is instantiated, with the whole list of
//!    recorded collectives (operation, element type, count, root, group);
//! 3. when `comm.capture` ends, so that a rank keeps its graphs only if every rank did.
//!
//! # Failure modes
//! | failure | what happens |
//! | --- | --- |
//! | ranks capture different sequences of collectives | [`CollectiveError::Mismatch`] on every rank before instantiation, naming the first differing collective (position, both ranks' versions and lines) |
//! | ranks issue different collectives in a warmup run | the same error, before the differing collective is issued |
//! | a rank's capture fails (error or panic) while the others wait | it posts its failure; the others stop at their next meeting with [`CollectiveError::PeerFailed`] naming it and its error |
//! | a rank never arrives (stuck, or never calls `comm.capture`) | [`CollectiveError::Timeout`] after [`CommGroup::timeout`], naming the missing ranks; later arrivals get `PeerFailed` at once |
//! | a graph with collectives captured without `comm.capture` | [`CollectiveError::OutsideCapture`] at the first collective |
//! | a collective on an unjoined side stream | no API issues one (see "Inside a body") |
//! | a collective in a body captured on another runtime than the communicator's | [`CollectiveError::NotOnCaptureStream`] (it would run once, at capture) |
//! | an eager collective while the rank's stream is captured by another thread | [`CollectiveError::EagerDuringCapture`] (it would be recorded into that graph) |
//! | graph and eager collectives mixed on one communicator | allowed in one order on one stream (see below); with `NCCL_GRAPH_MIXING_SUPPORT=0`, an eager collective after a capture is [`CollectiveError::GraphMixingDisabled`] |
//! | `mode = "global"` capture with collectives | [`CollectiveError::GlobalCaptureMode`]: with a thread per GPU it fails the other ranks' CUDA calls |
//! | a communicator dropped while a graph recorded its collectives | does not compile: the graph borrows it (ui case `fail-nccl/communicator-outlived-by-graph.rs`) |
//! | two ranks on one GPU | [`CollectiveError::DuplicateDevice`] at join |
//! | ranks ask for symmetric buffers of different sizes (or one asks while another is at a barrier) | [`CollectiveError::Mismatch`] on every rank, before NCCL's registration |
//! | one rank cannot allocate its part of a symmetric buffer | [`CollectiveError::SymmetricAlloc`] on every rank, before NCCL's registration |
//! | a symmetric buffer asked for inside a capture or warmup run | a compile error in a `#[cuda_graph]` body (rule `collective-setup-in-body`, also `CommGroup::new`, `CommGroup::connect`, `Communicator::from_env` and `comm.barrier()`); [`CollectiveError::SetupInCapture`] where the macro cannot see it (a helper function) |
//! | symmetric buffers with NCCL older than 2.27 | [`CollectiveError::SymmetricUnsupported`] |
//! | a rank skips a one-shot all-reduce the others make | the others give up after the timeout: NaN output, an error logged (no hang) |
//! | a capture that overlaps an eager collective of the previous step | cannot happen: a communicator issues on its runtime's one stream, in program order, and a capture starts after what was queued before it |
//! | one communicator replayed from two streams | cannot happen: collectives take no stream, and a [`Communicator`] is neither `Send` nor `Sync` (moving or sharing it with another thread does not compile: `fail-nccl/communicator-sent-to-another-thread.rs`), so its graphs replay on its thread's stream |
//! | a communicator destroyed before the graphs that use it | does not compile (the graphs borrow it) |
//! | buffer or window registration issued during a capture | [`CollectiveError::SetupInCapture`] ([`Communicator::symmetric_buffer`]) |
//! | a rank's process dies | the others: [`CollectiveError::Timeout`] at their next meeting; their communicators are then aborted, not destroyed, when dropped |
//! | libnccl not found, or too old | [`CollectiveError::LibraryMissing`], [`CollectiveError::LibraryTooOld`] |
//!
//! **Mixing graph and eager collectives.** NCCL treats "captured or not" as a property
//! every rank must share for each collective, and a graph launch as collective over the
//! ranks that captured it together. So: eager collectives between replays are fine, on
//! every rank alike, because a [`Communicator`] stays on its thread and issues on its
//! runtime's one stream, in program order, like the replays. What the runtime cannot see is
//! a rank that replays a graph while another runs the same collectives eagerly (that needs
//! a host exchange per replay): keep the choice between replay and eager call the same on
//! every rank, and agree on data-dependent choices first (all-reduce a flag).
//!
//! What stays NCCL's: a kernel fault on one rank during a replay leaves the others waiting
//! on the GPU; dropping a [`Communicator`] with queued collectives waits up to the timeout,
//! then aborts it (`ncclCommAbort`) instead of destroying it. NCCL connects ranks lazily,
//! at the first collective that needs a connection: a rank whose capture records a
//! collective the others do not, of a kind no warmup run issued, can block inside NCCL
//! while recording it (the other ranks still stop, with [`CollectiveError::Timeout`], at the
//! end of their capture); `NCCL_RUNTIME_CONNECT=0` makes NCCL connect everything at
//! set-up and closes that gap.
//!
//! # Beyond two GPUs
//! **Eight GPUs of one node**: nothing changes. `CommGroup::new(8)` and
//! `group.run(&[0, 1, …, 7], …)`; NCCL picks its rings and trees over NVLink; captures
//! compare eight sequences against rank 0's. Tensor parallelism splits each weight in
//! eight; data parallelism all-reduces over eight. Host launch work stays one thread per
//! GPU.
//!
//! # Ranks in several processes
//! NCCL's own advice for graphs is one GPU per process, and a job that outgrows one host
//! has to start its ranks as processes. [`CommGroup::connect`] makes a group whose ranks
//! are processes, on this host or others; [`Communicator::from_env`] does everything from
//! the variables the usual launchers set ([`Launch`]: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT`, or Open MPI's and Slurm's spellings of the first three):
//!
//! ```no_run
//! use graph_runtime::nccl::Communicator;
//! # fn main() -> Result<(), graph_runtime::GraphError> {
//! let comm = Communicator::from_env()?; // this process's rank, on GPU LOCAL_RANK
//! let rt = comm.runtime();
//! // … capture with comm.capture(|| FooGraph::capture(rt, …)) and replay, as with threads
//! # let _ = rt; Ok(()) }
//! ```
//!
//! ```sh
//! # one host, 4 GPUs:
//! torchrun --nproc-per-node=4 --no-python ./target/release/my-program
//! # two hosts, 8 GPUs each (run on each host; --node-rank 0 on the first):
//! torchrun --nnodes=2 --nproc-per-node=8 --node-rank=$NODE --master-addr=$HOST0 \
//!     --master-port=29500 --no-python ./target/release/my-program
//! # Open MPI or Slurm: export MASTER_ADDR (rank 0's host) and MASTER_PORT first
//! mpirun -np 8 -x MASTER_ADDR -x MASTER_PORT ./target/release/my-program
//! srun --ntasks=8 --gpus-per-task=1 ./target/release/my-program
//! ```
//!
//! Rank 0 serves a small key-value store over TCP on `MASTER_PORT` (every rank, rank 0 too,
//! is its client): rank 0 puts NCCL's unique id there, and the ranks meet there for what
//! threads meet on a mutex for: joining, each comparison of a capture session, failures
//! and timeouts. So everything in "How the ranks stay together" and "Failure modes" holds
//! across processes as across threads, with the same errors; a rank whose process died is
//! [`CollectiveError::Timeout`] on the others. Connect the groups of a job in the same
//! order in every process (the n-th group of each process is the same group). What
//! differs: a process holds one rank ([`CommGroup::join`] with its own rank;
//! [`CommGroup::run`] is for threads), the one-shot all-reduce is off (it reads the peers'
//! memory, which is not mapped into another process), and the store's keys are never
//! deleted (a few hundred bytes per capture session). The store listens on every interface
//! without authentication, like PyTorch's `TCPStore`: keep `MASTER_PORT` inside the
//! cluster's network.

pub(crate) mod collective;
mod comm;
mod library;
mod one_shot;
mod process;
mod raw;
mod rendezvous;
pub(crate) mod sequence;
pub(crate) mod session;
mod store;
mod window;
mod wire;

pub use crate::error::CollectiveError;
pub use comm::{CommGroup, Communicator, DEFAULT_ONE_SHOT_LIMIT, DEFAULT_TIMEOUT};
pub use cudarc::nccl::NcclType;
pub use library::{nccl_available, NcclVersion, MIN_NCCL};
pub use process::Launch;
pub use sequence::{CallSite, CollectiveCall, CollectiveOp, ReduceOp};
pub use window::{SymmetricBuffer, MIN_NCCL_SYMMETRIC};
