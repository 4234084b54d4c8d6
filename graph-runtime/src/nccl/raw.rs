//! The raw NCCL calls the runtime makes, one thin function each, with a link to NVIDIA's
//! documentation of the call: the NCCL counterpart of `crate::driver`.
//!
//! It also holds the three driver calls only the one-shot all-reduce makes (peer access and
//! two synchronous copies), so that they exist only with the feature.
//!
//! Every other module of [`crate::nccl`] goes through here for anything in
//! `cudarc::nccl::{sys, result}`. Functions that take a communicator are `unsafe`: it must be
//! alive (made by [`comm_init_rank`], not yet destroyed) and used by one thread at a time.
//! Callers check [`super::library::nccl_available`] first: cudarc panics on the first NCCL
//! call when the library cannot be loaded.

use std::ffi::CStr;
use std::mem::MaybeUninit;

use cudarc::driver::sys::{self as dsys, CUdeviceptr, CUstream};
use cudarc::nccl::result::{self, NcclError};
use cudarc::nccl::sys;

use super::sequence::CollectiveOp;
use crate::error::CollectiveError;
use crate::error::GraphError;

/// The library's version code.
///
/// [`ncclGetVersion`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclgetversion)
pub(crate) fn version() -> Result<i32, NcclError> {
    result::get_nccl_version()
}

/// A new unique id: the 128 bytes every rank of one communicator passes to
/// [`comm_init_rank`]. Made once, by one rank (here: the process that makes the group).
///
/// [`ncclGetUniqueId`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclgetuniqueid)
pub(crate) fn unique_id() -> Result<sys::ncclUniqueId, NcclError> {
    result::get_uniqueid()
}

/// Creates rank `rank`'s communicator of a group of `world` ranks. Blocks until every rank
/// has called it with the same `id`, so each rank calls it from its own thread (or process).
/// NCCL uses the CUDA device current on the calling thread.
///
/// [`ncclCommInitRank`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclcomminitrank)
///
/// # Safety
/// The context of the rank's device is bound to the calling thread.
pub(crate) unsafe fn comm_init_rank(
    world: usize,
    id: sys::ncclUniqueId,
    rank: usize,
) -> Result<sys::ncclComm_t, NcclError> {
    let mut comm = MaybeUninit::<sys::ncclComm_t>::uninit();
    // SAFETY: `comm` is a valid place for the handle; the device is current (caller).
    unsafe { result::comm_init_rank(comm.as_mut_ptr(), world as i32, id, rank as i32) }?;
    // SAFETY: written by the successful call above.
    Ok(unsafe { comm.assume_init() })
}

/// Destroys a communicator whose operations have all completed, freeing its resources.
///
/// [`ncclCommDestroy`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclcommdestroy)
///
/// # Safety
/// `comm` is alive and not used afterwards; no graph that recorded its collectives lives.
pub(crate) unsafe fn comm_destroy(comm: sys::ncclComm_t) -> Result<(), NcclError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::comm_destroy(comm) }.map(drop)
}

/// Destroys a communicator, aborting its uncompleted operations (the way out of a hang).
///
/// [`ncclCommAbort`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclcommabort)
///
/// # Safety
/// `comm` is alive and not used afterwards.
pub(crate) unsafe fn comm_abort(comm: sys::ncclComm_t) -> Result<(), NcclError> {
    // SAFETY: forwarded from the caller.
    unsafe { result::comm_abort(comm) }.map(drop)
}

/// NCCL's description of its last error (possibly of an earlier call).
///
/// [`ncclGetLastError`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclgetlasterror)
///
/// # Safety
/// `comm` is alive or null.
pub(crate) unsafe fn last_error(comm: sys::ncclComm_t) -> String {
    // SAFETY: `comm` is alive or null (caller), which NCCL accepts.
    let text = unsafe { sys::ncclGetLastError(comm) };
    if text.is_null() {
        return String::new();
    }
    // SAFETY: NCCL returns a NUL-terminated string it owns, valid until its next error.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .trim()
        .to_owned()
}

/// The device buffers of one collective.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buffers {
    /// What this rank sends (equal to `recv` for an in-place call).
    pub send: CUdeviceptr,
    /// Where this rank receives.
    pub recv: CUdeviceptr,
    /// NCCL's `count` for the operation (see [`super::CollectiveCall::count`]).
    pub count: usize,
    /// The element type.
    pub dtype: sys::ncclDataType_t,
}

