//! Scoped fork/join: GPU work on a side stream that always rejoins the runtime's stream, with
//! the borrow checker guarding every buffer the side branch touches.
//!
//! A graph can hold parallel branches: during capture, a second stream that waits on an
//! event recorded on the capture stream joins the capture, and the work queued on it
//! becomes a branch of the graph. Three things make that fragile by hand:
//!
//! * every side stream has to rejoin the capture stream before the capture ends, or the
//!   capture fails with CUDA error 904 (capturing stream has unjoined work), and an early
//!   `return` or `?` in between skips the join;
//! * the side stream has to exist before the capture: creating and using a stream inside
//!   a capture failed with CUDA error 900 on an H100;
//! * a buffer the side branch reads must not be freed before the join. Its free is queued
//!   on the stream that owns it (the runtime's stream), which has not waited for the side
//!   branch yet, so the next allocation gets the same memory while the side kernel still
//!   reads it: every output corrupted, eagerly and in every replay of a captured graph.
//!
//! [`Runtime::fork`] (and [`fork_join`] for bodies whose context is the stream) takes care of
//! all three. It lends a closure a [`ForkedStream`] that waits on the runtime's stream, runs
//! the closure, and then makes the runtime's stream wait on the side stream, whether the
//! closure returned `Ok`, returned `Err` or panicked. The side branch reaches buffers only
//! through handles that borrow them until the join ([`ForkedStream::read`],
//! [`ForkedStream::write`]), like the threads of `std::thread::scope`:
//!
//! * a buffer declared inside the closure cannot be handed to the side branch (it does not
//!   live until the join), so none can be freed while the side stream uses it;
//! * a buffer the side branch writes is borrowed mutably until the join, so the runtime's
//!   stream cannot touch it concurrently;
//! * side temporaries come from [`ForkedStream::scratch`], freed on the side stream itself,
//!   after its work and before the join.
//!
//! # Where the side streams come from
//! Side streams are created the first time a fork needs one **outside** a capture, and
//! cached for that runtime stream: a `#[cuda_graph]` body always runs at least once eagerly
//! (the warmup runs, `warmup >= 1`), so by the time it is captured the streams it forks onto
//! exist already and the capture only reuses them. A fork that would have to create a stream
//! while capturing (for instance one that only runs under `is_capturing()`) is refused with
//! a typed error instead of letting CUDA invalidate the capture.
//!
//! Each fork has its side stream to itself for the duration of the closure: nested forks, or
//! forks from two threads, get different side streams. Inside a capture procedure the side
//! streams a fork gives back stay the procedure's until it ends, so that another thread
//! forking on a shared runtime between the warmup and the capture cannot take the stream
//! the capture needs (it would then have to create one while capturing). The streams (and
//! two events each, used for the fork and the join) are kept in a process-wide table keyed by
//! the runtime's stream; entries whose runtime stream has been dropped are released by the
//! next fork.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cudarc::driver::{
    sys, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    DriverError, LaunchConfig, ValidAsZeroBits,
};

use crate::error::GraphError;
use crate::launch::ArgSlots;
use crate::phase::refuse_while_capturing;
use crate::runtime::Runtime;

/// Makes a lifetime invariant, so a handle of one fork cannot be used by another.
type Invariant<'f> = PhantomData<fn(&'f ()) -> &'f ()>;

/// The side stream lent to the closure of [`Runtime::fork`]: it launches kernels and copies
/// on the side branch, on buffers borrowed until the join.
///
/// `'f` is the fork's scope: it lasts until the join, so anything the side branch uses must
/// outlive the fork (`'env` is the environment the fork was called from).
pub struct ForkedStream<'f, 'env: 'f> {
    stream: &'f Arc<CudaStream>,
    scratch: RefCell<Vec<CudaSlice<u8>>>,
    _scope: Invariant<'f>,
    _env: Invariant<'env>,
}

impl std::fmt::Debug for ForkedStream<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkedStream")
            .field("stream", &self.stream.cu_stream())
            .finish_non_exhaustive()
    }
}

/// A buffer the side branch of a fork reads, borrowed until the join (see
/// [`ForkedStream::read`]).
pub struct SideRef<'f, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    _buf: PhantomData<&'f [T]>,
    _scope: Invariant<'f>,
}

