//! [`Graph`]: one instantiated CUDA graph bound to the runtime's stream.

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaEvent, CudaStream};

use crate::buffer::Staging;
use crate::conditional::record::CaptureRecord;
use crate::driver;
use crate::error::GraphError;
use crate::foreign::{Addresses, Foreign};
use crate::generator::RngAdvance;
use crate::inputs::InputNode;
use crate::recorded::RecordedGraph;
use crate::runtime::{graphs_with_temporaries, Runtime};

/// Facts about one captured graph, for logs and reports.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GraphInfo {
    /// The annotated function's name.
    pub name: &'static str,
    /// The nodes by kind; [`GraphInfo::nodes`] is their total.
    pub kinds: NodeKinds,
    /// Warmup runs before the capture.
    pub warmup: u32,
    /// Time spent in the warmup runs, including the synchronize after them.
    pub warmup_time: Duration,
    /// Time between beginning and ending the capture.
    pub capture_time: Duration,
    /// Time to inspect, instantiate and upload the graph.
    pub instantiate_time: Duration,
    /// The part of `instantiate_time` spent reading the recorded graph's nodes (their kinds,
    /// the temporaries' sizes, the copies' endpoints) before instantiating it.
    pub inspect_time: Duration,
    /// The part of `instantiate_time` spent in `cuGraphUpload` (mapping the temporaries and
    /// handing the executable graph to the device, so that the first replay does not).
    pub upload_time: Duration,
    /// Time the optional capture checks took (`check_determinism`: a second capture and the
    /// comparison); zero when they are off.
    pub checks_time: Duration,
    /// How far each replay moves the generators the body draws from (measured on the
    /// warmup runs; the graph itself moves them on the device).
    pub rng: Vec<RngAdvance>,
    /// The graph's own high-water mark of temporaries: the bytes of the address ranges its
    /// allocation nodes occupy, counted once where they overlap. CUDA gives a temporary the
    /// addresses of one freed earlier in the same graph, so this is what the graph needs
    /// mapped in the runtime's graph memory pool, and at most `temp_requested_bytes`.
    pub temp_bytes: usize,
    /// The sizes of all the temporaries the body allocates, added up (graph allocation
    /// nodes). More than the graph needs whenever the body frees a temporary before it
    /// allocates the next: size memory by `temp_bytes` and `pool_added_bytes`.
    pub temp_requested_bytes: usize,
    /// Physical memory the runtime's graph memory pool gained when this graph was uploaded
    /// (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT` after the upload, less before): what its
    /// temporaries cost the device beyond what the pool already held. Graphs of one runtime
    /// launch one after another on its stream, so CUDA backs their temporaries with the same
    /// physical memory: the second of two equal graphs adds 0. A device-wide reading: pool
    /// memory mapped by another thread at the same moment counts too.
    pub pool_added_bytes: usize,
    /// The part of `temp_bytes` that memory the pool already held covered: shared with the
    /// runtime's other graphs (`temp_bytes - pool_added_bytes`, 0 when the upload added
    /// at least `temp_bytes`, as the first graph's does).
    pub pool_shared_bytes: usize,
    /// What the runtime's graph memory pool held after this graph's upload, for all graphs
    /// of the device (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`): see
    /// [`Runtime::graph_memory`](crate::Runtime::graph_memory) for the live figures.
    pub pool_reserved_bytes: usize,
    /// Device memory of the executable graph itself (its nodes, kernel parameters, the
    /// driver's bookkeeping): the fall in the device's free memory (`cuMemGetInfo`) over
    /// instantiate and upload, less `pool_added_bytes`. Measured only on a runtime that
    /// asks for it ([`Runtime::set_measure_executable_memory`](crate::Runtime::set_measure_executable_memory):
    /// the driver has no figure for it, and the two readings cost tens of µs a capture);
    /// `None` otherwise. The driver hands memory out in pages of 2 MiB, so a small graph
    /// reads 0 or one page. A device-wide reading, like `pool_added_bytes`.
    pub exec_bytes: Option<usize>,
    /// Bytes of the static input and output buffers the graph type owns.
    pub static_bytes: usize,
    /// Programmatic edges: dependencies that let a kernel start while the one before it
    /// finishes, recorded from [early launches](crate::launch). 0 when the body launched
    /// every kernel in order.
    pub early_edges: usize,
    /// Bytes of the device snapshot of `&mut` state taken before the warmup and restored
    /// after it (freed once the graph is captured); 0 when no `&mut` state is restored.
    pub state_snapshot_bytes: usize,
    /// Allocations the graph's nodes address that the graph does not hold (neither its
    /// temporaries, its state nor its static inputs: its outputs, the runtime's buffers, a
    /// framework's own buffers such as candle's quantized-matmul workspace, weights read
    /// through a `ModelState` that does not list them). Each is checked before every replay
    /// (one driver query) and a freed or reallocated one refuses the replay with
    /// [`GraphError::ForeignMemoryMoved`](crate::GraphError::ForeignMemoryMoved).
    pub foreign_buffers: usize,
}

