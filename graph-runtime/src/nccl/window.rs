//! [`SymmetricBuffer`]: device memory every rank allocates together and registers with NCCL
//! as a symmetric window, so that collectives on it use NCCL's symmetric kernels (NCCL 2.27
//! and newer): the ranks read and write each other's copies directly, without NCCL's staging
//! buffers, which is what brings a small all-reduce near the cost of one kernel.

use std::mem::ManuallyDrop;
use std::rc::Rc;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    DeviceSlice, SyncOnDrop,
};
use cudarc::nccl::NcclType;

use super::comm::Communicator;
use super::library::NcclVersion;
use super::raw;
use super::sequence::Checkpoint;
use crate::error::{CollectiveError, GraphError};
use crate::state::{DeviceRegion, DeviceState};

/// The oldest NCCL with symmetric windows (`ncclCommWindowRegister`).
pub const MIN_NCCL_SYMMETRIC: NcclVersion = NcclVersion {
    major: 2,
    minor: 27,
    patch: 0,
};

/// Memory from `ncclMemAlloc`, freed (after its device is idle) when the last owner drops it:
/// the communicator it is registered on, or a buffer that outlived the communicator.
pub(crate) struct WindowMemory {
    ptr: CUdeviceptr,
    ctx: Arc<CudaContext>,
    rank: usize,
}

impl Drop for WindowMemory {
    fn drop(&mut self) {
        let freed = self
            .ctx
            .bind_to_thread()
            .and_then(|()| self.ctx.synchronize())
            .map_err(|e| format!("{e:?}"))
            // SAFETY: `ptr` came from `raw::mem_alloc` on this context, which is current and
            // idle; its window died with its communicator (the communicator drops its own
            // reference only after destroying itself, and a buffer's reference outlives it).
            .and_then(|()| unsafe { raw::mem_free(self.ptr) }.map_err(|e| format!("{:?}", e.0)));
        if let Err(e) = freed {
            tracing::warn!(rank = self.rank, error = %e, "a symmetric buffer's memory could not be freed");
        }
    }
}

/// `len` elements of `T` on this rank's device, allocated by every rank of the group
/// together and registered with NCCL as a *symmetric window* (NCCL 2.27 or newer): NCCL
/// maps each rank's copy into the others, and collectives whose buffers all lie in such
/// windows (at the same offset on every rank) run NCCL's symmetric kernels, which read and
/// write the peers' memory directly. For small messages inside a graph that is the cheapest
/// all-reduce NCCL has; see `examples/24-allreduce-floor.rs` for what it measures.
///
/// Made by [`Communicator::symmetric_buffer`]. Use it wherever a collective takes a buffer
/// (it is [`DevicePtr`] and [`DevicePtrMut`]), as `#[state]` of a graph, or through
/// [`SymmetricBuffer::as_view_mut`] for your own kernels. It cannot be swapped for another
/// allocation, so the window stays what NCCL registered.
///
/// **Lifetime of the memory.** NCCL keeps a window until its communicator is destroyed, and
/// deregistering one early is itself a collective every rank would have to make in the
/// same order. So dropping a buffer does not free its memory: the communicator keeps it and
/// frees it after it is destroyed (a buffer that outlives its communicator frees it when it
/// drops). Make the buffers you need once, after the group is set up, and reuse them.
pub struct SymmetricBuffer<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    memory: Rc<WindowMemory>,
}

impl<T> std::fmt::Debug for SymmetricBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("rank", &self.memory.rank)
            .field("len", &self.slice.len())
            .finish_non_exhaustive()
    }
}

impl<T> Drop for SymmetricBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: `slice` is not used again; `leak` releases cudarc's bookkeeping without
        // freeing the memory, which `memory` (and the communicator) own.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        slice.leak();
    }
}

impl<T> SymmetricBuffer<T> {
    /// The whole buffer, for reading (your kernels' arguments, copies to the host).
    pub fn as_view(&self) -> CudaView<'_, T> {
        self.slice.as_view()
    }

    /// The whole buffer, for writing.
    pub fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }
}

impl<T> DeviceSlice<T> for SymmetricBuffer<T> {
    fn len(&self) -> usize {
        self.slice.len()
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.slice.stream()
    }
}

impl<T> DevicePtr<T> for SymmetricBuffer<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.slice.device_ptr(stream)
    }
}

impl<T> DevicePtrMut<T> for SymmetricBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.slice.device_ptr_mut(stream)
    }
}