/// A buffer the side branch of a fork writes (and may read), borrowed exclusively until the
/// join (see [`ForkedStream::write`], [`ForkedStream::scratch`]).
pub struct SideMut<'f, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    _buf: PhantomData<&'f mut [T]>,
    _scope: Invariant<'f>,
}

macro_rules! side_handle {
    ($t:ident) => {
        impl<T> Clone for $t<'_, T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for $t<'_, T> {}
        impl<T> std::fmt::Debug for $t<'_, T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("ptr", &self.ptr)
                    .field("len", &self.len)
                    .finish()
            }
        }
        impl<T> $t<'_, T> {
            /// Elements in the buffer.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the buffer is empty.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
        }
    };
}
side_handle!(SideRef);
side_handle!(SideMut);

mod sealed {
    /// Only the fork's own handles: [`ForkedStream::memcpy`](super::ForkedStream::memcpy)
    /// copies from the address a `SideRead` reports, which is sound only for handles made
    /// by the fork from a borrowed buffer.
    pub trait Sealed {}
    impl<T> Sealed for super::SideRef<'_, T> {}
    impl<T> Sealed for super::SideMut<'_, T> {}
}

/// A buffer the side branch can read: a [`SideRef`] or a [`SideMut`] (sealed: no other type
/// can claim an address for the side branch).
pub trait SideRead<'f, T>: Copy + sealed::Sealed {
    /// The device address and the element count.
    fn raw(&self) -> (sys::CUdeviceptr, usize);
}

impl<'f, T> SideRead<'f, T> for SideRef<'f, T> {
    fn raw(&self) -> (sys::CUdeviceptr, usize) {
        (self.ptr, self.len)
    }
}

impl<'f, T> SideRead<'f, T> for SideMut<'f, T> {
    fn raw(&self) -> (sys::CUdeviceptr, usize) {
        (self.ptr, self.len)
    }
}

impl<'f, 'env> ForkedStream<'f, 'env> {
    /// The side stream's CUDA handle, to tell streams apart (in logs, in tests).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Lends `buf` to the side branch for reading until the join. The runtime's stream may
    /// read it concurrently; nobody can free or write it before the join.
    pub fn read<T, B: DevicePtr<T> + ?Sized>(&self, buf: &'f B) -> SideRef<'f, T> {
        let (ptr, _sync) = buf.device_ptr(self.stream);
        SideRef {
            ptr,
            len: buf.len(),
            _buf: PhantomData,
            _scope: PhantomData,
        }
    }

    /// Lends `buf` to the side branch for writing (and reading) until the join; nothing else
    /// can touch it before then.
    pub fn write<T, B: DevicePtrMut<T> + ?Sized>(&self, buf: &'f mut B) -> SideMut<'f, T> {
        let len = buf.len();
        let (ptr, _sync) = buf.device_ptr_mut(self.stream);
        SideMut {
            ptr,
            len,
            _buf: PhantomData,
            _scope: PhantomData,
        }
    }

    /// A zeroed temporary of `len` elements for the side branch, allocated on the side
    /// stream and freed there when the closure returns, after the side branch's work and
    /// before the join (in a capture: allocation and free nodes on the side branch).
    pub fn scratch<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<SideMut<'f, T>, GraphError> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        let buf = self.stream.alloc_zeros::<u8>(bytes)?;
        let ptr = {
            let (ptr, _sync) = buf.device_ptr(self.stream);
            ptr
        };
        self.scratch.borrow_mut().push(buf);
        Ok(SideMut {
            ptr,
            len,
            _buf: PhantomData,
            _scope: PhantomData,
        })
    }

    /// A kernel launch on the side stream. Buffers are passed as [`SideRef`] / [`SideMut`]
    /// handles, scalars by value.
    pub fn launch_builder<'a>(&'a self, func: &'a CudaFunction) -> SideLaunch<'a, 'f> {
        SideLaunch {
            stream: self.stream,
            func,
            args: ArgSlots::new(),
            _scope: PhantomData,
        }
    }