impl GraphInfo {
    /// Nodes in the captured graph (kernels, copies, memsets, allocations, …).
    pub fn nodes(&self) -> usize {
        self.kinds.total()
    }

    /// What keeping this graph costs the device: its static buffers, what its upload added
    /// to the graph memory pool, and the executable graph's own memory. The state it
    /// borrows is yours and not counted; the state snapshot was freed after the capture.
    ///
    /// The figure for a capture at the current pool: a graph captured after a larger one of
    /// the same runtime adds little or nothing to the pool. For the most a graph can cost
    /// on its own, capture it first (or alone: see "Sizing memory" in the crate docs).
    ///
    /// `exec_bytes` counts only where it was measured (see its docs).
    pub fn device_bytes(&self) -> usize {
        self.static_bytes + self.pool_added_bytes + self.exec_bytes.unwrap_or(0)
    }
}

/// How many nodes of each kind a captured graph holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeKinds {
    /// Kernel launches of the body (cuBLAS calls are kernels too).
    pub kernels: usize,
    /// The kernels that copy new inputs into the static buffers, one per input (see
    /// `replay`): not counted in `kernels`.
    pub input_copies: usize,
    /// Memory copies.
    pub copies: usize,
    /// Memsets (`alloc_zeros`, `memset_zeros`).
    pub memsets: usize,
    /// Allocations made by the body during capture (graph memory nodes).
    pub allocs: usize,
    /// Frees of those allocations inside the graph.
    pub frees: usize,
    /// Conditional nodes (`graph_while`, `graph_if`, `graph_if_else`; see
    /// [`crate::conditional`]). The nodes of their bodies are counted in the other fields.
    pub conditionals: usize,
    /// Anything else (events, host nodes, child graphs, …).
    pub other: usize,
}

/// An instantiated CUDA graph, launched on the stream it was captured on.
///
/// Generated graph types hold one of these next to their static buffers. It is `Send` but
/// not `Sync`: a graph can move to another thread, but only one thread can launch it at a
/// time (CUDA does not synchronise access to one executable graph).
pub struct Graph {
    exec: sys::CUgraphExec,
    /// Destroyed in `Drop`, after `exec` and before the graph memory is trimmed.
    graph: ManuallyDrop<RecordedGraph>,
    /// Keeps the context, the stream, the loaded kernels and the generators alive for as
    /// long as the graph can be launched.
    rt: Runtime,
    /// Used to order copies from buffers that live on other streams; created once here so
    /// that replay allocates nothing.
    before: CudaEvent,
    after: CudaEvent,
    /// The copy node of each static input (see `crate::inputs`).
    inputs: Vec<InputNode>,
    info: GraphInfo,
    /// Whether some state lives on another stream: then dropping the graph, or lending its
    /// state, first waits for the replays in flight (see [`Graph::settle`]).
    settle: bool,
    /// The graph's allocation nodes (address, bytes) and the addresses its free nodes free
    /// (see [`Graph::memory_nodes`]).
    allocs: Vec<(u64, u64)>,
    frees: Vec<u64>,
    /// Memory the graph addresses and does not hold, checked before every replay.
    foreign: Foreign,
}

