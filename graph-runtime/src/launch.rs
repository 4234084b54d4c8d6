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
//!     asm volatile("griddepcontrol.wait;" ::: "memory");         // 2. wait for the previous one
//!     asm volatile("griddepcontrol.launch_dependents;");         // 3. let the next kernel start
//!     y[threadIdx.x] = wr * x[threadIdx.x];                       // 4. dependent work
//! }
//! ```
//!
//! Put `launch_dependents` after the wait. Before it, it lets the next kernel be scheduled at
//! once, which lets that one's next be scheduled at once, and so on down the graph: the blocks
//! of many kernels then sit waiting on the SMs. On an H100, a chain of 10 000 one-block kernels
//! took 0.98 µs per node with the trigger first (no better than in order) and 0.69 µs with it
//! after the wait (in order: 0.98); see `examples/02-chain.rs`.
//!
//! The contract, which the kernel's author owns (hence `unsafe`):
//! * before `griddepcontrol.wait`, a kernel may only read memory that no kernel still running
//!   can write. Early starts chain: the kernel two places back may still be running too, so
//!   "memory the whole graph only reads" (weights, constants) is the safe rule;
//! * after `griddepcontrol.wait`, everything the kernels before it wrote is visible, as with a
//!   normal launch;
//! * `griddepcontrol.launch_dependents` only lets the next kernel be *scheduled*; it never
//!   makes this kernel's writes visible early, so it is safe anywhere in the kernel (where it
//!   goes is a matter of speed, above);
//! * a kernel that never executes `griddepcontrol.wait` gets no ordering at all once the
//!   kernel before it has let dependents start: launch such kernels with cudarc's
//!   `launch_builder`. (A kernel that never executes `launch_dependents` lets the next one
//!   start only when it exits, as in an ordinary launch.)
//!
//! Both instructions need the kernel compiled for `sm_90` or newer, which is what
//! [`Runtime::function`](crate::Runtime::function) does on such a device. Older devices
//! ignore the launch attribute and run the kernels in order, and so does the body of a
//! `graph_while` / `graph_if` ([`crate::conditional`]), which keeps to ordinary edges.
//!
//! The builder keeps its arguments inline (up to [`MAX_ARGS`], each at most 8 bytes), so an
//! early launch allocates nothing, like a replay.

use std::ffi::c_void;
use std::mem::{align_of, size_of, MaybeUninit};

use cudarc::driver::sys;
use cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError, LaunchConfig,
};

/// Most kernel arguments one [`EarlyLaunch`] (or a side-stream launch) takes.
pub const MAX_ARGS: usize = 24;

/// Kernel arguments kept inline, 8 bytes each, so that building a launch allocates nothing.
pub(crate) struct ArgSlots {
    slots: [u64; MAX_ARGS],
    len: usize,
}