    /// Copies `src` into `dst` on the side stream.
    ///
    /// # Panics
    /// If the two buffers differ in length.
    pub fn memcpy<T>(
        &self,
        src: impl SideRead<'f, T>,
        dst: SideMut<'f, T>,
    ) -> Result<(), GraphError> {
        let (src, n) = src.raw();
        assert_eq!(
            n, dst.len,
            "side-stream copy between buffers of {n} and {} elements",
            dst.len
        );
        // SAFETY: both handles borrow (or, for scratch, are) allocations of at least `n`
        // elements that live until the join, after this copy on the side stream.
        unsafe {
            crate::driver::copy_dtod(
                dst.ptr,
                src,
                n * std::mem::size_of::<T>(),
                self.stream.cu_stream(),
            )
        }?;
        Ok(())
    }

    /// Fills `dst` with zero bytes on the side stream.
    pub fn memset_zeros<T: ValidAsZeroBits>(&self, dst: SideMut<'f, T>) -> Result<(), GraphError> {
        // SAFETY: `dst` borrows (or is) an allocation of `dst.len` elements that lives until
        // the join, after this fill on the side stream.
        unsafe {
            crate::driver::fill_bytes(
                dst.ptr,
                0,
                dst.len * std::mem::size_of::<T>(),
                self.stream.cu_stream(),
            )
        }?;
        Ok(())
    }

    /// The side stream itself, for cudarc calls this type does not offer.
    ///
    /// # Safety
    /// Every buffer used on the returned stream must stay allocated until the join and must
    /// not be written by another stream before then: these are the guarantees the handles of
    /// this type give and a raw stream does not. Work queued on it after the closure returns
    /// is not part of the fork (nor of a captured graph).
    pub unsafe fn raw_stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

/// A kernel launch on a fork's side stream (see [`ForkedStream::launch_builder`]). Arguments
/// are kept inline, so building it allocates nothing.
pub struct SideLaunch<'a, 'f> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    args: ArgSlots,
    _scope: Invariant<'f>,
}

impl std::fmt::Debug for SideLaunch<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SideLaunch")
            .field("args", &self.args.len())
            .finish_non_exhaustive()
    }
}

impl<'f> SideLaunch<'_, 'f> {
    /// A scalar argument passed by value.
    pub fn arg<V: DeviceRepr + Copy>(&mut self, value: V) -> &mut Self {
        self.args.push(value);
        self
    }

    /// A buffer the kernel reads (`const T *`).
    pub fn buf<T>(&mut self, buf: impl SideRead<'f, T>) -> &mut Self {
        self.args.push(buf.raw().0);
        self
    }

    /// A buffer the kernel writes (`T *`).
    pub fn buf_mut<T>(&mut self, buf: SideMut<'f, T>) -> &mut Self {
        self.args.push(buf.ptr);
        self
    }

    /// Queues the kernel on the side stream.
    ///
    /// # Safety
    /// The arguments match the kernel's parameters in number, order and type, and every
    /// buffer holds what the kernel addresses for `cfg`.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        // SAFETY: the caller vouches for the arguments; the buffers are borrowed until the
        // join, which comes after this launch on the side stream.
        unsafe { self.args.launch(self.stream, self.func, cfg, &mut []) }
    }
}

impl Runtime {
    /// Runs `work` with a side stream that first waits for everything queued so far on
    /// [`Runtime::stream`], then makes [`Runtime::stream`] wait for everything `work` queued
    /// on the side stream, even when `work` fails or panics.
    ///
    /// Inside a `#[cuda_graph]` body this records a parallel branch into the graph; eagerly
    /// it runs the same work with the same ordering. Work queued on `rt.stream()` inside the
    /// closure runs concurrently with the side branch; work queued after `fork` returns waits
    /// for both. The side branch reaches buffers through [`ForkedStream::read`] and
    /// [`ForkedStream::write`], which borrow them until the join, so nothing the side branch
    /// uses can be freed, or written by the runtime's stream, before the join.
    ///
    /// Side streams are created by a fork that runs outside a capture, and cached for this
    /// runtime: the warmup runs of a `#[cuda_graph]` body create the ones it needs, and its
    /// capture only reuses them (creating a stream inside a capture fails with CUDA error
    /// 900). Each fork has its side stream to itself while the closure runs, so nested forks
    /// and forks from two threads use different streams.
    ///
    /// ```no_run
    /// # use graph_runtime::cudarc::driver::CudaSlice;
    /// # use graph_runtime::{cuda_graph, GraphError, Runtime};
    /// #[cuda_graph(warmup = 2)]
    /// fn two_copies(
    ///     rt: &Runtime,
    ///     x: &CudaSlice<f32>,
    ///     a: &mut CudaSlice<f32>,
    ///     b: &mut CudaSlice<f32>,
    /// ) -> Result<(), GraphError> {
    ///     rt.fork(|side| {
    ///         side.memcpy(side.read(x), side.write(a))?; // on the side stream
    ///         rt.stream().memcpy_dtod(x, b)?;            // concurrently, on the runtime's stream
    ///         Ok(())
    ///     })?;
    ///     // here the runtime's stream has waited for both copies
    ///     Ok(())
    /// }
    /// # fn main() {}
    /// ```
    ///
    /// # Errors
    /// What `work` returns; a driver error of the fork or the join; and, while capturing, an
    /// error when no side stream was created before the capture (the body forks only when
    /// captured, or more deeply than in its warmup runs).
    #[track_caller]
    pub fn fork<'env, R>(
        &'env self,
        work: impl for<'f> FnOnce(&'f ForkedStream<'f, 'env>) -> Result<R, GraphError>,
    ) -> Result<R, GraphError> {
        fork_at(self.stream(), self.fork_key(), Location::caller(), work)
    }
}

