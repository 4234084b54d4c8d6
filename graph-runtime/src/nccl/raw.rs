//! The raw NCCL calls the runtime makes, one thin function each, with a link to NVIDIA's
//! documentation of the call: the NCCL counterpart of `crate::driver`.
//!
//! Every other module of [`crate::nccl`] goes through here for anything in
//! `cudarc::nccl::{sys, result}`. Functions that take a communicator are `unsafe`: it must be
//! alive (made by [`comm_init_rank`], not yet destroyed) and used by one thread at a time.
//! Callers check [`super::library::nccl_available`] first: cudarc panics on the first NCCL
//! call when the library cannot be loaded.

use std::ffi::CStr;
use std::mem::MaybeUninit;

use cudarc::driver::sys::{CUdeviceptr, CUstream};
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
