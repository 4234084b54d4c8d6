//! Early launch: a kernel that starts while the kernel ahead of it on the stream finishes
//! (CUDA's *programmatic dependent launch*, compute capability 9.0 and newer).
//!
//! In a graph, consecutive kernel nodes normally run strictly one after the other: the next
//! kernel's blocks are scheduled only once the previous kernel has completed, so every node
//! pays the scheduling gap plus its own prologue (loading weights, computing indices) on the
//! critical path. A kernel launched with [`EarlyLaunch`] may instead be scheduled as soon as
//! every block of the kernel before it has executed `griddepcontrol.launch_dependents` (or
//! exited). It can then do the work that does not depend on that kernel (load its weights
//! into registers) and wait with `griddepcontrol.wait` only for the part that does.
//!
//! Stream capture records the relaxed ordering as a *programmatic* graph edge, so a captured
//! graph keeps it on every replay; eager launches get it too. The kernel must cooperate:
//!
//! ```text
//! extern "C" __global__ void layer(const float *x, const float *w, float *y, int n) {
//!     float wr = w[threadIdx.x];                                  // 1. independent work
//!     asm volatile("griddepcontrol.launch_dependents;");         // 2. let the next kernel start
//!     asm volatile("griddepcontrol.wait;" ::: "memory");         // 3. wait for the previous one
//!     y[threadIdx.x] = wr * x[threadIdx.x];                       // 4. dependent work
//! }
//! ```
//!
//! The contract, which the kernel's author owns (hence `unsafe`):
//! * before `griddepcontrol.wait`, a kernel may only read memory that no kernel still running
//!   can write. Early starts chain: the kernel two places back may still be running too, so
//!   "memory the whole graph only reads" (weights, constants) is the safe rule;
//! * after `griddepcontrol.wait`, everything the kernels before it wrote is visible, as with a
//!   normal launch;
//! * `griddepcontrol.launch_dependents` only lets the next kernel be *scheduled*; it never
//!   makes this kernel's writes visible early, so it may come first thing in the kernel;
//! * a kernel that never executes `griddepcontrol.wait` gets no ordering at all once the
//!   kernel before it has let dependents start: launch such kernels with cudarc's
//!   `launch_builder`. (A kernel that never executes `launch_dependents` lets the next one
//!   start only when it exits, as in an ordinary launch.)
//!
//! Both instructions need the kernel compiled for `sm_90` or newer, which is what
//! [`Runtime::function`](crate::Runtime::function) does on such a device. Older devices
//! ignore the launch attribute and run the kernels in order.
//!
//! The builder keeps its arguments inline (up to [`MAX_ARGS`], each at most 8 bytes), so an
//! early launch allocates nothing, like a replay.

use std::ffi::c_void;
use std::mem::{align_of, size_of, MaybeUninit};

use cudarc::driver::sys;
use cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError, LaunchConfig,
};

/// Most kernel arguments one [`EarlyLaunch`] takes.
pub const MAX_ARGS: usize = 24;

/// A kernel launch that may overlap the end of the kernel before it on the stream. Build it
/// with [`Runtime::launch_early`](crate::Runtime::launch_early) or [`EarlyLaunch::new`], push
/// the arguments in the kernel's order, then [`launch`](Self::launch). See the
/// [module docs](self) for what the kernel must do.
pub struct EarlyLaunch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    slots: [u64; MAX_ARGS],
    len: usize,
}

impl std::fmt::Debug for EarlyLaunch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyLaunch")
            .field("args", &self.len)
            .finish_non_exhaustive()
    }
}

impl<'a> EarlyLaunch<'a> {
    /// A launch of `func` on `stream` with no arguments yet.
    pub fn new(stream: &'a CudaStream, func: &'a CudaFunction) -> Self {
        EarlyLaunch {
            stream,
            func,
            slots: [0; MAX_ARGS],
            len: 0,
        }
    }

    fn push_bytes<V: Copy>(&mut self, v: V) -> &mut Self {
        const {
            assert!(
                size_of::<V>() <= size_of::<u64>() && align_of::<V>() <= align_of::<u64>(),
                "an early-launch argument is at most 8 bytes: pass larger structs by pointer"
            )
        };
        assert!(
            self.len < MAX_ARGS,
            "EarlyLaunch takes at most {MAX_ARGS} kernel arguments"
        );
        let slot = &mut self.slots[self.len];
        *slot = 0;
        // SAFETY: `V` is `Copy` and fits in the 8-byte, 8-aligned slot (the const assertion
        // above), so writing it at the slot's start stays inside the slot and is aligned.
        unsafe { (slot as *mut u64).cast::<V>().write(v) };
        self.len += 1;
        self
    }

    /// A scalar argument (`int`, `float`, `unsigned long long`, …) passed by value.
    pub fn arg<V: DeviceRepr + Copy>(&mut self, value: V) -> &mut Self {
        self.push_bytes(value)
    }

    /// A device buffer the kernel reads (`const T *`).
    pub fn buf<T, B: DevicePtr<T> + ?Sized>(&mut self, buf: &B) -> &mut Self {
        let (ptr, _sync) = buf.device_ptr(self.stream);
        self.push_bytes(ptr)
    }

    /// A device buffer the kernel writes (`T *`).
    pub fn buf_mut<T, B: DevicePtrMut<T> + ?Sized>(&mut self, buf: &mut B) -> &mut Self {
        let (ptr, _sync) = buf.device_ptr_mut(self.stream);
        self.push_bytes(ptr)
    }

    /// Queues the kernel with the programmatic-stream-serialization attribute.
    ///
    /// # Safety
    /// As for any kernel launch, the arguments must match the kernel's parameters in number,
    /// order and type, and every buffer must hold what the kernel addresses for `cfg`. On top
    /// of that the kernel must follow the early-launch contract of the [module docs](self):
    /// nothing a running kernel may write is read before `griddepcontrol.wait`.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, slot) in params.iter_mut().zip(self.slots.iter_mut()).take(self.len) {
            *p = (slot as *mut u64).cast();
        }
        // SAFETY: an all-zero launch attribute is a valid value of this plain C union; the
        // id and the field of the union that goes with it are set right after.
        let mut attr: sys::CUlaunchAttribute = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `config` and `attr` live across the call; `params` holds one pointer per
        // pushed argument, each into `self.slots`, which outlives the call and holds the
        // argument's bytes. The caller vouches that the arguments match the kernel and that
        // the kernel keeps the early-launch contract.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}