/// Enqueues collective `op` on `stream` (or records it, when the stream is capturing).
///
/// [`ncclAllReduce`, `ncclAllGather`, `ncclReduceScatter`, `ncclBroadcast`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/colls.html)
///
/// # Safety
/// `comm` is alive and belongs to the device of `stream`, whose context is bound to this
/// thread; `b.send` and `b.recv` point to device memory of that device holding what `op`
/// reads and writes for `b.count` (NCCL's rules: all-gather receives `count × ranks`,
/// reduce-scatter sends `count × ranks`) and stay allocated until the operation completes
/// (for a captured operation: for as long as the graph can be launched).
pub(crate) unsafe fn issue(
    op: CollectiveOp,
    b: Buffers,
    comm: sys::ncclComm_t,
    stream: CUstream,
) -> Result<(), NcclError> {
    let (send, recv) = (
        b.send as *const std::ffi::c_void,
        b.recv as *mut std::ffi::c_void,
    );
    let stream = stream as sys::cudaStream_t;
    // SAFETY: every pointer and handle is as the caller promised.
    unsafe {
        match op {
            CollectiveOp::AllReduce(r) => {
                result::all_reduce(send, recv, b.count, b.dtype, r.raw(), comm, stream)
            }
            CollectiveOp::AllGather => {
                result::all_gather(send, recv, b.count, b.dtype, comm, stream)
            }
            CollectiveOp::ReduceScatter(r) => {
                result::reduce_scatter(send, recv, b.count, b.dtype, r.raw(), comm, stream)
            }
            CollectiveOp::Broadcast { root } => {
                result::broadcast(send, recv, b.count, b.dtype, root as i32, comm, stream)
            }
        }
    }
    .map(drop)
}

/// Turns an NCCL failure of `call` on `rank` into a typed error with what to do about the
/// code, and NCCL's own last message when `comm` is given (`Some(null)` asks for the last
/// error of the process; `None` does not ask, for calls made before the version is known
/// to have `ncclGetLastError`).
pub(crate) fn error(
    call: &'static str,
    rank: usize,
    e: NcclError,
    comm: Option<sys::ncclComm_t>,
) -> GraphError {
    use sys::ncclResult_t as R;
    // SAFETY: a communicator passed here is alive (it is the one the failed call used) or
    // null, which NCCL accepts.
    let detail = comm.map(|c| unsafe { last_error(c) }).unwrap_or_default();
    let fix = match e.0 {
        R::ncclUnhandledCudaError => {
            "a CUDA call inside NCCL failed: the device may be out of memory or an earlier \
             kernel faulted; run with NCCL_DEBUG=WARN to see the call"
        }
        R::ncclSystemError => {
            "a system call failed (shared memory or sockets: in a container, /dev/shm may be \
             too small); run with NCCL_DEBUG=WARN to see which"
        }
        R::ncclInternalError => {
            "NCCL hit an internal error, often a mismatched installation; run with \
             NCCL_DEBUG=INFO and check that one libnccl is loaded"
        }
        R::ncclInvalidArgument => {
            "an argument was invalid (a buffer not on this rank's device, a root out of \
             range); check the buffers come from this rank's runtime"
        }
        R::ncclInvalidUsage => {
            "NCCL refused the order or combination of calls (two ranks on one GPU, calls \
             from two threads at once, or a communicator used after an error); run with \
             NCCL_DEBUG=WARN for its reason"
        }
        R::ncclRemoteError => "another rank or the network failed; look at the other ranks' errors",
        _ => "run with NCCL_DEBUG=WARN for NCCL's own explanation",
    };
    CollectiveError::Nccl {
        call,
        rank,
        code: format!("{:?}", e.0),
        detail,
        fix,
    }
    .into()
}

/// NCCL's `NCCL_WIN_COLL_SYMMETRIC` window flag: every rank passes buffers at the same offset
/// of the window to each collective, which lets NCCL use its symmetric kernels.
const WIN_COLL_SYMMETRIC: i32 = 0x01;

/// Allocates `bytes` of device memory that NCCL can map into the other ranks' address
/// spaces (the memory of a symmetric window), on the device current on this thread.
///
/// [`ncclMemAlloc`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclmemalloc)
///
/// # Safety
/// The library is NCCL 2.19 or newer, and the context of the rank's device is bound to the
/// calling thread.
pub(crate) unsafe fn mem_alloc(bytes: usize) -> Result<CUdeviceptr, NcclError> {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: `ptr` is a valid place for the address; the device is current (caller).
    let code = unsafe { sys::ncclMemAlloc(&mut ptr, bytes) };
    match code {
        sys::ncclResult_t::ncclSuccess => Ok(ptr as CUdeviceptr),
        e => Err(NcclError(e)),
    }
}