// SAFETY: the graph and executable-graph handles may be used from any thread as long as
// calls on them are serialised; `Graph` is not `Sync` and every method that touches the
// handles goes through its single owner, so only one thread uses them at a time. The other
// fields are `Send`.
unsafe impl Send for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Graph {
    /// Instantiates `raw` for the runtime's stream and uploads it.
    ///
    /// Before the driver maps any memory, a graph whose temporaries could not all be mapped is
    /// refused with [`GraphError::OutOfMemory`] (see `refuse_temporaries_that_cannot_fit`). A
    /// failure at any step destroys what was made and gives the graph memory pool's unused
    /// memory back to the device.
    pub(crate) fn instantiate(
        rt: &Runtime,
        raw: RecordedGraph,
        mut info: GraphInfo,
        inputs: Vec<InputNode>,
        record: &CaptureRecord,
    ) -> Result<Self, GraphError> {
        let started = Instant::now();
        // Temporaries the body allocates during capture become allocation nodes; with
        // AUTO_FREE_ON_LAUNCH a relaunch frees any that the body did not free itself, so a
        // leaked temporary cannot make the next replay fail.
        let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let mut baseline = MemoryReading::default();
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        let mut foreign = Foreign::default();
        let built = (|| {
            let inspected = inspect(raw.raw(), info.name, &inputs, info.early_edges > 0, record)?;
            (allocs, frees, foreign) = (inspected.allocs, inspected.frees, inspected.foreign);
            info.inspect_time = started.elapsed();
            info.kinds = inspected.kinds;
            info.temp_bytes = inspected.temp_bytes;
            info.temp_requested_bytes = inspected.temp_requested_bytes;
            info.early_edges = inspected.early_edges;
            baseline = refuse_temporaries_that_cannot_fit(rt, info.name, info.temp_bytes)?;
            let (before, after) = (rt.untimed_event()?, rt.untimed_event()?);
            // SAFETY: `raw` is a live graph of the runtime's context, which the capture bound
            // to this thread; instantiation does not take ownership of it.
            let exec = unsafe { driver::instantiate(raw.raw(), flags) }
                .map_err(|e| GraphError::from_driver(info.name, e))?;
            Ok((exec, before, after))
        })();
        let (exec, before, after) = match built {
            Ok(parts) => parts,
            Err(e) => {
                // No executable graph was made from `raw`: it is destroyed first.
                drop(raw);
                give_back_graph_memory(rt);
                return Err(e);
            }
        };
        // From here on `Drop` owns both handles, also if the upload fails, and counts the
        // graph out of the device's graphs with temporaries.
        if info.temp_bytes > 0 {
            graphs_with_temporaries(rt.context().ordinal()).fetch_add(1, Ordering::AcqRel);
        }
        let mut g = Graph {
            exec,
            graph: ManuallyDrop::new(raw),
            rt: rt.clone(),
            before,
            after,
            inputs,
            info,
            settle: false,
            allocs,
            frees,
            foreign,
        };
        let upload_started = Instant::now();
        // SAFETY: `exec` is a live executable graph and the stream belongs to its context.
        // Uploading maps the graph's temporaries to physical memory now, so an out-of-memory
        // failure surfaces here, at capture, and not at the first replay.
        let uploaded = unsafe { driver::upload(g.exec, rt.stream().cu_stream()) };
        g.info.upload_time = upload_started.elapsed();
        if let Err(e) = uploaded {
            let (name, temp_bytes) = (g.info.name, g.info.temp_bytes);
            drop(g);
            give_back_graph_memory(rt);
            return Err(rt.oom_context(
                GraphError::from_driver(name, e),
                || format!("uploading the graph of `{name}` (its temporaries)"),
                Some(temp_bytes),
            ));
        }
        g.info.read_footprint(rt, baseline);
        g.info.instantiate_time = started.elapsed();
        Ok(g)
    }

    /// The graph's allocation nodes (address, bytes) and the addresses its free nodes free.
    /// What the segments of one capture allocate and none of them frees is kept past the body:
    /// a relaunch frees it (the graphs are instantiated with AUTO_FREE_ON_LAUNCH) and
    /// allocates it again at the same address, so anything that holds it (state replaced
    /// inside the body, a model's own cache, a static) points at memory the next replay frees.
    pub(crate) fn memory_nodes(&self) -> (&[(u64, u64)], &[u64]) {
        (&self.allocs, &self.frees)
    }

    /// Leaves out of the per-replay check the memory `regions` (address, bytes) cover:
    /// the graph's state, the temporaries of the other segments of its capture.
    pub(crate) fn held_elsewhere(&mut self, regions: impl IntoIterator<Item = (u64, u64)>) {
        self.foreign.exempt(regions);
        self.info.foreign_buffers = self.foreign.len();
    }

    /// Facts about the capture: node count, memory and timings.
    pub fn info(&self) -> &GraphInfo {
        &self.info
    }

    /// The runtime this graph was captured on (the graph keeps it alive).
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// The stream this graph launches on (the runtime's stream).
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.rt.stream()
    }

    /// The graph's stream and ordering events, for copies queued outside a replay (a bucket
    /// family's eager fallback) without creating events each time.
    pub fn staging(&self) -> Staging<'_> {
        Staging::new(self.rt.stream(), &self.before, &self.after)
    }

    /// The recorded CUDA graph, for driver calls this crate does not wrap (reading its nodes,
    /// writing it out, instantiating it again with other flags).
    ///
    /// The handle stays owned by this `Graph`: do not destroy it, and do not use it after the
    /// `Graph` is dropped.
    pub fn cu_graph(&self) -> sys::CUgraph {
        self.graph.raw()
    }

    /// The executable graph, for driver calls this crate does not wrap.
    ///
    /// The handle stays owned by this `Graph`: do not destroy it, do not use it after the
    /// `Graph` is dropped, and do not launch it while another thread launches this `Graph`.
    pub fn cu_graph_exec(&self) -> sys::CUgraphExec {
        self.exec
    }

    /// Runs `stage` (which queues the input copies on the graph's stream) and then launches
    /// the graph, both under the stream's capture gate.
    #[inline]
    pub(crate) fn replay_with(
        &self,
        stage: impl FnOnce(&Staging<'_>) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        // Allocation-free and a few nanoseconds when `trace` is not enabled for this crate.
        let _span = tracing::trace_span!("cuda_graph_replay", graph = self.info.name).entered();
        self.rt.gate().launch(self.info.name, || {
            let stream = self.rt.stream();
            stream.context().bind_to_thread()?;
            self.foreign.check(self.info.name)?;
            stage(&self.staging().with_inputs(self.exec, &self.inputs))?;
            // SAFETY: `exec` is a live executable graph owned by `self`, instantiated for
            // this stream's context, which is bound to this thread just above; the context,
            // kernels and generators it uses are kept alive by `self.rt`, and the buffers it
            // addresses by the owner of this `Graph` (a generated graph type, which checks
            // its state's addresses before calling this).
            unsafe { driver::launch(self.exec, stream.cu_stream()) }.map_err(GraphError::from)
        })
    }
}

