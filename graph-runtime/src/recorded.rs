//! [`RecordedGraph`]: the one owner of a CUDA graph that a stream capture recorded.
//!
//! A capture hands its graph over the moment it ends (as cudarc's `CudaGraph` does); from
//! then on the graph is destroyed exactly once, when its owner drops it, on every path out:
//! an error, a panic, a failed check, a failed instantiation. Instantiation takes it by
//! value. The one graph that must not be destroyed, a recording poisoned by a conditional
//! body whose own recording failed inside its node (see `crate::conditional`), is leaked on
//! purpose with [`RecordedGraph::leak`].

use cudarc::driver::{sys, DriverError};

use crate::driver;

/// A live CUDA graph recorded by a stream capture, owned here: dropping it destroys it.
pub(crate) struct RecordedGraph(sys::CUgraph);

impl RecordedGraph {
    /// Ends the capture of `stream` and takes ownership of the recorded graph (`None` when
    /// nothing was recorded).
    ///
    /// [`cuStreamEndCapture`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html)
    ///
    /// # Safety
    /// `stream` is the live stream whose capture the calling thread began.
    pub(crate) unsafe fn end_capture(stream: sys::CUstream) -> Result<Option<Self>, DriverError> {
        // SAFETY: forwarded from the caller.
        let raw = unsafe { driver::end_capture(stream) }?;
        Ok((!raw.is_null()).then_some(RecordedGraph(raw)))
    }

    /// A new empty graph, owned here: the first segment of a body that records nothing before
    /// its first eager island (so that the graph still has a first segment to launch).
    ///
    /// # Safety
    /// A context is bound to the calling thread.
    pub(crate) unsafe fn empty() -> Result<Self, DriverError> {
        // SAFETY: forwarded from the caller.
        let raw = unsafe { driver::graph_create() }?;
        Ok(RecordedGraph(raw))
    }

    /// The raw handle, for driver calls that read the graph or instantiate it. It stays
    /// owned by `self`: it must not be destroyed, nor used after `self` is dropped.
    pub(crate) fn raw(&self) -> sys::CUgraph {
        self.0
    }

    /// Destroys the graph now and says whether the driver agreed (dropping it does the same
    /// and ignores the answer).
    pub(crate) fn destroy(self) -> Result<(), DriverError> {
        let raw = self.0;
        std::mem::forget(self);
        // SAFETY: `raw` is live and owned by the `RecordedGraph` just consumed, which will
        // not destroy it again.
        unsafe { driver::graph_destroy(raw) }
    }

    /// Gives up the graph without destroying it: for a recording that a failed conditional
    /// body left unusable, whose destruction CUDA does not support.
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for RecordedGraph {
    fn drop(&mut self) {
        // SAFETY: the graph is live and owned by `self`, and destroyed only here (`destroy`
        // and `leak` forget `self` instead of dropping it).
        let _ = unsafe { driver::graph_destroy(self.0) };
    }
}

impl std::fmt::Debug for RecordedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RecordedGraph").field(&self.0).finish()
    }
}
