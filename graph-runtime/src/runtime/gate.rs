//! [`StreamGate`]: keeps replays out of a runtime's stream while it is capturing.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::GraphError;

/// Keeps replays, and other threads' use of the stream, out of a stream while it is
/// capturing.
///
/// Bit 63 is set while a capture records; the low bits count launches in flight. A replay
/// adds one, checks the bit, launches, and subtracts one: two uncontended atomic operations.
/// A capture sets the bit only when no launch is in flight. While the bit is set, a replay
/// from the capturing thread (a graph replayed inside a body) is refused, and a replay from
/// any other thread waits until the capture has ended, as does another thread asking the
/// runtime for its stream ([`StreamGate::wait_for_other_capture`]): on a shared runtime,
/// other threads' work is never recorded into a capture.
#[derive(Default)]
pub(crate) struct StreamGate {
    pub(super) state: AtomicU64,
    /// The token of the thread that records a capture now, 0 when none (see [`thread_token`]).
    capturer: AtomicU64,
    /// Whether captures record on a stream of their own: then the stream the gate guards is
    /// never capturing, other threads never wait, and only the capturing thread's own replays
    /// are refused.
    private: bool,
}

/// A number for the calling thread, unique in the process and never 0.
pub(crate) fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TOKEN.with(|t| *t)
}

const CAPTURING: u64 = 1 << 63;

/// Takes one launch off the gate's count when dropped.
struct Leave<'a>(&'a AtomicU64);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl StreamGate {
    /// A gate for a runtime whose captures record on a stream of their own (`private`), or
    /// on the guarded stream itself.
    pub(crate) fn new(private: bool) -> Self {
        StreamGate {
            private,
            ..Self::default()
        }
    }

    /// Whether the calling thread records a capture of this runtime now.
    #[inline]
    pub(crate) fn captured_by_this_thread(&self) -> bool {
        let c = self.capturer.load(Ordering::Acquire);
        c != 0 && c == thread_token()
    }

    /// Runs `launch` unless the stream is capturing.
    #[inline]
    pub(crate) fn launch<R>(
        &self,
        graph: &'static str,
        launch: impl FnOnce() -> Result<R, GraphError>,
    ) -> Result<R, GraphError> {
        if self.private {
            // The replayed stream never captures: only a replay inside a body is refused (it
            // would run once, now, instead of being recorded).
            if self.captured_by_this_thread() {
                return Err(GraphError::StreamCapturing { graph });
            }
            return launch();
        }
        loop {
            let prev = self.state.fetch_add(1, Ordering::Acquire);
            // Leaves the gate also when `launch` panics, so a later capture does not wait
            // forever.
            let leave = Leave(&self.state);
            if prev & CAPTURING == 0 {
                return launch();
            }
            if self.capturer.load(Ordering::Acquire) == thread_token() {
                return Err(GraphError::StreamCapturing { graph });
            }
            // Another thread captures on this stream: wait for it, out of the gate.
            drop(leave);
            self.wait_for_other_capture();
        }
    }

    /// Waits while a thread other than the caller captures on the stream.
    #[inline]
    pub(crate) fn wait_for_other_capture(&self) {
        if self.private || self.state.load(Ordering::Acquire) & CAPTURING == 0 {
            return;
        }
        let me = thread_token();
        while self.state.load(Ordering::Acquire) & CAPTURING != 0
            && self.capturer.load(Ordering::Acquire) != me
        {
            std::thread::yield_now();
        }
    }

    /// Marks the stream as capturing by the calling thread once no launch is in flight.
    pub(crate) fn begin_capture(&self) {
        if self.private {
            self.capturer.store(thread_token(), Ordering::Release);
            return;
        }
        while self
            .state
            .compare_exchange_weak(0, CAPTURING, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        self.capturer.store(thread_token(), Ordering::Release);
    }

    pub(crate) fn end_capture(&self) {
        self.capturer.store(0, Ordering::Release);
        if !self.private {
            self.state.fetch_and(!CAPTURING, Ordering::Release);
        }
    }
}
