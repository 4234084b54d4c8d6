//! Scoped fork/join: GPU work on a side stream that always rejoins the runtime's stream.
//!
//! A graph can hold parallel branches: during capture, a second stream that waits on an
//! event recorded on the capture stream joins the capture, and the work queued on it
//! becomes a branch of the graph. Two things make that fragile by hand:
//!
//! * every side stream has to rejoin the capture stream before the capture ends, or the
//!   capture fails with CUDA error 904 (capturing stream has unjoined work), and an early
//!   `return` or `?` in between skips the join;
//! * the side stream has to exist before the capture: creating and using a stream inside
//!   a capture failed with CUDA error 900 on an H100.
//!
//! [`Runtime::fork`] (and [`fork_join`] for bodies whose context is the stream) takes care of
//! both: it lends a closure a side stream that waits on the runtime's stream, runs the
//! closure, and then makes the runtime's stream wait on the side stream, whether the closure
//! returned `Ok`, returned `Err` or panicked. `#[cuda_graph]` rejects every other way of
//! making a stream inside a body.
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
//! forks from two threads, get different side streams. The streams (and two events each,
//! used for the fork and the join) are kept in a process-wide table keyed by the runtime's
//! stream; entries whose runtime stream has been dropped are released by the next fork.
//!
//! # Writing the closure
//! * Queue the side branch on `side` (`side.launch_builder(&f)`, `side.memcpy_dtod(…)`).
//!   Work queued on `rt.stream()` *inside* the closure runs concurrently with the side
//!   branch; work queued after `fork` returns waits for both.
//! * `rt.blas()` is bound to the runtime's stream, not to the side stream.
//! * Free side-branch temporaries inside the closure: a buffer allocated on `side` is freed
//!   on `side` when dropped, and a free queued on a side stream after the join is work the
//!   capture never sees rejoin (CUDA error 904). Allocate buffers that outlive the fork on
//!   `rt.stream()`.

use std::ops::Deref;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cudarc::driver::{sys, CudaEvent, CudaStream, DriverError};

use crate::capture::{self, Phase};
use crate::error::GraphError;
use crate::runtime::Runtime;

/// The side stream lent to the closure of [`Runtime::fork`].
///
/// Dereferences to the stream (`Arc<CudaStream>`), so cudarc's calls work on it directly:
/// `side.launch_builder(&f)`, `side.memcpy_dtod(x, y)`. Do not keep a clone of the stream
/// past the closure: work queued on it after the join is not part of the graph.
#[derive(Debug)]
pub struct ForkedStream<'f> {
    stream: &'f Arc<CudaStream>,
}

impl ForkedStream<'_> {
    /// The side stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl Deref for ForkedStream<'_> {
    type Target = Arc<CudaStream>;

    fn deref(&self) -> &Arc<CudaStream> {
        self.stream
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
    /// for both.
    ///
    /// Side streams are created by a fork that runs outside a capture, and cached for this
    /// runtime: the warmup runs of a `#[cuda_graph]` body create the ones it needs, and its
    /// capture only reuses them (creating a stream inside a capture fails with CUDA error
    /// 900). Each fork has its side stream to itself while the closure runs, so nested forks
    /// and forks from two threads use different streams.
    ///
    /// Inside the closure, free the side branch's temporaries before it returns: a buffer
    /// allocated on `side` is freed on `side`, and a free queued there after the join is
    /// work that never rejoins the capture (CUDA error 904). `rt.blas()` stays bound to the
    /// runtime's stream.
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
    ///         side.memcpy_dtod(x, a)?;        // on the side stream
    ///         rt.stream().memcpy_dtod(x, b)?; // concurrently, on the runtime's stream
    ///         Ok(())
    ///     })?;
    ///     // here the runtime's stream has waited for both copies
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// What `work` returns; a driver error of the fork or the join; and, while capturing, an
    /// error when no side stream was created before the capture (the body forks only when
    /// captured, or more deeply than in its warmup runs).
    #[track_caller]
    pub fn fork<R>(
        &self,
        work: impl FnOnce(&ForkedStream<'_>) -> Result<R, GraphError>,
    ) -> Result<R, GraphError> {
        fork_at(self.stream(), Location::caller(), work)
    }
}

/// [`Runtime::fork`] for a body whose context is the runtime's stream
/// (`stream: &Arc<CudaStream>`).
///
/// `main` must be a stream of a context with cudarc's event tracking off, as the runtime's
/// is: with tracking on, buffers carry events recorded outside the capture and the capture
/// fails with CUDA error 905.
#[track_caller]
pub fn fork_join<R>(
    main: &Arc<CudaStream>,
    work: impl FnOnce(&ForkedStream<'_>) -> Result<R, GraphError>,
) -> Result<R, GraphError> {
    fork_at(main, Location::caller(), work)
}

fn fork_at<R>(
    main: &Arc<CudaStream>,
    location: &'static Location<'static>,
    work: impl FnOnce(&ForkedStream<'_>) -> Result<R, GraphError>,
) -> Result<R, GraphError> {
    let lease = Lease::take(main, location)?;
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
    let result = work(&ForkedStream {
        stream: &slot.stream,
    });
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
        self.slot.busy.store(false, Ordering::Release);
    }
}

impl Lease {
    fn take(
        main: &Arc<CudaStream>,
        location: &'static Location<'static>,
    ) -> Result<Lease, GraphError> {
        let released = {
            let mut all = pools();
            let (alive, released): (Vec<Pool>, Vec<Pool>) = std::mem::take(&mut *all)
                .into_iter()
                .partition(|p| p.main.strong_count() > 0);
            *all = alive;
            let free = all
                .iter()
                .find(|p| std::ptr::eq(p.main.as_ptr(), Arc::as_ptr(main)))
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

        if let Some(graph) = capturing(main)? {
            return Err(GraphError::SideStreamInCapture { graph, location });
        }
        let ctx = main.context();
        let slot = Arc::new(Slot {
            stream: ctx.new_stream()?,
            forked: ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            joined: ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            busy: AtomicBool::new(true),
        });
        let mut all = pools();
        match all
            .iter_mut()
            .find(|p| std::ptr::eq(p.main.as_ptr(), Arc::as_ptr(main)))
        {
            Some(pool) => pool.slots.push(slot.clone()),
            None => all.push(Pool {
                main: Arc::downgrade(main),
                slots: vec![slot.clone()],
            }),
        }
        Ok(Lease { slot })
    }
}

/// The graph being captured on `main`, if any: by this thread through the runtime, or by
/// anyone (a capture begun by hand, another thread) as the driver reports it.
fn capturing(main: &CudaStream) -> Result<Option<&'static str>, GraphError> {
    if let Phase::Capture { graph } = capture::phase() {
        return Ok(Some(graph));
    }
    let status = main.capture_status()?;
    Ok((status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some("a graph"))
}
