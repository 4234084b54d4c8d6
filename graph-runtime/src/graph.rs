//! [`Graph`]: one instantiated CUDA graph bound to the runtime's stream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaEvent, CudaStream};

use crate::buffer::{InputSource, StaticBuffer};
use crate::error::GraphError;
use crate::runtime::{Runtime, StreamGate};

/// Facts about one captured graph, for logs and reports.
#[derive(Debug, Clone, PartialEq)]
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
    /// Time to instantiate and upload the graph.
    pub instantiate_time: Duration,
    /// How far each replay moves the generators the body draws from (measured on the
    /// warmup runs; the graph itself moves them on the device).
    pub rng: Vec<RngAdvance>,
    /// Bytes of the temporaries the body allocates (graph allocation nodes): fixed
    /// addresses for the graph's life, backed by the runtime's graph memory pool.
    pub temp_bytes: usize,
    /// Bytes of the static input and output buffers the graph type owns.
    pub static_bytes: usize,
    /// Programmatic edges: dependencies that let a kernel start while the one before it
    /// finishes, recorded from [early launches](crate::launch). 0 when the body launched
    /// every kernel in order.
    pub early_edges: usize,
}

impl GraphInfo {
    /// Nodes in the captured graph (kernels, copies, memsets, allocations, …).
    pub fn nodes(&self) -> usize {
        self.kinds.total()
    }
}

/// How far one replay moves one generator, in Philox counters (4 values each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RngAdvance {
    /// [`Generator::id`](crate::Generator::id) of the generator.
    pub generator: u64,
    /// Counters consumed per replay.
    pub counters_per_replay: u64,
}

/// How many nodes of each kind a captured graph holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeKinds {
    /// Kernel launches (cuBLAS calls are kernels too).
    pub kernels: usize,
    /// Memory copies.
    pub copies: usize,
    /// Memsets (`alloc_zeros`, `memset_zeros`).
    pub memsets: usize,
    /// Allocations made by the body during capture (graph memory nodes).
    pub allocs: usize,
    /// Frees of those allocations inside the graph.
    pub frees: usize,
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
    graph: sys::CUgraph,
    stream: Arc<CudaStream>,
    gate: Arc<StreamGate>,
    /// Used to order copies from buffers that live on other streams; created once here so
    /// that replay allocates nothing.
    before: CudaEvent,
    after: CudaEvent,
    info: GraphInfo,
}

// SAFETY: the graph and executable-graph handles may be used from any thread as long as
// calls on them are serialised; `Graph` is not `Sync` and every method that touches the
// handles takes `&self` from a single owner, so only one thread uses them at a time.
unsafe impl Send for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Graph {
    /// Instantiates `raw` (taking ownership of it) for the runtime's stream and uploads it.
    pub(crate) fn instantiate(
        rt: &Runtime,
        raw: sys::CUgraph,
        mut info: GraphInfo,
    ) -> Result<Self, GraphError> {
        let started = Instant::now();
        // Temporaries the body allocates during capture become allocation nodes; with
        // AUTO_FREE_ON_LAUNCH a relaunch frees any that the body did not free itself, so a
        // leaked temporary cannot make the next replay fail.
        let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let built = (|| {
            let (kinds, temp_bytes) = inspect(raw, info.name)?;
            info.kinds = kinds;
            info.temp_bytes = temp_bytes;
            info.early_edges = programmatic_edges(raw)?;
            let (before, after) = (timing_free_event(rt)?, timing_free_event(rt)?);
            // SAFETY: `raw` is a valid graph; instantiation does not take ownership of it.
            let exec = unsafe { result::graph::instantiate(raw, flags) }
                .map_err(|e| GraphError::from_driver(info.name, e))?;
            Ok((exec, before, after))
        })();
        let (exec, before, after) = match built {
            Ok(parts) => parts,
            Err(e) => {
                // SAFETY: `raw` is owned here and no executable graph was made from it.
                let _ = unsafe { result::graph::destroy(raw) };
                return Err(e);
            }
        };
        // From here on `Drop` owns both handles, also if the upload fails.
        let mut g = Graph {
            exec,
            graph: raw,
            stream: rt.stream().clone(),
            gate: rt.gate().clone(),
            before,
            after,
            info,
        };
        // SAFETY: `exec` is a live executable graph and the stream belongs to its context.
        // Uploading maps the graph's temporaries to physical memory now, so an out-of-memory
        // failure surfaces here, at capture, and not at the first replay.
        unsafe { result::graph::upload(g.exec, g.stream.cu_stream()) }.map_err(|e| {
            GraphError::from_driver(g.info.name, e).with_oom_context(
                rt,
                || format!("uploading the graph of `{}` (its temporaries)", g.info.name),
                Some(g.info.temp_bytes),
            )
        })?;
        g.info.instantiate_time = started.elapsed();
        Ok(g)
    }

