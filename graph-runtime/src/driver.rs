//! The raw CUDA driver calls the runtime makes beyond cudarc's safe API, one thin function
//! each, with a link to NVIDIA's documentation of the call.
//!
//! Every other module goes through here for anything in `cudarc::driver::sys` or
//! `cudarc::driver::result`, so the places that hand raw handles to the driver are few and
//! each states its contract once. Functions that take a raw handle are `unsafe`: the handle
//! must be alive and belong to the context bound to the calling thread.

use std::mem::MaybeUninit;

use cudarc::driver::{result, sys, DriverError};

/// The nodes of `graph`, in creation order.
///
/// [`cuGraphGetNodes`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `graph` is a live graph.
pub(crate) unsafe fn graph_nodes(
    graph: sys::CUgraph,
) -> Result<Vec<sys::CUgraphNode>, DriverError> {
    let mut count = 0usize;
    // SAFETY: a null array asks only for the count; `graph` is live (caller).
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) }.result()?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
    if count > 0 {
        // SAFETY: `nodes` has room for `count` handles, the number CUDA just reported.
        unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }.result()?;
        nodes.truncate(count);
    }
    Ok(nodes)
}

/// The kind of `node`.
///
/// [`cuGraphNodeGetType`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `node` belongs to a live graph.
pub(crate) unsafe fn node_type(
    node: sys::CUgraphNode,
) -> Result<sys::CUgraphNodeType, DriverError> {
    let mut kind = MaybeUninit::uninit();
    // SAFETY: `node` is live (caller); CUDA writes the type.
    unsafe { sys::cuGraphNodeGetType(node, kind.as_mut_ptr()) }.result()?;
    // SAFETY: initialised by the successful call above.
    Ok(unsafe { kind.assume_init() })
}

/// The parameters of a memcpy node.
///
/// [`cuGraphMemcpyNodeGetParams`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `node` is a memcpy node of a live graph.
pub(crate) unsafe fn memcpy_node_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_MEMCPY3D, DriverError> {
    let mut p = MaybeUninit::<sys::CUDA_MEMCPY3D>::zeroed();
    // SAFETY: `node` is a live memcpy node (caller); CUDA fills `p`.
    unsafe { sys::cuGraphMemcpyNodeGetParams(node, p.as_mut_ptr()) }.result()?;
    // SAFETY: zeroed (a valid value of this plain C struct), then filled by the call.
    Ok(unsafe { p.assume_init() })
}

/// The parameters of a memory allocation node (its size, among others).
///
/// [`cuGraphMemAllocNodeGetParams`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `node` is an allocation node of a live graph.
pub(crate) unsafe fn mem_alloc_node_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_MEM_ALLOC_NODE_PARAMS, DriverError> {
    let mut p = MaybeUninit::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>::zeroed();
    // SAFETY: `node` is a live allocation node (caller); CUDA fills `p`.
    unsafe { sys::cuGraphMemAllocNodeGetParams(node, p.as_mut_ptr()) }.result()?;
    // SAFETY: zeroed (a valid value of this plain C struct), then filled by the call.
    Ok(unsafe { p.assume_init() })
}

/// One edge of a graph: from, to, and its data (its dependency type among others).
pub(crate) type Edge = (sys::CUgraphNode, sys::CUgraphNode, sys::CUgraphEdgeData);

/// Every edge of `graph`.
///
/// [`cuGraphGetEdges_v2`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `graph` is a live graph.
pub(crate) unsafe fn graph_edges(graph: sys::CUgraph) -> Result<Vec<Edge>, DriverError> {
    let mut count = 0usize;
    // SAFETY: null arrays ask only for the edge count; `graph` is live (caller).
    unsafe {
        sys::cuGraphGetEdges_v2(
            graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut count,
        )
    }
    .result()?;
    if count == 0 {
        return Ok(Vec::new());
    }
    // CUDA fills edge data only together with both endpoint arrays.
    let mut from: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
    let mut to: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: all-zero edge data is a valid value of this plain C struct.
    let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; count];
    // SAFETY: the three arrays have room for `count` entries, the number CUDA just reported.
    unsafe {
        sys::cuGraphGetEdges_v2(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut count,
        )
    }
    .result()?;
    Ok(from
        .into_iter()
        .zip(to)
        .zip(data)
        .take(count)
        .map(|((f, t), d)| (f, t, d))
        .collect())
}

