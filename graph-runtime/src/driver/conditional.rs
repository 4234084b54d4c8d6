//! The driver calls behind conditional nodes: the driver's CUDA version, where a capturing
//! stream stands, capturing into a conditional node's body graph, conditional handles and
//! conditional nodes.

use std::mem::MaybeUninit;

use cudarc::driver::{sys, DriverError};

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