/// Frees memory from [`mem_alloc`].
///
/// [`ncclMemFree`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclmemfree)
///
/// # Safety
/// `ptr` came from [`mem_alloc`] on the device current on this thread, no work that uses it
/// is queued, and no live communicator has it registered.
pub(crate) unsafe fn mem_free(ptr: CUdeviceptr) -> Result<(), NcclError> {
    // SAFETY: as the caller promised.
    match unsafe { sys::ncclMemFree(ptr as *mut std::ffi::c_void) } {
        sys::ncclResult_t::ncclSuccess => Ok(()),
        e => Err(NcclError(e)),
    }
}

/// Registers `bytes` at `ptr` as a symmetric window of `comm`: a collective call every rank
/// makes, in the same order, with the same size. The window lives until the communicator is
/// destroyed.
///
/// [`ncclCommWindowRegister`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/comms.html#ncclcommwindowregister)
///
/// # Safety
/// The library is NCCL 2.27 or newer; `comm` is alive and used by this thread only; `ptr`
/// came from [`mem_alloc`] with at least `bytes`; every other rank makes the same call.
pub(crate) unsafe fn window_register(
    comm: sys::ncclComm_t,
    ptr: CUdeviceptr,
    bytes: usize,
) -> Result<sys::ncclWindow_t, NcclError> {
    let mut win = MaybeUninit::<sys::ncclWindow_t>::uninit();
    // SAFETY: `win` is a valid place for the handle; the rest is as the caller promised.
    let code = unsafe {
        sys::ncclCommWindowRegister(
            comm,
            ptr as *mut std::ffi::c_void,
            bytes,
            win.as_mut_ptr(),
            WIN_COLL_SYMMETRIC,
        )
    };
    match code {
        // SAFETY: written by the successful call.
        sys::ncclResult_t::ncclSuccess => Ok(unsafe { win.assume_init() }),
        e => Err(NcclError(e)),
    }
}

/// Copies `src` to device memory and waits for the copy.
///
/// [`cuMemcpyHtoD`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html)
///
/// # Safety
/// `dst .. dst + size_of_val(src)` is allocated device memory of the context bound to this
/// thread.
pub(crate) unsafe fn copy_htod_sync<T>(
    dst: CUdeviceptr,
    src: &[T],
) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { cudarc::driver::result::memcpy_htod_sync(dst, src) }
}

/// Copies device memory into `dst` and waits for the copy.
///
/// [`cuMemcpyDtoH`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html)
///
/// # Safety
/// `src .. src + size_of_val(dst)` is allocated device memory of the context bound to this
/// thread.
pub(crate) unsafe fn copy_dtoh_sync<T>(
    dst: &mut [T],
    src: CUdeviceptr,
) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: forwarded from the caller.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, src) }
}

/// Lets the context bound to this thread (on device `ordinal`) read and write the memory of
/// `peer`, a context on device `peer_ordinal`: `Ok(false)` when the hardware cannot, `Ok(true)`
/// when it can (also when access was enabled before).
///
/// [`cuDeviceCanAccessPeer`, `cuCtxEnablePeerAccess`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html)
///
/// # Safety
/// `peer` is a live context of device `peer_ordinal`.
pub(crate) unsafe fn enable_peer_access(
    ordinal: usize,
    peer_ordinal: usize,
    peer: dsys::CUcontext,
) -> Result<bool, cudarc::driver::DriverError> {
    let (mut dev, mut peer_dev) = (0, 0);
    // SAFETY: plain queries of device handles by ordinal.
    unsafe { dsys::cuDeviceGet(&mut dev, ordinal as i32) }.result()?;
    // SAFETY: as above.
    unsafe { dsys::cuDeviceGet(&mut peer_dev, peer_ordinal as i32) }.result()?;
    let mut can = 0;
    // SAFETY: valid device handles and a place for the answer.
    unsafe { dsys::cuDeviceCanAccessPeer(&mut can, dev, peer_dev) }.result()?;
    if can == 0 {
        return Ok(false);
    }
    // SAFETY: `peer` is live (caller); the current context is this thread's.
    match unsafe { dsys::cuCtxEnablePeerAccess(peer, 0) } {
        dsys::CUresult::CUDA_SUCCESS | dsys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(true)
        }
        e => Err(cudarc::driver::DriverError(e)),
    }
}