/// Instantiates `graph` into an executable graph.
///
/// [`cuGraphInstantiateWithFlags`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `graph` is a live graph of the context bound to this thread.
pub(crate) unsafe fn instantiate(
    graph: sys::CUgraph,
    flags: sys::CUgraphInstantiate_flags,
) -> Result<sys::CUgraphExec, DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::graph::instantiate(graph, flags) }
}

/// Maps an executable graph's memory and uploads it to the device, in `stream`'s order.
///
/// [`cuGraphUpload`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `exec` is a live executable graph and `stream` a live stream of its context.
pub(crate) unsafe fn upload(
    exec: sys::CUgraphExec,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::graph::upload(exec, stream) }
}

/// Queues one launch of an executable graph.
///
/// [`cuGraphLaunch`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `exec` is a live executable graph and `stream` a live stream of its context, which is
/// bound to this thread; every address the graph uses is still allocated.
#[inline]
pub(crate) unsafe fn launch(
    exec: sys::CUgraphExec,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::graph::launch(exec, stream) }
}

/// Destroys an executable graph (CUDA defers it until launches in flight complete).
///
/// [`cuGraphExecDestroy`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `exec` is live, owned by the caller and not used afterwards.
pub(crate) unsafe fn exec_destroy(exec: sys::CUgraphExec) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::graph::exec_destroy(exec) }
}

/// Destroys a graph.
///
/// [`cuGraphDestroy`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `graph` is live, owned by the caller and not used afterwards.
pub(crate) unsafe fn graph_destroy(graph: sys::CUgraph) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::graph::destroy(graph) }
}

/// Writes a Graphviz description of `graph` to `path`.
///
/// [`cuGraphDebugDotPrint`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `graph` is a live graph.
pub(crate) unsafe fn debug_dot_print(
    graph: sys::CUgraph,
    path: &std::ffi::CStr,
    flags: u32,
) -> Result<(), DriverError> {
    // SAFETY: `path` is a NUL-terminated string that outlives the call; `graph` is live.
    unsafe { sys::cuGraphDebugDotPrint(graph, path.as_ptr(), flags) }.result()
}

/// Begins capturing `stream` in `mode`.
///
/// [`cuStreamBeginCapture`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html)
///
/// # Safety
/// `stream` is a live stream of the context bound to this thread.
pub(crate) unsafe fn begin_capture(
    stream: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::stream::begin_capture(stream, mode) }
}

/// Ends the capture of `stream` and returns the recorded graph (null when nothing was
/// recorded). The caller owns the graph.
///
/// [`cuStreamEndCapture`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html)
///
/// # Safety
/// `stream` is the live stream whose capture the calling thread began.
pub(crate) unsafe fn end_capture(stream: sys::CUstream) -> Result<sys::CUgraph, DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::stream::end_capture(stream) }
}

/// Releases physical graph memory of `device` that no executable graph uses.
///
/// [`cuDeviceGraphMemTrim`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
pub(crate) fn graph_mem_trim(device: sys::CUdevice) -> Result<(), DriverError> {
    // SAFETY: takes a device ordinal handle only; no pointer arguments.
    unsafe { sys::cuDeviceGraphMemTrim(device) }.result()
}