impl Graph {
    /// Waits for this graph's replays in flight, if its state has buffers on streams other
    /// than the runtime's (decided at capture): the generated `state_mut()` calls it before
    /// it lends such state, and dropping the graph calls it, so that a buffer replaced or
    /// dropped on its own stream is never freed while a replay still reads it. State on the
    /// runtime's stream is freed in stream order after the replays, and this does nothing.
    /// Inside a capture it does nothing either (waiting would end that capture), and while
    /// another thread captures on the same device it waits for that capture to end first.
    pub fn settle(&self) {
        if !self.settle || crate::phase::is_capturing() {
            return;
        }
        // A synchronize would break another thread's capture on this device: wait for it to
        // end first (this thread holds the lock already while it runs a capture procedure).
        let _serial = (!crate::phase::in_procedure()).then(|| self.rt.capture_lock());
        let ctx = self.rt.context();
        ctx.record_err(self.rt.stream().synchronize());
    }

    pub(crate) fn settle_for(&mut self, book: &crate::state::AddressBook) {
        self.settle = book.frees_on_other_streams(self.rt.stream());
    }

    /// The kernels of the body by name, with how many nodes launch each, sorted by count
    /// (then name; the input copy nodes are left out). Reads the graph's nodes from the
    /// driver.
    pub fn kernel_counts(&self) -> Result<Vec<(String, usize)>, GraphError> {
        self.rt.context().bind_to_thread()?;
        let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
        // SAFETY: `self.graph` is the live graph this `Graph` owns.
        for node in unsafe { driver::graph_nodes(self.graph.raw()) }? {
            // SAFETY: `node` belongs to the live graph.
            if unsafe { driver::node_type(node) }?
                != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL
                || self.inputs.iter().any(|i| i.node() == node)
            {
                continue;
            }
            // SAFETY: `node` is a kernel node of the live graph.
            let params = unsafe { driver::kernel_node_params(node) }?;
            // SAFETY: the node's function lives as long as its module, which the runtime
            // keeps loaded.
            let name = unsafe { driver::function_name(params.func) }
                .unwrap_or_else(|| "<unnamed kernel>".to_owned());
            *counts.entry(name).or_default() += 1;
        }
        let mut counts: Vec<(String, usize)> = counts.into_iter().collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(counts)
    }

    /// Writes the graph as Graphviz DOT to `path` (CUDA's own rendering of the nodes and
    /// edges; `verbose` adds every node's parameters). Render it with `dot -Tsvg`.
    pub fn write_dot(
        &self,
        path: impl AsRef<std::path::Path>,
        verbose: bool,
    ) -> Result<(), GraphError> {
        let path = path.as_ref();
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            GraphError::User(format!("the path {} contains a NUL byte", path.display()).into())
        })?;
        let flags = if verbose {
            sys::CUgraphDebugDot_flags::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE as u32
        } else {
            0
        };
        self.rt.context().bind_to_thread()?;
        // SAFETY: `self.graph` is the live graph this `Graph` owns.
        unsafe { driver::debug_dot_print(self.graph.raw(), &c_path, flags) }?;
        Ok(())
    }
}

