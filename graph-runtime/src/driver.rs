//! The raw CUDA driver calls the runtime makes beyond cudarc's safe API, one thin function
//! each, with a link to NVIDIA's documentation of the call.
//!
//! Every other module goes through here for anything in `cudarc::driver::sys` or
//! `cudarc::driver::result`, so the places that hand raw handles to the driver are few and
//! each states its contract once. Functions that take a raw handle are `unsafe`: the handle
//! must be alive and belong to the context bound to the calling thread.
//!
//! `driver/conditional.rs` holds the calls behind conditional nodes (and the driver
//! version they check); this file holds the rest.

use std::mem::MaybeUninit;

use cudarc::driver::{result, sys, DriverError};

mod conditional;

pub(crate) use conditional::{
    add_conditional_node, begin_capture_to_graph, capture_point, conditional_handle_create,
    driver_version,
};

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

/// The address a free node of a graph frees.
///
/// # Safety
/// `node` is a live free node.
pub(crate) unsafe fn mem_free_node_address(
    node: sys::CUgraphNode,
) -> Result<sys::CUdeviceptr, DriverError> {
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: `node` is a live free node (caller); CUDA writes one address into `dptr`.
    unsafe { sys::cuGraphMemFreeNodeGetParams(node, &mut dptr) }.result()?;
    Ok(dptr)
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

/// Creates an empty graph (the first segment of a body whose first statement is an eager
/// island). The caller owns it.
///
/// [`cuGraphCreate`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html)
///
/// # Safety
/// A context is bound to the calling thread.
pub(crate) unsafe fn graph_create() -> Result<sys::CUgraph, DriverError> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid place for the handle; flags must be 0.
    unsafe { sys::cuGraphCreate(&mut graph, 0) }.result()?;
    Ok(graph)
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

/// Makes `ctx` current on the calling thread.
///
/// [`cuCtxSetCurrent`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CTX.html)
///
/// # Safety
/// `ctx` is a live context.
pub(crate) unsafe fn set_current(ctx: sys::CUcontext) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { sys::cuCtxSetCurrent(ctx) }.result()
}

/// Whether `stream` captures, and whether CUDA has invalidated its capture.
///
/// [`cuStreamIsCapturing`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html)
///
/// # Safety
/// `stream` is a live stream of the context current on this thread.
pub(crate) unsafe fn capture_status(
    stream: sys::CUstream,
) -> Result<sys::CUstreamCaptureStatus, DriverError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: forwarded from the caller; the driver writes the status.
    unsafe { sys::cuStreamIsCapturing(stream, &mut status) }.result()?;
    Ok(status)
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

/// The allocation that holds `ptr`: its buffer ID (unique over the process's life: memory
/// allocated again at the same address gets another), its first address and its size; `None`
/// when the driver knows no allocation there (host memory it does not know, a freed buffer).
///
/// [`cuPointerGetAttributes`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__UNIFIED.html)
pub(crate) fn allocation_of(ptr: sys::CUdeviceptr) -> Option<(u64, u64, u64)> {
    let (mut id, mut start, mut size) = (0u64, 0u64, 0u64);
    let mut attrs = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut std::ffi::c_void; 3] = [
        (&mut id as *mut u64).cast(),
        (&mut start as *mut u64).cast(),
        (&mut size as *mut u64).cast(),
    ];
    // SAFETY: the query only reads the driver's tables for `ptr`; each data pointer is a valid
    // place for its attribute's 64-bit answer (a buffer ID, a device address, a size_t).
    // Unknown pointers fail the query instead of being dereferenced.
    let known =
        unsafe { sys::cuPointerGetAttributes(3, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr) }
            .result();
    (known.is_ok() && id != 0 && size != 0).then_some((id, start, size))
}

/// The buffer ID of the allocation that holds `ptr` (see [`allocation_of`]), or `None` when
/// nothing is allocated there.
///
/// [`cuPointerGetAttribute`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__UNIFIED.html)
#[inline]
pub(crate) fn buffer_id(ptr: sys::CUdeviceptr) -> Option<u64> {
    let mut id = 0u64;
    // SAFETY: as in `allocation_of`: a read of the driver's tables into a valid 64-bit place.
    let known = unsafe {
        sys::cuPointerGetAttribute(
            (&mut id as *mut u64).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            ptr,
        )
    }
    .result();
    known.ok().map(|()| id)
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

/// Queues a copy into host memory; the bytes are there once `stream` has reached the copy.
///
/// [`cuMemcpyDtoHAsync`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html)
///
/// # Safety
/// `src .. src + size_of_val(dst)` is allocated device memory that stays allocated until the
/// copy has run, `stream` is a live stream of its context, and `dst` is not read before the
/// stream is synchronised past the copy.
pub(crate) unsafe fn copy_dtoh<T>(
    dst: &mut [T],
    src: sys::CUdeviceptr,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::memcpy_dtoh_async(dst, src, stream) }
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

/// A kernel node as the checks read it: launch parameters, the function's name and each
/// argument's bytes, in order.
pub(crate) struct KernelNode {
    pub(crate) params: sys::CUDA_KERNEL_NODE_PARAMS,
    pub(crate) name: String,
    /// Empty for a node launched with `extra` instead of `kernelParams`.
    pub(crate) args: Vec<Vec<u8>>,
}

/// Reads a kernel node: [`kernel_node_params`], [`function_name`] and the bytes of every
/// argument (sizes from [`kernel_param_sizes`]), copied out of the graph.
///
/// # Safety
/// `node` is a kernel node of a live graph whose modules are loaded.
pub(crate) unsafe fn kernel_node(node: sys::CUgraphNode) -> Result<KernelNode, DriverError> {
    // SAFETY: forwarded from the caller.
    let params = unsafe { kernel_node_params(node) }?;
    // SAFETY: the node's function is live while its module is loaded.
    let name = unsafe { function_name(params.func) }.unwrap_or_default();
    let mut args = Vec::new();
    if !params.kernelParams.is_null() {
        // SAFETY: the function is live; the sizes come from the driver.
        let sizes = unsafe { kernel_param_sizes(params.func) };
        for (i, size) in sizes.into_iter().enumerate() {
            // SAFETY: `kernelParams` holds one pointer per parameter of the function, each
            // to `size` bytes the graph keeps for as long as it lives; copied at once.
            let bytes = unsafe {
                let arg = *params.kernelParams.add(i) as *const u8;
                std::slice::from_raw_parts(arg, size).to_vec()
            };
            args.push(bytes);
        }
    }
    Ok(KernelNode { params, name, args })
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

/// The node a capturing stream's last operation added (its one capture dependency), read
/// with [`capture_point`].
///
/// # Safety
/// `stream` is a live stream that is capturing on this thread, and its last operation added
/// exactly one node.
pub(crate) unsafe fn last_captured_node(
    stream: sys::CUstream,
) -> Result<sys::CUgraphNode, DriverError> {
    // SAFETY: forwarded from the caller.
    let (_, deps) = unsafe { capture_point(stream) }?;
    match deps[..] {
        [node] => Ok(node),
        _ => Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)),
    }
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