/// One of the device's graph memory attributes (bytes).
///
/// [`cuDeviceGetGraphMemAttribute`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
pub(crate) fn graph_mem_attribute(
    device: sys::CUdevice,
    attr: sys::CUgraphMem_attribute,
) -> Result<u64, DriverError> {
    let mut v: u64 = 0;
    // SAFETY: every graph memory attribute is a 64-bit value, written into `v`.
    unsafe { sys::cuDeviceGetGraphMemAttribute(device, attr, (&mut v as *mut u64).cast()) }
        .result()?;
    Ok(v)
}

/// Resets a high-water graph memory attribute of the device.
///
/// [`cuDeviceSetGraphMemAttribute`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
pub(crate) fn reset_graph_mem_high(
    device: sys::CUdevice,
    attr: sys::CUgraphMem_attribute,
) -> Result<(), DriverError> {
    let mut zero: u64 = 0;
    // SAFETY: resetting a high-water mark takes a pointer to a 64-bit zero.
    unsafe { sys::cuDeviceSetGraphMemAttribute(device, attr, (&mut zero as *mut u64).cast()) }
        .result()
}

/// The memory type the driver records for `ptr`, or `None` when the driver does not know
/// the address (pageable host memory).
///
/// [`cuPointerGetAttribute`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__UNIFIED.html)
pub(crate) fn pointer_memory_type(ptr: sys::CUdeviceptr) -> Option<u32> {
    let mut mem_type: u32 = 0;
    // SAFETY: the query only reads the driver's tables for `ptr`; `mem_type` is a valid place
    // for the 32-bit answer. Unknown pointers fail the query instead of being dereferenced.
    let known = unsafe {
        sys::cuPointerGetAttribute(
            (&mut mem_type as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    }
    .result();
    known.ok().map(|()| mem_type)
}

/// Queues a device-to-device copy of `bytes` bytes.
///
/// [`cuMemcpyDtoDAsync`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html)
///
/// # Safety
/// `dst .. dst + bytes` and `src .. src + bytes` are allocated device memory that stays
/// allocated until the copy has run, and `stream` is a live stream of their context.
pub(crate) unsafe fn copy_dtod(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream) }
}

/// Queues a byte fill of `bytes` bytes at `dst`.
///
/// [`cuMemsetD8Async`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html)
///
/// # Safety
/// `dst .. dst + bytes` is allocated device memory that stays allocated until the fill has
/// run, and `stream` is a live stream of its context.
pub(crate) unsafe fn fill_bytes(
    dst: sys::CUdeviceptr,
    value: u8,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::memset_d8_async(dst, value, bytes, stream) }
}

/// Queues a copy from pageable host memory; the driver stages `src` before returning.
///
/// [`cuMemcpyHtoDAsync`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html)
///
/// # Safety
/// `dst .. dst + size_of_val(src)` is allocated device memory that stays allocated until
/// the copy has run, and `stream` is a live stream of its context.
pub(crate) unsafe fn copy_htod<T>(
    dst: sys::CUdeviceptr,
    src: &[T],
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::memcpy_htod_async(dst, src, stream) }
}

/// Records `event` on `stream`. While `stream` captures, `external` makes it an event record
/// node of the graph (which every replay records) instead of a dependency marker.
///
/// [`cuEventRecordWithFlags`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html)
///
/// # Safety
/// `event` and `stream` are live and belong to the context bound to this thread.
pub(crate) unsafe fn record_event(
    event: sys::CUevent,
    stream: sys::CUstream,
    external: bool,
) -> Result<(), DriverError> {
    let flags = if external {
        sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32
    } else {
        sys::CUevent_record_flags::CU_EVENT_RECORD_DEFAULT as u32
    };
    // SAFETY: forwarded from the caller.
    unsafe { sys::cuEventRecordWithFlags(event, stream, flags) }.result()
}