// SAFETY: one region, the buffer's memory, which it keeps (and cannot swap) until dropped.
unsafe impl<T: 'static> DeviceState for SymmetricBuffer<T> {
    type Lent<'a>
        = CudaViewMut<'a, T>
    where
        Self: 'a;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        self.slice.regions(visit)
    }

    fn lend(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }
}

impl Communicator {
    /// A [`SymmetricBuffer`] of `len` zeroed elements on every rank: a set-up call every rank
    /// makes in the same order with the same `len`, outside any capture (like
    /// [`Communicator::barrier`], whose host steps it shares).
    ///
    /// The ranks first meet on the host and compare sizes, so a rank asking for another size
    /// (or doing something else) is [`CollectiveError::Mismatch`] on every rank, and a rank
    /// that cannot allocate is [`CollectiveError::SymmetricAlloc`] on every rank, before
    /// NCCL's own collective registration could leave anyone waiting. Errors:
    /// [`CollectiveError::SymmetricUnsupported`] before NCCL 2.27,
    /// [`CollectiveError::SetupInCapture`] inside a capture procedure (registration talks to
    /// the other ranks and cannot be recorded).
    pub fn symmetric_buffer<
        T: NcclType + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
    >(
        &self,
        len: usize,
    ) -> Result<SymmetricBuffer<T>, GraphError> {
        if let Some(graph) = crate::phase::procedure_of_thread() {
            return Err(CollectiveError::SetupInCapture {
                op: "Communicator::symmetric_buffer",
                graph,
            }
            .into());
        }
        let version = self.group().nccl_version();
        if version < MIN_NCCL_SYMMETRIC {
            return Err(CollectiveError::SymmetricUnsupported {
                found: version.to_string(),
                required: MIN_NCCL_SYMMETRIC.to_string(),
            }
            .into());
        }
        let rt = self.runtime();
        rt.context().bind_to_thread()?;
        // Saturating: a size that does not fit fails `ncclMemAlloc`, which every rank hears of.
        let bytes = len.max(1).saturating_mul(std::mem::size_of::<T>());
        // SAFETY: the version is at least 2.27 (so 2.19) and the rank's context is current.
        let allocated = unsafe { raw::mem_alloc(bytes) };
        let memory = allocated.as_ref().ok().map(|&ptr| {
            Rc::new(WindowMemory {
                ptr,
                ctx: rt.context().clone(),
                rank: self.rank(),
            })
        });
        let posted = self.meet_on_host(
            Checkpoint::Window {
                bytes,
                allocated: memory.is_some(),
            },
            "before registering a symmetric buffer",
        )?;
        let failed = posted.iter().position(|c| {
            matches!(
                c,
                Checkpoint::Window {
                    allocated: false,
                    ..
                }
            )
        });
        let (Some(memory), None) = (memory, failed) else {
            let rank = failed.unwrap_or(self.rank());
            let reason = match &allocated {
                Err(e) if rank == self.rank() => format!("ncclMemAlloc failed with {:?}", e.0),
                _ => "ncclMemAlloc failed on that rank".to_owned(),
            };
            return Err(CollectiveError::SymmetricAlloc {
                rank,
                bytes,
                reason,
            }
            .into());
        };
        // SAFETY: NCCL is at least 2.27; the communicator is alive and on this thread; the
        // memory came from `mem_alloc` with `bytes`; every rank agreed on the host just now
        // to make this same call.
        unsafe { raw::window_register(self.raw(), memory.ptr, bytes) }
            .map_err(|e| raw::error("ncclCommWindowRegister", self.rank(), e, Some(self.raw())))?;
        self.windows.borrow_mut().push(memory.clone());
        let stream = rt.stream();
        // SAFETY: `memory.ptr` holds `bytes >= len × size_of::<T>()` on this stream's device;
        // the slice never frees it (`SymmetricBuffer::drop` leaks it).
        let slice = unsafe { stream.upgrade_device_ptr::<T>(memory.ptr, len) };
        // Wrapped before anything can fail: a plain `CudaSlice` dropped on an error would free
        // NCCL's memory with cudarc's allocator (and `WindowMemory` then again with NCCL's).
        let mut buffer = SymmetricBuffer {
            slice: ManuallyDrop::new(slice),
            memory,
        };
        stream.memset_zeros(&mut *buffer.slice)?;
        Ok(buffer)
    }
}