/// [`Runtime::fork`] for a body whose context is the runtime's stream
/// (`stream: &Arc<CudaStream>`).
///
/// `main` must be a stream of a context with cudarc's event tracking off, as the runtime's
/// is: with tracking on, buffers carry events recorded outside the capture and the capture
/// fails with CUDA error 905.
#[track_caller]
pub fn fork_join<'env, R>(
    main: &'env Arc<CudaStream>,
    work: impl for<'f> FnOnce(&'f ForkedStream<'f, 'env>) -> Result<R, GraphError>,
) -> Result<R, GraphError> {
    // The side streams of a runtime's stream and of its capture stream are one pool.
    let key = Runtime::find_by_stream(main).map(|rt| rt.fork_key().clone());
    fork_at(main, key.as_ref().unwrap_or(main), Location::caller(), work)
}

/// Forks off `main`, with a side stream of the pool kept for `key` (the runtime's stream,
/// also when `main` is its capture stream: the warmup creates the side streams that the
/// capture reuses).
fn fork_at<'env, R>(
    main: &'env Arc<CudaStream>,
    key: &Arc<CudaStream>,
    location: &'static Location<'static>,
    work: impl for<'f> FnOnce(&'f ForkedStream<'f, 'env>) -> Result<R, GraphError>,
) -> Result<R, GraphError> {
    if crate::phase::in_conditional_body() {
        // Eagerly too, so that the warmup refuses what the capture could not record.
        return Err(GraphError::ConditionMisuse {
            construct: "fork",
            location,
            problem: "it is inside the closure of a `graph_while`, `graph_if` or `graph_while_unrolled`, \
                      whose body CUDA limits to kernels, memsets, device copies and nested conditionals: \
                      the side stream would be cut off from the body. Fix: fork outside the construct (a \
                      construct inside a fork's closure is refused too), or queue both halves on the \
                      runtime's stream inside the closure"
                .into(),
        });
    }
    let lease = Lease::take(main, key, location)?;
    let slot = &*lease.slot;
    slot.forked.record(main)?;
    slot.stream.wait(&slot.forked)?;
    // From here on the side stream follows `main` (and, while capturing, is part of the
    // capture): it must rejoin on every path.
    let mut rejoin = Rejoin {
        main,
        slot,
        done: false,
    };
    let side = ForkedStream {
        stream: &slot.stream,
        scratch: RefCell::new(Vec::new()),
        _scope: PhantomData,
        _env: PhantomData,
    };
    let result = {
        let _inside = crate::phase::FrameScope::fork();
        work(&side)
    };
    // Side temporaries are freed on the side stream, after its work and before the join.
    drop(side.scratch.take());
    let joined = rejoin.now();
    let value = result?;
    joined?;
    Ok(value)
}

/// Makes `main` wait for the side stream: explicitly through [`Rejoin::now`], or on drop
/// when the closure panicked.
struct Rejoin<'a> {
    main: &'a CudaStream,
    slot: &'a Slot,
    done: bool,
}

impl Rejoin<'_> {
    fn now(&mut self) -> Result<(), DriverError> {
        self.done = true;
        self.slot.joined.record(&self.slot.stream)?;
        self.main.wait(&self.slot.joined)
    }
}