/// Queues a kernel launch with launch attributes (`attrs` may be empty).
///
/// [`cuLaunchKernelEx`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html)
///
/// # Safety
/// `func` is a live function of the context bound to this thread and `stream` a live stream
/// of it; `params` holds one pointer per kernel parameter, each to a value of that
/// parameter's type that lives across the call; every buffer the kernel addresses holds what
/// it addresses for this configuration.
pub(crate) unsafe fn launch_kernel(
    func: sys::CUfunction,
    stream: sys::CUstream,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem_bytes: u32,
    attrs: &mut [sys::CUlaunchAttribute],
    params: &mut [*mut std::ffi::c_void],
) -> Result<(), DriverError> {
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: shared_mem_bytes,
        hStream: stream,
        attrs: if attrs.is_empty() {
            std::ptr::null_mut()
        } else {
            attrs.as_mut_ptr()
        },
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: `config` and `attrs` live across the call; the rest is the caller's contract.
    unsafe { sys::cuLaunchKernelEx(&config, func, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
}

/// The parameters of a kernel node: its function, launch dimensions and arguments.
///
/// [`cuGraphKernelNodeGetParams`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `node` is a kernel node of a live graph; the returned argument pointers are valid only
/// while the graph lives.
pub(crate) unsafe fn kernel_node_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_KERNEL_NODE_PARAMS, DriverError> {
    let mut p = MaybeUninit::<sys::CUDA_KERNEL_NODE_PARAMS>::zeroed();
    // SAFETY: `node` is a live kernel node (caller); CUDA fills `p`.
    unsafe { sys::cuGraphKernelNodeGetParams_v2(node, p.as_mut_ptr()) }.result()?;
    // SAFETY: zeroed (a valid value of this plain C struct), then filled by the call.
    Ok(unsafe { p.assume_init() })
}

/// The name of a kernel function, as compiled (an `extern "C"` name, or a mangled one).
///
/// [`cuFuncGetName`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html)
///
/// # Safety
/// `func` is a live function handle.
pub(crate) unsafe fn function_name(func: sys::CUfunction) -> Option<String> {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `func` is live (caller); CUDA writes a pointer to a string it owns.
    unsafe { sys::cuFuncGetName(&mut name, func) }
        .result()
        .ok()?;
    if name.is_null() {
        return None;
    }
    // SAFETY: a non-null name from the driver is a NUL-terminated string that lives as long
    // as the function's module; it is copied at once.
    Some(
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The size and offset of every parameter of a kernel, in order.
///
/// [`cuFuncGetParamInfo`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html)
///
/// # Safety
/// `func` is a live function handle.
pub(crate) unsafe fn kernel_param_sizes(func: sys::CUfunction) -> Vec<usize> {
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `func` is live (caller); CUDA writes two sizes, or fails past the last
        // parameter.
        let r = unsafe { sys::cuFuncGetParamInfo(func, sizes.len(), &mut offset, &mut size) };
        if r.result().is_err() {
            return sizes;
        }
        sizes.push(size);
    }
}

/// The parameters of a memset node.
///
/// [`cuGraphMemsetNodeGetParams`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `node` is a memset node of a live graph.
pub(crate) unsafe fn memset_node_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_MEMSET_NODE_PARAMS, DriverError> {
    let mut p = MaybeUninit::<sys::CUDA_MEMSET_NODE_PARAMS>::zeroed();
    // SAFETY: `node` is a live memset node (caller); CUDA fills `p`.
    unsafe { sys::cuGraphMemsetNodeGetParams(node, p.as_mut_ptr()) }.result()?;
    // SAFETY: zeroed (a valid value of this plain C struct), then filled by the call.
    Ok(unsafe { p.assume_init() })
}

/// The address a memory free node frees.
///
/// [`cuGraphMemFreeNodeGetParams`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `node` is a free node of a live graph.
pub(crate) unsafe fn mem_free_node_ptr(
    node: sys::CUgraphNode,
) -> Result<sys::CUdeviceptr, DriverError> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: `node` is a live free node (caller); CUDA writes the address.
    unsafe { sys::cuGraphMemFreeNodeGetParams(node, &mut ptr) }.result()?;
    Ok(ptr)
}

/// The node a capturing stream's last operation added (its one capture dependency).
///
/// [`cuStreamGetCaptureInfo_v3`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html)
///
/// # Safety
/// `stream` is a live stream that is capturing on this thread, and its last operation added
/// exactly one node.
pub(crate) unsafe fn last_captured_node(
    stream: sys::CUstream,
) -> Result<sys::CUgraphNode, DriverError> {
    let mut status = MaybeUninit::uninit();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: `stream` is live (caller); CUDA writes the status, the dependency array (owned
    // by the driver, valid until the next capture call on the stream) and its length.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            status.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut deps,
            std::ptr::null_mut(),
            &mut count,
        )
    }
    .result()?;
    if count != 1 || deps.is_null() {
        return Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE));
    }
    // SAFETY: the driver reported one dependency at `deps`.
    Ok(unsafe { *deps })
}