impl ArgSlots {
    pub(crate) fn new() -> Self {
        ArgSlots {
            slots: [0; MAX_ARGS],
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends one argument's bytes.
    pub(crate) fn push<V: Copy>(&mut self, v: V) {
        const {
            assert!(
                size_of::<V>() <= size_of::<u64>() && align_of::<V>() <= align_of::<u64>(),
                "a kernel argument of this builder is at most 8 bytes: pass larger structs by pointer"
            )
        };
        assert!(
            self.len < MAX_ARGS,
            "this launch builder takes at most {MAX_ARGS} kernel arguments"
        );
        let slot = &mut self.slots[self.len];
        *slot = 0;
        // SAFETY: `V` is `Copy` and fits in the 8-byte, 8-aligned slot (the const assertion
        // above), so writing it at the slot's start stays inside the slot and is aligned.
        unsafe { (slot as *mut u64).cast::<V>().write(v) };
        self.len += 1;
    }

    /// Queues `func` on `stream` with the pushed arguments and the launch attributes.
    ///
    /// # Safety
    /// The arguments match the kernel's parameters in number, order and type; every buffer
    /// holds what the kernel addresses for `cfg`; `func` and `stream` belong to one context.
    pub(crate) unsafe fn launch(
        &mut self,
        stream: &CudaStream,
        func: &CudaFunction,
        cfg: LaunchConfig,
        attrs: &mut [sys::CUlaunchAttribute],
    ) -> Result<(), DriverError> {
        stream.context().bind_to_thread()?;
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, slot) in params.iter_mut().zip(self.slots.iter_mut()).take(self.len) {
            *p = (slot as *mut u64).cast();
        }
        // SAFETY: `params` holds one pointer per pushed argument, each into `self.slots`,
        // which outlives the call and holds the argument's bytes; the caller vouches for the
        // rest.
        unsafe {
            crate::driver::launch_kernel(
                func.cu_function(),
                stream.cu_stream(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                attrs,
                &mut params[..self.len],
            )
        }
    }
}

/// A kernel launch that may overlap the end of the kernel before it on the stream. Build it
/// with [`Runtime::launch_early`](crate::Runtime::launch_early) or [`EarlyLaunch::new`], push
/// the arguments in the kernel's order, then [`launch`](Self::launch). See the
/// [module docs](self) for what the kernel must do.
pub struct EarlyLaunch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    args: ArgSlots,
}

impl std::fmt::Debug for EarlyLaunch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyLaunch")
            .field("args", &self.args.len())
            .finish_non_exhaustive()
    }
}

impl<'a> EarlyLaunch<'a> {
    /// A launch of `func` on `stream` with no arguments yet.
    pub fn new(stream: &'a CudaStream, func: &'a CudaFunction) -> Self {
        EarlyLaunch {
            stream,
            func,
            args: ArgSlots::new(),
        }
    }

    /// A scalar argument (`int`, `float`, `unsigned long long`, …) passed by value.
    pub fn arg<V: DeviceRepr + Copy>(&mut self, value: V) -> &mut Self {
        self.args.push(value);
        self
    }

    /// A device buffer the kernel reads (`const T *`).
    pub fn buf<T, B: DevicePtr<T> + ?Sized>(&mut self, buf: &B) -> &mut Self {
        let (ptr, _sync) = buf.device_ptr(self.stream);
        self.args.push(ptr);
        self
    }

    /// A device buffer the kernel writes (`T *`).
    pub fn buf_mut<T, B: DevicePtrMut<T> + ?Sized>(&mut self, buf: &mut B) -> &mut Self {
        let (ptr, _sync) = buf.device_ptr_mut(self.stream);
        self.args.push(ptr);
        self
    }

    /// Queues the kernel with the programmatic-stream-serialization attribute.
    ///
    /// # Safety
    /// As for any kernel launch, the arguments must match the kernel's parameters in number,
    /// order and type, and every buffer must hold what the kernel addresses for `cfg`. On top
    /// of that the kernel must follow the early-launch contract of the [module docs](self):
    /// nothing a running kernel may write is read before `griddepcontrol.wait`.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        // SAFETY: an all-zero launch attribute is a valid value of this plain C union; the
        // id and the field of the union that goes with it are set right after.
        let mut attr: sys::CUlaunchAttribute = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        // Inside the body of a `graph_while` / `graph_if` the kernel is launched in order: CUDA
        // documents which node kinds a conditional body may hold, not whether programmatic
        // edges are among what it allows, so the body keeps to ordinary edges.
        if crate::phase::in_conditional_body() {
            // SAFETY: as below, without the early-launch attribute (an ordinary launch).
            return unsafe { self.args.launch(self.stream, self.func, cfg, &mut []) };
        }
        crate::phase::note_early_launch();
        // SAFETY: the caller vouches for the arguments and the early-launch contract.
        unsafe {
            self.args
                .launch(self.stream, self.func, cfg, std::slice::from_mut(&mut attr))
        }
    }
}