    /// Facts about the capture: node count, memory and timings.
    pub fn info(&self) -> &GraphInfo {
        &self.info
    }

    /// The stream this graph launches on (the runtime's stream).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The graph's stream and ordering events, for copies queued outside a replay (a bucket
    /// family's eager fallback) without creating events each time.
    pub fn staging(&self) -> Staging<'_> {
        Staging {
            stream: &self.stream,
            before: &self.before,
            after: &self.after,
        }
    }

    /// Launches the graph as it is, without touching its inputs.
    #[inline]
    pub fn launch(&self) -> Result<(), GraphError> {
        self.replay_with(|_| Ok(()))
    }

    /// Runs `stage` (which queues the input copies on the graph's stream) and then launches
    /// the graph, both under the stream's capture gate.
    #[inline]
    pub fn replay_with(
        &self,
        stage: impl FnOnce(&Staging<'_>) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        self.gate.launch(self.info.name, || {
            self.stream.context().bind_to_thread()?;
            stage(&self.staging())?;
            // SAFETY: `exec` is a live executable graph owned by `self`, instantiated for
            // this stream's context, which is bound to this thread just above.
            unsafe { result::graph::launch(self.exec, self.stream.cu_stream()) }
                .map_err(GraphError::Driver)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let ctx = self.stream.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: both handles are owned by `self` and destroyed exactly once, here. CUDA
        // defers the destruction of an executable graph until launches in flight complete.
        unsafe {
            ctx.record_err(result::graph::exec_destroy(self.exec));
            ctx.record_err(result::graph::destroy(self.graph));
        }
        if self.info.temp_bytes > 0 {
            // Give the physical memory of this graph's temporaries back to the device, unless
            // another graph (or a launch still in flight) uses it.
            // SAFETY: trims the device's graph memory pool; no precondition beyond a valid
            // device, which the context holds.
            ctx.record_err(unsafe { sys::cuDeviceGraphMemTrim(ctx.cu_device()) }.result());
        }
    }
}

/// What an input copy needs during a replay: the graph's stream, and two events to order a
/// source that lives on another stream.
pub struct Staging<'g> {
    stream: &'g Arc<CudaStream>,
    before: &'g CudaEvent,
    after: &'g CudaEvent,
}

impl Staging<'_> {
    /// The stream the copies and the launch are queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }

    /// Makes the graph's stream wait for the work queued so far on `other`.
    pub fn wait_for(&self, other: &CudaStream) -> Result<(), GraphError> {
        if other.cu_stream() != self.stream.cu_stream() {
            self.before.record(other)?;
            self.stream.wait(self.before)?;
        }
        Ok(())
    }

    /// Makes `other` wait for the work queued so far on the graph's stream, so that a source
    /// freed on `other` is not freed before the copy has read it.
    pub fn release_to(&self, other: &CudaStream) -> Result<(), GraphError> {
        if other.cu_stream() != self.stream.cu_stream() {
            self.after.record(self.stream)?;
            other.wait(self.after)?;
        }
        Ok(())
    }
}

impl NodeKinds {
    /// All nodes.
    pub fn total(&self) -> usize {
        self.kernels + self.copies + self.memsets + self.allocs + self.frees + self.other
    }
}