/// Sets the arguments of a kernel node of an executable graph (for later launches only).
///
/// [`cuGraphExecKernelNodeSetParams`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `exec` is live and `node` is a kernel node of the graph it was instantiated from, running
/// `func` with `cfg`; `values` holds one pointer per kernel parameter, each to a value of the
/// parameter's type that lives across the call.
pub(crate) unsafe fn set_kernel_node_args(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    func: sys::CUfunction,
    cfg: cudarc::driver::LaunchConfig,
    values: &mut [*mut std::ffi::c_void],
) -> Result<(), DriverError> {
    // SAFETY: an all-zero kernel node description is a valid value of this plain C struct;
    // the fields that matter are set right after.
    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    p.func = func;
    (p.gridDimX, p.gridDimY, p.gridDimZ) = cfg.grid_dim;
    (p.blockDimX, p.blockDimY, p.blockDimZ) = cfg.block_dim;
    p.sharedMemBytes = cfg.shared_mem_bytes;
    p.kernelParams = values.as_mut_ptr();
    // SAFETY: forwarded from the caller; `p` and `values` live across the call.
    unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec, node, &p) }.result()
}

/// The CUDA version the installed driver supports, as `1000 × major + 10 × minor` (12040 for
/// CUDA 12.4).
///
/// [`cuDriverGetVersion`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VERSION.html)
pub(crate) fn driver_version() -> Result<i32, DriverError> {
    let mut v = 0;
    // SAFETY: writes one int; needs no context and no initialised driver.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

/// What a capturing stream is recording into: the graph and the nodes the next captured
/// operation will depend on (copied, since the driver's array is valid only until the next
/// capture call on the stream).
///
/// [`cuStreamGetCaptureInfo_v3`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html)
///
/// # Safety
/// `stream` is a live stream that is capturing on this thread.
pub(crate) unsafe fn capture_point(
    stream: sys::CUstream,
) -> Result<(sys::CUgraph, Vec<sys::CUgraphNode>), DriverError> {
    let mut status = MaybeUninit::uninit();
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: `stream` is live (caller); CUDA writes the status, the graph, the dependency
    // array (owned by the driver) and its length.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            status.as_mut_ptr(),
            std::ptr::null_mut(),
            &mut graph,
            &mut deps,
            std::ptr::null_mut(),
            &mut count,
        )
    }
    .result()?;
    // SAFETY: initialised by the successful call above.
    let status = unsafe { status.assume_init() };
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || graph.is_null() {
        return Err(DriverError(
            sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        ));
    }
    let deps = if count == 0 || deps.is_null() {
        Vec::new()
    } else {
        // SAFETY: the driver reported `count` dependencies at `deps`; they are copied at once.
        unsafe { std::slice::from_raw_parts(deps, count) }.to_vec()
    };
    Ok((graph, deps))
}