/// A compact summary: nodes by kind, kernels by name with counts, edges, memory, timings.
///
/// ```text
/// graph `decode` · 183 nodes: 179 kernels, 2 copies, 0 memsets, 1 alloc, 1 free, 0 other
///   edges: 182, early-launch (programmatic) 16
///   kernels: matvec ×96, rmsnorm ×33, rope_kv ×16, attention ×16, …
///   memory: temporaries 1.0 MiB (requested 1.5 MiB; pool +2.0 MiB, shared 0 B), static buffers 64 KiB, executable 2.0 MiB, state snapshot 0 B
///   time: warmup 3 runs 2.1 ms, capture 0.4 ms, instantiate 1.2 ms
/// ```
impl std::fmt::Display for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.info;
        let k = &i.kinds;
        writeln!(
            f,
            "graph `{}` · {} nodes: {} kernels, {} input copies, {} copies, {} memsets, {} allocs, {} \
             frees, {} conditionals, {} other",
            i.name,
            i.nodes(),
            k.kernels,
            k.input_copies,
            k.copies,
            k.memsets,
            k.allocs,
            k.frees,
            k.conditionals,
            k.other
        )?;
        let edges = {
            let _ = self.rt.context().bind_to_thread();
            // SAFETY: `self.graph` is the live graph this `Graph` owns.
            unsafe { driver::graph_edges(self.graph.raw()) }
                .map(|e| e.len())
                .unwrap_or(0)
        };
        writeln!(
            f,
            "  edges: {edges}, early-launch (programmatic) {}",
            i.early_edges
        )?;
        match self.kernel_counts() {
            Ok(counts) => {
                const SHOWN: usize = 8;
                let mut names: Vec<String> = counts
                    .iter()
                    .take(SHOWN)
                    .map(|(n, c)| format!("{n} ×{c}"))
                    .collect();
                if counts.len() > SHOWN {
                    names.push(format!("… ({} more)", counts.len() - SHOWN));
                }
                writeln!(f, "  kernels: {}", names.join(", "))?;
            }
            Err(e) => writeln!(f, "  kernels: (could not be read: {e})")?,
        }
        writeln!(
            f,
            "  memory: temporaries {} (requested {}; pool +{}, shared {}), static buffers {}, \
             executable {}, state snapshot {}",
            crate::error::bytes(i.temp_bytes),
            crate::error::bytes(i.temp_requested_bytes),
            crate::error::bytes(i.pool_added_bytes),
            crate::error::bytes(i.pool_shared_bytes),
            crate::error::bytes(i.static_bytes),
            i.exec_bytes
                .map_or_else(|| "not measured".to_owned(), crate::error::bytes),
            crate::error::bytes(i.state_snapshot_bytes)
        )?;
        writeln!(
            f,
            "  memory it does not hold, checked before each replay: {} allocations",
            i.foreign_buffers
        )?;
        write!(
            f,
            "  time: warmup ({} {}) {:.2} ms, capture {:.2} ms, instantiate {:.2} ms",
            i.warmup,
            if i.warmup == 1 { "run" } else { "runs" },
            i.warmup_time.as_secs_f64() * 1e3,
            i.capture_time.as_secs_f64() * 1e3,
            i.instantiate_time.as_secs_f64() * 1e3
        )
    }
}

/// One launch of `graph` with its static inputs as they are (its input copy nodes copy
/// nothing): what a generated `launch` calls after checking its state's addresses.
#[doc(hidden)]
#[inline]
pub fn launch_as_is(graph: &Graph) -> Result<(), GraphError> {
    graph.replay_with(|staging| staging.keep_inputs())
}

/// Queues `stage` (the input copies) and one launch of `graph`: what a generated `replay`
/// calls after checking its inputs' shapes and its state's addresses.
///
/// Not part of the API: a generated graph type is what guarantees that the buffers the graph
/// addresses are still allocated (it owns its static buffers, holds its state and checks its
/// addresses). Calling this directly on a graph taken from one bypasses those checks.
#[doc(hidden)]
#[inline]
pub fn replay(
    graph: &Graph,
    stage: impl FnOnce(&Staging<'_>) -> Result<(), GraphError>,
) -> Result<(), GraphError> {
    graph.replay_with(stage)
}

impl Drop for Graph {
    fn drop(&mut self) {
        let ctx = self.rt.context();
        ctx.record_err(ctx.bind_to_thread());
        // The state is dropped right after the graph; buffers of other streams must not be
        // freed under a replay still running.
        self.settle();
        // Destroying and trimming are device-wide work (a trim gives back the device's graph
        // memory): never while another thread of the process captures on this device, which
        // such a call can invalidate (CUDA error 901). A thread inside its own capture
        // procedure holds the lock already.
        let _serial = (!crate::phase::in_procedure()).then(|| self.rt.capture_lock());
        // SAFETY: the executable graph is owned by `self` and destroyed exactly once, here.
        // CUDA defers the destruction of an executable graph until launches in flight
        // complete.
        ctx.record_err(unsafe { driver::exec_destroy(self.exec) });
        // SAFETY: `self.graph` is taken exactly once, here, and not used afterwards.
        let graph = unsafe { ManuallyDrop::take(&mut self.graph) };
        ctx.record_err(graph.destroy());
        if self.info.temp_bytes > 0 {
            // The last graph with temporaries on the device gives the pool's memory back. A
            // trim while another one lives would unmap that graph's temporaries too (CUDA
            // counts them unused between its replays), and its next replay would map them
            // again.
            let live = graphs_with_temporaries(ctx.ordinal());
            if live.fetch_sub(1, Ordering::AcqRel) == 1 {
                ctx.record_err(driver::graph_mem_trim(ctx.cu_device()));
            }
        }
    }
}

/// The bytes that the graphs whose memory nodes are `lists` (allocations as address and size,
/// and the addresses freed) allocate and do not free: counted over all of them (a temporary
/// may be freed by the segment after an island) and per address (CUDA may give one address
/// to two allocations of a graph whose lives do not overlap).
pub(crate) fn kept_bytes<'a>(
    lists: impl IntoIterator<Item = (&'a [(u64, u64)], &'a [u64])>,
) -> u64 {
    // Per address: allocations less frees, and the last allocation's size.
    let mut live: std::collections::HashMap<u64, (i64, u64)> = std::collections::HashMap::new();
    for (allocs, frees) in lists {
        for &(ptr, len) in allocs {
            let entry = live.entry(ptr).or_insert((0, len));
            *entry = (entry.0 + 1, len);
        }
        for &ptr in frees {
            live.entry(ptr).or_insert((0, 0)).0 -= 1;
        }
    }
    live.values()
        .filter(|&&(count, _)| count > 0)
        .map(|&(count, len)| count as u64 * len)
        .sum()
}

