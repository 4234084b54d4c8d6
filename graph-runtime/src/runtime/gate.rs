//! [`StreamGate`]: keeps replays out of a runtime's stream while it is capturing.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::GraphError;

/// Keeps replays out of a stream while it is capturing.
///
/// Bit 63 is set while a capture records; the low bits count launches in flight. A replay
/// adds one, checks the bit, launches, and subtracts one: two uncontended atomic operations.
/// A capture sets the bit only when no launch is in flight.
#[derive(Default)]
pub(crate) struct StreamGate {
    pub(super) state: AtomicU64,
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
    /// Runs `launch` unless the stream is capturing.
    #[inline]
    pub(crate) fn launch<R>(
        &self,
        graph: &'static str,
        launch: impl FnOnce() -> Result<R, GraphError>,
    ) -> Result<R, GraphError> {
        let prev = self.state.fetch_add(1, Ordering::Acquire);
        // Leaves the gate also when `launch` panics, so a later capture does not wait forever.
        let _leave = Leave(&self.state);
        if prev & CAPTURING != 0 {
            return Err(GraphError::StreamCapturing { graph });
        }
        launch()
    }

    /// Marks the stream as capturing once no launch is in flight.
    pub(crate) fn begin_capture(&self) {
        while self
            .state
            .compare_exchange_weak(0, CAPTURING, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    pub(crate) fn end_capture(&self) {
        self.state.fetch_and(!CAPTURING, Ordering::Release);
    }
}