/// Begins capturing `stream` into the existing graph `graph`, after `deps` (the first node
/// recorded depends on them).
///
/// [`cuStreamBeginCaptureToGraph`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html)
///
/// # Safety
/// `stream` is a live stream of the context bound to this thread that is not capturing;
/// `graph` is a live graph of that context and `deps` are nodes of it.
pub(crate) unsafe fn begin_capture_to_graph(
    stream: sys::CUstream,
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    mode: sys::CUstreamCaptureMode,
) -> Result<(), DriverError> {
    let ptr = if deps.is_empty() {
        std::ptr::null()
    } else {
        deps.as_ptr()
    };
    // SAFETY: `deps` lives across the call; null edge data means ordinary edges; the rest
    // is the caller's contract.
    unsafe {
        sys::cuStreamBeginCaptureToGraph(stream, graph, ptr, std::ptr::null(), deps.len(), mode)
    }
    .result()
}

/// Creates a conditional handle for `graph` (the graph that holds the conditional node using
/// it, or one of that graph's ancestors), with its default value applied at every launch.
///
/// [`cuGraphConditionalHandleCreate`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `graph` is a live graph of `ctx`; the driver supports CUDA 12.3 or newer (older drivers
/// lack the symbol, and cudarc's dynamic loader panics on a missing symbol).
pub(crate) unsafe fn conditional_handle_create(
    graph: sys::CUgraph,
    ctx: sys::CUcontext,
    default_value: u32,
) -> Result<sys::CUgraphConditionalHandle, DriverError> {
    let mut handle: sys::CUgraphConditionalHandle = 0;
    // SAFETY: writes one handle; the rest is the caller's contract.
    unsafe {
        sys::cuGraphConditionalHandleCreate(
            &mut handle,
            graph,
            ctx,
            default_value,
            sys::CU_GRAPH_COND_ASSIGN_DEFAULT,
        )
    }
    .result()?;
    Ok(handle)
}

/// Adds a conditional node of `kind` with `size` bodies (1, or 2 for IF/ELSE) to `graph`
/// after `deps`, and returns the node with its body graphs (owned by the node).
///
/// [`cuGraphAddNode_v2`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// `graph` is a live graph of `ctx`, `deps` are nodes of it, `handle` was created for it or
/// one of its ancestors; the driver supports CUDA 12.4 or newer (12.8 for `size == 2`).
pub(crate) unsafe fn add_conditional_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    ctx: sys::CUcontext,
    handle: sys::CUgraphConditionalHandle,
    kind: sys::CUgraphConditionalNodeType,
    size: u32,
) -> Result<(sys::CUgraphNode, Vec<sys::CUgraph>), DriverError> {
    // SAFETY: an all-zero node description is a valid value of this plain C struct (a union
    // of plain structs); the fields of the conditional variant are set right after.
    let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
    params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
    params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
        handle,
        type_: kind,
        size,
        phGraph_out: std::ptr::null_mut(),
        ctx,
    };
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    let ptr = if deps.is_empty() {
        std::ptr::null()
    } else {
        deps.as_ptr()
    };
    // SAFETY: `params` and `deps` live across the call; CUDA writes the node and points
    // `phGraph_out` at an array of `size` body graphs it owns.
    unsafe {
        sys::cuGraphAddNode_v2(
            &mut node,
            graph,
            ptr,
            std::ptr::null(),
            deps.len(),
            &mut params,
        )
    }
    .result()?;
    // SAFETY: the conditional variant is the one just written, and CUDA filled its output.
    let out = unsafe { params.__bindgen_anon_1.conditional.phGraph_out };
    if out.is_null() {
        return Err(DriverError(sys::CUresult::CUDA_ERROR_UNKNOWN));
    }
    // SAFETY: CUDA populated `size` body graphs at `out`, valid for the node's lifetime.
    let bodies = unsafe { std::slice::from_raw_parts(out, size as usize) }.to_vec();
    Ok((node, bodies))
}