/// A graph's allocation nodes (address, bytes) and the addresses its free nodes free.
pub(crate) type MemoryNodes = (Vec<(u64, u64)>, Vec<u64>);

/// The allocation nodes (address, bytes) of the recorded graph `raw`, and the addresses its
/// free nodes free (its top level: a conditional body allocates nothing).
///
/// # Safety
/// `raw` is a live graph.
pub(crate) unsafe fn recorded_memory_nodes(raw: sys::CUgraph) -> Result<MemoryNodes, GraphError> {
    let (mut allocs, mut frees) = (Vec::new(), Vec::new());
    // SAFETY: `raw` is live (caller).
    for node in unsafe { driver::graph_nodes(raw) }? {
        // SAFETY: `node` belongs to the live graph.
        match unsafe { driver::node_type(node) }? {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                // SAFETY: an allocation node of the live graph.
                let p = unsafe { driver::mem_alloc_node_params(node) }?;
                allocs.push((p.dptr, p.bytesize as u64));
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                // SAFETY: a free node of the live graph.
                frees.push(unsafe { driver::mem_free_node_address(node) }?);
            }
            _ => {}
        }
    }
    Ok((allocs, frees))
}

/// After a failed instantiation or upload: waits for the runtime's stream (a half-finished
/// upload is queued there) and gives the graph memory pool's unused memory back, unless a
/// live graph with temporaries would lose its mapping with it (see [`Graph`]'s drop).
fn give_back_graph_memory(rt: &Runtime) {
    let ctx = rt.context();
    ctx.record_err(rt.stream().synchronize());
    if graphs_with_temporaries(ctx.ordinal()).load(Ordering::Acquire) == 0 {
        ctx.record_err(driver::graph_mem_trim(ctx.cu_device()));
    }
    if let Some(e) = rt.take_recorded_error() {
        tracing::debug!(error = ?e, "cleared an error recorded while giving graph memory back");
    }
}

/// The granule in which the driver maps a graph's temporaries to physical memory, and the
/// headroom a capture leaves beside them (the executable graph, the driver's own tables):
/// on the H200 with driver 580, a graph whose temporaries came within a few MiB of the free
/// memory passed a check against their bare sum and then failed in the driver, which kept
/// the memory. A capture refuses temporaries that need more than the free memory once
/// rounded up to this granule, plus one granule (see "Sizing memory" in the crate docs).
pub const GRAPH_MAP_GRANULE: usize = 32 << 20;

/// What mapping `temp_bytes` of temporaries takes at most: the bytes rounded up to the
/// driver's granule, plus one granule of headroom.
pub(crate) fn mapped_bytes(temp_bytes: usize) -> usize {
    temp_bytes.div_ceil(GRAPH_MAP_GRANULE).saturating_add(1) * GRAPH_MAP_GRANULE
}

/// Refuses a graph whose temporaries could not be mapped, before the driver tries.
///
/// A failed upload (or first launch) is not an error the driver recovers from: on an H100
/// with driver 580, the device's graph memory pool kept the ~80 GB it had reserved for the
/// attempt after the executable graph was destroyed, the stream and the context were
/// synchronised and the pool was trimmed, and every later graph in the process failed.
/// So the graph is measured first, by the address ranges of its temporaries (what it maps:
/// CUDA gives a temporary the addresses of one the graph freed earlier, so overlapping
/// ranges count once), rounded up to the driver's mapping granule with one granule of
/// headroom ([`mapped_bytes`]), and refused when that is more than the free memory plus what
/// the pool already holds (graphs launched on one stream share the pool's memory).
///
/// Returns the free memory and the pool's reserved bytes it read, the baseline of the
/// graph's memory figures (see `GraphInfo::read_footprint`).
fn refuse_temporaries_that_cannot_fit(
    rt: &Runtime,
    name: &'static str,
    temp_bytes: usize,
) -> Result<MemoryReading, GraphError> {
    // No synchronize between this reading and the one after the upload: the stream-ordered
    // allocator gives back what the warmup freed (its snapshot, its temporaries) only at
    // one, so both readings see the same state of it.
    let measure = rt.measures_executable_memory();
    if temp_bytes == 0 {
        return Ok(MemoryReading {
            free: measure
                .then(|| rt.mem_info())
                .transpose()?
                .map(|(free, _)| free),
            pool_reserved: None,
        });
    }
    let (free, _total) = rt.mem_info()?;
    let reserved = rt.graph_pool_reserved()?;
    let available = free.saturating_add(reserved);
    if mapped_bytes(temp_bytes) <= available {
        return Ok(MemoryReading {
            free: measure.then_some(free),
            pool_reserved: Some(reserved),
        });
    }
    Err(GraphError::OutOfMemory {
        during: format!(
            "instantiating the graph of `{name}`: its temporaries (the allocations its body made while captured) \
             need {} once mapped in the driver's {} granules with one granule of headroom, more than the device \
             has ({} free, {} held by the graph memory pool), so the graph was refused before the driver mapped \
             anything",
            crate::error::bytes(mapped_bytes(temp_bytes)),
            crate::error::bytes(GRAPH_MAP_GRANULE),
            crate::error::bytes(free),
            crate::error::bytes(reserved)
        ),
        requested_bytes: Some(temp_bytes),
        free_bytes: Some(free),
    })
}

