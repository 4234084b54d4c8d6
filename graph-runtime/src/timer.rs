//! Timing a region of a graph on every replay: [`GraphTimer`].

use std::panic::Location;

use cudarc::driver::{sys, CudaEvent};

use crate::error::GraphError;
use crate::phase::{is_capturing, refuse_while_capturing};
use crate::runtime::Runtime;
use crate::state::lent_shared;

/// Two timing events that a body records around a region of a graph.
///
/// Timing a region of a graph on every replay, with CUDA events recorded inside the graph.
///
/// An event recorded on a capturing stream is normally only a dependency marker: the graph
/// keeps the ordering and drops the event. [`GraphTimer`] records its two events as *event
/// record nodes* instead (CUDA's external event records), so every replay records them
/// again and the time between them can be read after the replay:
///
/// ```no_run
/// # use graph_runtime::cudarc::driver::CudaSlice;
/// # use graph_runtime::{cuda_graph, GraphError, GraphTimer, Runtime};
/// #[cuda_graph(warmup = 2)]
/// fn step(
///     rt: &Runtime,
///     x: &CudaSlice<f32>,
///     #[state] timer: &GraphTimer,
///     y: &mut CudaSlice<f32>,
/// ) -> Result<(), GraphError> {
///     timer.start(rt)?;
///     rt.stream().memcpy_dtod(x, y)?; // the timed region
///     timer.stop(rt)?;
///     Ok(())
/// }
/// # fn main() -> Result<(), GraphError> {
/// # let rt = Runtime::new(0)?;
/// # let x = rt.stream().clone_htod(&[1.0f32; 1024])?;
/// let timer = GraphTimer::new(&rt)?;
/// let mut graph = StepGraph::capture(&rt, &x, &timer, 1024)?;
/// graph.replay(&x)?;
/// let ms = graph.state_mut().timer.elapsed_ms()?; // waits for the replay's stop event
/// # Ok(()) }
/// ```
///
/// The same calls time the region when the function runs eagerly.
pub struct GraphTimer {
    start: CudaEvent,
    stop: CudaEvent,
}

impl std::fmt::Debug for GraphTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphTimer").finish_non_exhaustive()
    }
}

impl GraphTimer {
    /// Two timing events on the runtime's context. Create the timer before the capture and
    /// pass it to the graph as `#[state]`.
    pub fn new(rt: &Runtime) -> Result<Self, GraphError> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok(GraphTimer {
            start: rt.context().new_event(flags)?,
            stop: rt.context().new_event(flags)?,
        })
    }

    /// Marks the start of the timed region on the runtime's stream.
    pub fn start(&self, rt: &Runtime) -> Result<(), GraphError> {
        record(&self.start, rt)
    }

    /// Marks the end of the timed region on the runtime's stream.
    pub fn stop(&self, rt: &Runtime) -> Result<(), GraphError> {
        record(&self.stop, rt)
    }

    /// Milliseconds between the last recorded start and stop: after a replay, the region's
    /// time in that replay. Waits for the stop event, so it is refused inside a capture.
    #[track_caller]
    pub fn elapsed_ms(&self) -> Result<f32, GraphError> {
        let location = Location::caller();
        refuse_while_capturing(|graph| GraphError::SyncInCapture {
            op: "GraphTimer::elapsed_ms",
            graph,
            location,
        })?;
        self.stop.synchronize()?;
        Ok(self.start.elapsed_ms(&self.stop)?)
    }
}

fn record(event: &CudaEvent, rt: &Runtime) -> Result<(), GraphError> {
    let stream = rt.stream();
    stream.context().bind_to_thread()?;
    // SAFETY: the event and the runtime's stream are alive and belong to the runtime's
    // context, bound just above. While capturing, the external flag makes the record an
    // event record node of the graph.
    unsafe { crate::driver::record_event(event.cu_event(), stream.cu_stream(), is_capturing()) }?;
    Ok(())
}

// SAFETY: no memory regions: a timer holds events, no device memory; its two events are
// reported as handles.
lent_shared!(
    /// A timer holds no device memory; it is lent back as `&GraphTimer` (all its methods take
    /// `&self`).
    GraphTimer,
    |t, visit| {
        t.start.regions(visit);
        t.stop.regions(visit);
    },
);