impl Drop for Rejoin<'_> {
    fn drop(&mut self) {
        if !self.done {
            let ctx = self.main.context().clone();
            ctx.record_err(self.now());
        }
    }
}

/// One side stream with its fork and join events.
struct Slot {
    /// The runtime stream whose pool holds the slot (compared by address only).
    key: usize,
    stream: Arc<CudaStream>,
    forked: CudaEvent,
    joined: CudaEvent,
    busy: AtomicBool,
}

/// The side streams made for one runtime stream.
struct Pool {
    main: Weak<CudaStream>,
    slots: Vec<Arc<Slot>>,
}

static POOLS: Mutex<Vec<Pool>> = Mutex::new(Vec::new());

fn pools() -> MutexGuard<'static, Vec<Pool>> {
    POOLS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Exclusive use of one side stream; gives it back on drop.
struct Lease {
    slot: Arc<Slot>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !crate::phase::in_procedure() {
            self.slot.busy.store(false, Ordering::Release);
            return;
        }
        // Kept (still busy) for this thread's procedure, and given back when it ends.
        let first = KEPT.with(|kept| {
            let mut kept = kept.borrow_mut();
            kept.push(self.slot.clone());
            kept.len() == 1
        });
        if first {
            crate::phase::at_procedure_end(Box::new(|| {
                for slot in KEPT.with(|kept| std::mem::take(&mut *kept.borrow_mut())) {
                    slot.busy.store(false, Ordering::Release);
                }
            }));
        }
    }
}

thread_local! {
    /// The side streams this thread's capture procedure used and keeps until it ends.
    static KEPT: RefCell<Vec<Arc<Slot>>> = const { RefCell::new(Vec::new()) };
}

impl Lease {
    fn take(
        main: &Arc<CudaStream>,
        key: &Arc<CudaStream>,
        location: &'static Location<'static>,
    ) -> Result<Lease, GraphError> {
        let kept = KEPT.with(|kept| {
            let mut kept = kept.borrow_mut();
            let at = kept
                .iter()
                .position(|s| s.key == Arc::as_ptr(key) as usize)?;
            Some(kept.swap_remove(at))
        });
        if let Some(slot) = kept {
            return Ok(Lease { slot });
        }
        let released = {
            let mut all = pools();
            let (alive, released): (Vec<Pool>, Vec<Pool>) = std::mem::take(&mut *all)
                .into_iter()
                .partition(|p| p.main.strong_count() > 0);
            *all = alive;
            let free = all
                .iter()
                .find(|p| std::ptr::eq(p.main.as_ptr(), Arc::as_ptr(key)))
                .and_then(|p| {
                    p.slots.iter().find(|s| {
                        s.busy
                            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                    })
                })
                .cloned();
            if let Some(slot) = free {
                drop(all);
                drop(released);
                return Ok(Lease { slot });
            }
            released
        };
        // Streams of dropped runtimes are destroyed outside the lock.
        drop(released);

        refuse_new_stream_while_capturing(main, location)?;
        let ctx = main.context();
        if ctx.is_event_tracking() {
            return Err(GraphError::EventTracking {
                during: "creating a side stream for a fork",
            });
        }
        let slot = Arc::new(Slot {
            key: Arc::as_ptr(key) as usize,
            stream: ctx.new_stream()?,
            forked: ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            joined: ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            busy: AtomicBool::new(true),
        });
        let mut all = pools();
        match all
            .iter_mut()
            .find(|p| std::ptr::eq(p.main.as_ptr(), Arc::as_ptr(key)))
        {
            Some(pool) => pool.slots.push(slot.clone()),
            None => all.push(Pool {
                main: Arc::downgrade(key),
                slots: vec![slot.clone()],
            }),
        }
        Ok(Lease { slot })
    }
}

/// Refuses to create a side stream while `main` captures: by this thread through the
/// runtime, or by anyone (a capture begun by hand, another thread) as the driver reports it.
fn refuse_new_stream_while_capturing(
    main: &CudaStream,
    location: &'static Location<'static>,
) -> Result<(), GraphError> {
    refuse_while_capturing(|graph| GraphError::SideStreamInCapture { graph, location })?;
    let status = main.capture_status()?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Err(GraphError::SideStreamInCapture {
            graph: "a graph",
            location,
        });
    }
    Ok(())
}