/// Refuses a recorded graph whose temporaries could not be mapped, as instantiating it would
/// ([`refuse_temporaries_that_cannot_fit`]): before the determinism check records the body a
/// second time, so that a graph too large for the device is the same error in every build.
pub(crate) fn refuse_unmappable(
    rt: &Runtime,
    name: &'static str,
    raw: &RecordedGraph,
    record: &CaptureRecord,
) -> Result<(), GraphError> {
    let inspected = inspect(raw.raw(), name, &[], false, record)?;
    refuse_temporaries_that_cannot_fit(rt, name, inspected.temp_bytes).map(drop)
}

/// What a captured graph holds, by kind, and what its temporaries need.
struct Inspected {
    /// Allocation nodes (address, bytes) and the addresses of free nodes.
    allocs: Vec<(u64, u64)>,
    frees: Vec<u64>,
    kinds: NodeKinds,
    temp_bytes: usize,
    temp_requested_bytes: usize,
    early_edges: usize,
    /// Memory the nodes address outside the temporaries and the static inputs.
    foreign: Foreign,
}

/// The device's free memory (read only when the runtime measures executable memory) and
/// the graph pool's reserved bytes (read only when the graph has temporaries), before a
/// graph is instantiated.
#[derive(Debug, Default, Clone, Copy)]
struct MemoryReading {
    free: Option<usize>,
    pool_reserved: Option<usize>,
}

impl GraphInfo {
    /// Fills the pool and executable-graph figures from readings after the upload, against
    /// `before`. The upload call maps the temporaries' memory before it returns (an
    /// out-of-memory failure is its error), so no synchronize is needed. A reading that
    /// fails leaves its figures at 0 (or `None`): the graph itself is fine.
    fn read_footprint(&mut self, rt: &Runtime, before: MemoryReading) {
        if let Some(pool_before) = before.pool_reserved {
            if let Ok(reserved) = rt.graph_pool_reserved() {
                self.pool_reserved_bytes = reserved;
                self.pool_added_bytes = reserved.saturating_sub(pool_before);
                self.pool_shared_bytes = self.temp_bytes.saturating_sub(self.pool_added_bytes);
            }
        }
        // Read only when asked for (measured before): `cuMemGetInfo` costs tens of µs, as
        // much as instantiating a small graph.
        if let Some(free_before) = before.free {
            if let Ok((free, _)) = rt.mem_info() {
                self.exec_bytes = Some(
                    free_before
                        .saturating_sub(free)
                        .saturating_sub(self.pool_added_bytes),
                );
            }
        }
    }
}

/// The bytes the union of `ranges` (start, length) covers: overlapping ranges count once.
fn covered_bytes(ranges: &mut [(u64, u64)]) -> usize {
    ranges.sort_unstable();
    let mut covered = 0u64;
    let mut reach = 0u64;
    for &(start, len) in ranges.iter() {
        let end = start.saturating_add(len);
        if end <= reach {
            continue;
        }
        covered += end - start.max(reach);
        reach = end;
    }
    covered as usize
}

impl NodeKinds {
    /// All nodes.
    pub fn total(&self) -> usize {
        self.kernels
            + self.input_copies
            + self.copies
            + self.memsets
            + self.allocs
            + self.frees
            + self.conditionals
            + self.other
    }
}