/// Counts the nodes of `raw` by kind and refuses copies that touch pageable host memory.
///
/// CUDA records a device-to-host or host-to-device copy of pageable memory (a `Vec`, a
/// slice) as a memcpy node with the host address baked in. The body saw a value read before
/// the GPU ran, and every replay would read or write that address again, long after the
/// `Vec` was freed. Pinned (page-locked) host buffers are allowed: they are how data is
/// staged on purpose.
fn inspect(raw: sys::CUgraph, graph: &'static str) -> Result<(NodeKinds, usize), GraphError> {
    let mut count = 0usize;
    // SAFETY: `raw` is a valid graph; a null array asks only for the count.
    unsafe { sys::cuGraphGetNodes(raw, std::ptr::null_mut(), &mut count) }.result()?;
    if count == 0 {
        return Err(GraphError::EmptyGraph { graph });
    }
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: `nodes` has room for `count` handles, the number CUDA just reported.
    unsafe { sys::cuGraphGetNodes(raw, nodes.as_mut_ptr(), &mut count) }.result()?;
    nodes.truncate(count);
    let mut kinds = NodeKinds::default();
    let mut temp_bytes = 0usize;
    for node in nodes {
        let mut kind = std::mem::MaybeUninit::uninit();
        // SAFETY: `node` belongs to `raw`, which is alive; CUDA writes the type.
        unsafe { sys::cuGraphNodeGetType(node, kind.as_mut_ptr()) }.result()?;
        // SAFETY: initialised by the successful call above.
        match unsafe { kind.assume_init() } {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => kinds.kernels += 1,
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => {
                kinds.copies += 1;
                let mut p = std::mem::MaybeUninit::<sys::CUDA_MEMCPY3D>::zeroed();
                // SAFETY: `node` is a memcpy node of a live graph; CUDA fills `p`.
                unsafe { sys::cuGraphMemcpyNodeGetParams(node, p.as_mut_ptr()) }.result()?;
                // SAFETY: initialised (zeroed, then filled by the call above).
                let p = unsafe { p.assume_init() };
                let src_pageable = is_pageable(p.srcMemoryType, p.srcHost as usize, p.srcDevice);
                let dst_pageable = is_pageable(p.dstMemoryType, p.dstHost as usize, p.dstDevice);
                if src_pageable || dst_pageable {
                    let direction = if dst_pageable {
                        "device-to-host"
                    } else {
                        "host-to-device"
                    };
                    return Err(GraphError::PageableCopyCaptured { graph, direction });
                }
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => kinds.memsets += 1,
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                kinds.allocs += 1;
                let mut p = std::mem::MaybeUninit::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>::zeroed();
                // SAFETY: `node` is an allocation node of a live graph; CUDA fills `p`.
                unsafe { sys::cuGraphMemAllocNodeGetParams(node, p.as_mut_ptr()) }.result()?;
                // SAFETY: initialised (zeroed, then filled by the call above).
                temp_bytes += unsafe { p.assume_init() }.bytesize;
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => kinds.frees += 1,
            _ => kinds.other += 1,
        }
    }
    Ok((kinds, temp_bytes))
}

/// How many of the graph's edges are programmatic (early-launch) dependencies.
fn programmatic_edges(raw: sys::CUgraph) -> Result<usize, GraphError> {
    let mut count = 0usize;
    // SAFETY: `raw` is a valid graph; null arrays ask only for the edge count.
    unsafe {
        sys::cuGraphGetEdges_v2(
            raw,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut count,
        )
    }
    .result()?;
    if count == 0 {
        return Ok(0);
    }
    let mut from: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
    let mut to: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: all-zero edge data is a valid value of this plain C struct.
    let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; count];
    // SAFETY: the three arrays have room for `count` entries, the number CUDA just reported.
    unsafe {
        sys::cuGraphGetEdges_v2(
            raw,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut count,
        )
    }
    .result()?;
    let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
    Ok(data[..count.min(data.len())]
        .iter()
        .filter(|e| e.type_ == programmatic)
        .count())
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
    let mut mem_type: u32 = 0;
    // SAFETY: the attribute query only reads the driver's tables for `ptr`; `mem_type` is a
    // valid place for the 32-bit answer. Pointers the driver does not know fail the query.
    let known = unsafe {
        sys::cuPointerGetAttribute(
            (&mut mem_type as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    }
    .result();
    known.is_err()
}

fn timing_free_event(rt: &Runtime) -> Result<CudaEvent, GraphError> {
    Ok(rt
        .context()
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?)
}

/// Copies `src` into `dst` on the runtime's stream outside any replay (used at capture to
/// fill the static inputs with the example values).
pub(crate) fn copy_outside_replay<B: StaticBuffer, S: InputSource<B> + ?Sized>(
    rt: &Runtime,
    src: &S,
    dst: &mut B,
) -> Result<(), GraphError> {
    let (before, after) = (timing_free_event(rt)?, timing_free_event(rt)?);
    src.copy_into(
        dst,
        &Staging {
            stream: rt.stream(),
            before: &before,
            after: &after,
        },
    )
}