/// Counts the nodes of `raw` by kind, sizes its temporaries, counts its programmatic edges
/// and refuses copies that touch pageable host memory.
///
/// CUDA records a device-to-host or host-to-device copy of pageable memory (a `Vec`, a
/// slice) as a memcpy node with the host address baked in. The body saw a value read before
/// the GPU ran, and every replay would read or write that address again, long after the
/// `Vec` was freed. Pinned (page-locked) host buffers are allowed: they are how data is
/// staged on purpose.
fn inspect(
    raw: sys::CUgraph,
    graph: &'static str,
    inputs: &[InputNode],
    count_edges: bool,
    record: &CaptureRecord,
) -> Result<Inspected, GraphError> {
    // SAFETY: `raw` is the live graph the capture just returned.
    let nodes = unsafe { driver::graph_nodes(raw) }?;
    let mut kinds = NodeKinds::default();
    let mut temps: Vec<(u64, u64)> = Vec::new();
    let mut freed: Vec<u64> = Vec::new();
    let mut addresses = Addresses::default();
    // The nodes of the graph, then those of its conditional bodies (at any depth).
    let mut pending = nodes;
    while let Some(node) = pending.pop() {
        // SAFETY: `node` belongs to `raw`, which is alive.
        match unsafe { driver::node_type(node) }? {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => {
                if inputs.iter().any(|i| i.node() == node) {
                    kinds.input_copies += 1;
                } else {
                    kinds.kernels += 1;
                    // SAFETY: a kernel node of the live graph `raw`, whose modules the
                    // runtime keeps loaded.
                    unsafe { addresses.kernel(node) }?;
                }
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => {
                kinds.copies += 1;
                // SAFETY: `node` is a memcpy node of the live graph `raw`.
                let p = unsafe { driver::memcpy_node_params(node) }?;
                let src_pageable = is_pageable(p.srcMemoryType, p.srcHost as usize, p.srcDevice);
                let dst_pageable = is_pageable(p.dstMemoryType, p.dstHost as usize, p.dstDevice);
                addresses.endpoints(
                    &[p.srcDevice, p.srcHost as u64, p.dstDevice, p.dstHost as u64],
                    "copy",
                );
                if src_pageable || dst_pageable {
                    let direction = if dst_pageable {
                        "device-to-host"
                    } else {
                        "host-to-device"
                    };
                    return Err(GraphError::PageableCopyCaptured { graph, direction });
                }
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => {
                kinds.memsets += 1;
                // SAFETY: `node` is a memset node of the live graph `raw`.
                let p = unsafe { driver::memset_node_params(node) }?;
                addresses.endpoints(&[p.dst], "memset");
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                kinds.allocs += 1;
                // SAFETY: `node` is an allocation node of the live graph `raw`.
                let p = unsafe { driver::mem_alloc_node_params(node) }?;
                temps.push((p.dptr, p.bytesize as u64));
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                kinds.frees += 1;
                // SAFETY: `node` is a free node of the live graph `raw`.
                freed.push(unsafe { driver::mem_free_node_address(node) }?);
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL => {
                kinds.conditionals += 1;
                for &body in record.bodies_of(node).unwrap_or_default() {
                    // SAFETY: `body` is a body graph of a node of the live graph.
                    pending.extend(unsafe { driver::graph_nodes(body) }?);
                }
            }
            _ => kinds.other += 1,
        }
    }
    // Programmatic edges come only from early launches: the edges are read (one driver call
    // for every edge of the graph) only when the capture made some.
    let early_edges = if count_edges {
        let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        // SAFETY: `raw` is alive.
        unsafe { driver::graph_edges(raw) }?
            .iter()
            .filter(|(_, _, d)| d.type_ == programmatic)
            .count()
    } else {
        0
    };
    let temp_requested_bytes = temps.iter().map(|&(_, len)| len as usize).sum();
    let mut foreign = addresses.resolve(&temps);
    foreign.exempt(inputs.iter().map(|i| i.destination()));
    Ok(Inspected {
        allocs: temps.clone(),
        frees: freed,
        kinds,
        temp_bytes: covered_bytes(&mut temps),
        temp_requested_bytes,
        early_edges,
        foreign,
    })
}

/// Whether a copy endpoint is host memory the driver does not know (pageable).
fn is_pageable(kind: sys::CUmemorytype, host: usize, device: sys::CUdeviceptr) -> bool {
    let ptr = match kind {
        sys::CUmemorytype::CU_MEMORYTYPE_DEVICE | sys::CUmemorytype::CU_MEMORYTYPE_ARRAY => {
            return false
        }
        sys::CUmemorytype::CU_MEMORYTYPE_HOST => host as sys::CUdeviceptr,
        _ => {
            if device != 0 {
                device
            } else {
                host as sys::CUdeviceptr
            }
        }
    };
    driver::pointer_memory_type(ptr).is_none()
}

#[cfg(test)]
mod tests {
    use super::covered_bytes;

    #[test]
    fn overlapping_temporaries_count_once() {
        assert_eq!(covered_bytes(&mut []), 0);
        // Two temporaries at the same addresses (the second reuses the first's).
        assert_eq!(covered_bytes(&mut [(4096, 100), (4096, 100)]), 100);
        // Disjoint, out of order.
        assert_eq!(covered_bytes(&mut [(1000, 10), (0, 10)]), 20);
        // Partly overlapping, and one inside another.
        assert_eq!(covered_bytes(&mut [(0, 10), (5, 10), (6, 2)]), 15);
        // Adjacent.
        assert_eq!(covered_bytes(&mut [(0, 10), (10, 10)]), 20);
    }
}
