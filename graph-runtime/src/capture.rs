//! Warmup, capture and the capture guard.
//!
//! [`capture_graph`] is the whole procedure behind a generated `capture`:
//!
//! 1. run the body `warmup` times, eagerly, on the runtime's stream (kernels get compiled
//!    and loaded, cuBLAS picks its algorithms, allocations settle);
//! 2. synchronize, so an asynchronous failure of the warmup is reported as one;
//! 3. begin capture on the same stream, run the body once more, end capture;
//! 4. instantiate (temporaries freed on relaunch), upload, count the nodes.
//!
//! Step 3 runs under [`ActiveCapture`], a guard whose `Drop` ends the capture. A body that
//! returns an error, or panics, therefore never leaves the stream capturing: the capture is
//! ended, the half-recorded graph destroyed, errors that cudarc recorded on the context
//! during the failed capture are cleared, and the runtime is usable for the next capture.

use std::cell::Cell;
use std::panic::Location;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaStream, DriverError};

use crate::error::GraphError;
use crate::graph::{Graph, GraphInfo};
use crate::rng::WarmupSnapshot;
use crate::runtime::Runtime;

/// How strictly CUDA polices other CUDA calls while a stream captures.
///
/// See `cuStreamBeginCapture` in the CUDA driver API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// Unsafe calls (synchronizing, blocking allocation, queries) fail in every thread of the
    /// process while the capture runs. Catches a background thread that would invalidate the
    /// capture, at the price of failing that thread.
    Global,
    /// Unsafe calls fail only in the capturing thread; other threads keep working. The
    /// default: it is what a server with background threads needs.
    #[default]
    ThreadLocal,
    /// Nothing is policed; unsafe calls are allowed and their effects are your problem.
    Relaxed,
}

impl CaptureMode {
    pub(crate) fn raw(self) -> sys::CUstreamCaptureMode {
        match self {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// What the current thread is doing, as far as graphs are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Ordinary eager execution.
    Eager,
    /// Warmup run `run` (from 1) of the graph `graph`, before its capture.
    Warmup {
        /// The graph being warmed up.
        graph: &'static str,
        /// Which warmup run, from 1.
        run: u32,
    },
    /// The body of `graph` is being recorded.
    Capture {
        /// The graph being captured.
        graph: &'static str,
    },
}

thread_local! {
    static PHASE: Cell<Phase> = const { Cell::new(Phase::Eager) };
    /// The graph whose capture procedure (warmup included) runs on this thread.
    static PROCEDURE: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Marks the thread as running the capture procedure of one graph, until dropped.
struct ProcedureScope;

impl ProcedureScope {
    fn enter(graph: &'static str) -> Result<Self, &'static str> {
        PROCEDURE.with(|p| match p.get() {
            Some(outer) => Err(outer),
            None => {
                p.set(Some(graph));
                Ok(ProcedureScope)
            }
        })
    }
}

impl Drop for ProcedureScope {
    fn drop(&mut self) {
        PROCEDURE.with(|p| p.set(None));
    }
}

/// The current thread's [`Phase`].
pub fn phase() -> Phase {
    PHASE.with(Cell::get)
}

/// Whether the current thread is recording a graph right now.
pub fn is_capturing() -> bool {
    matches!(phase(), Phase::Capture { .. })
}

/// Fails with [`GraphError::SyncInCapture`] when the current thread is capturing.
///
/// The runtime's own host-synchronising operations call this first; call it from your own
/// helpers that wait for the GPU, so a mistake names your line instead of invalidating the
/// capture with CUDA error 900.
#[track_caller]
pub fn ensure_not_capturing(op: &'static str) -> Result<(), GraphError> {
    refuse_in_capture(op, Location::caller())
}

pub(crate) fn refuse_in_capture(
    op: &'static str,
    location: &'static Location<'static>,
) -> Result<(), GraphError> {
    match phase() {
        Phase::Capture { graph } => Err(GraphError::SyncInCapture {
            op,
            graph,
            location,
        }),
        _ => Ok(()),
    }
}

/// Sets the thread's phase and puts the previous one back on drop (also on panic).
struct PhaseScope(Phase);

impl PhaseScope {
    fn enter(phase: Phase) -> Self {
        PhaseScope(PHASE.with(|p| p.replace(phase)))
    }
}

impl Drop for PhaseScope {
    fn drop(&mut self) {
        PHASE.with(|p| p.set(self.0));
    }
}

/// What the generated code tells the runtime about one `#[cuda_graph]` function.
#[derive(Debug)]
pub struct GraphSite {
    /// The annotated function's name.
    pub name: &'static str,
    /// How many eager runs precede the capture (at least 1).
    pub warmup: u32,
    /// The capture mode.
    pub mode: CaptureMode,
}

/// A capture in progress on the runtime's stream. Dropping it without [`ActiveCapture::end`]
/// (an error or a panic in the body) ends and discards the capture.
struct ActiveCapture<'r> {
    rt: &'r Runtime,
    site: &'static GraphSite,
    _phase: PhaseScope,
    open: bool,
}

impl<'r> ActiveCapture<'r> {
    fn begin(rt: &'r Runtime, site: &'static GraphSite) -> Result<Self, GraphError> {
        let stream = rt.stream();
        stream.context().bind_to_thread()?;
        rt.gate().begin_capture();
        let (cu_stream, mode) = (stream.cu_stream(), site.mode.raw());
        // SAFETY: the stream is alive (borrowed from the runtime) and belongs to the context
        // just bound to this thread.
        let begun = unsafe { result::stream::begin_capture(cu_stream, mode) };
        if let Err(e) = begun {
            rt.gate().end_capture();
            return Err(GraphError::from_driver(site.name, e));
        }
        Ok(ActiveCapture {
            rt,
            site,
            _phase: PhaseScope::enter(Phase::Capture { graph: site.name }),
            open: true,
        })
    }

    /// Ends the capture and hands back the recorded graph, or the error CUDA gave.
    fn end(mut self) -> Result<sys::CUgraph, DriverError> {
        self.open = false;
        let result = end_raw(self.rt.stream());
        self.rt.gate().end_capture();
        result
    }
}

impl Drop for ActiveCapture<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        // The body failed or panicked: end the capture and throw the recording away.
        match end_raw(self.rt.stream()) {
            Ok(graph) if !graph.is_null() => {
                // SAFETY: `graph` was just returned by cuStreamEndCapture and is owned here;
                // nothing else refers to it.
                let _ = unsafe { result::graph::destroy(graph) };
            }
            _ => {}
        }
        self.rt.gate().end_capture();
        clear_recorded_errors(self.rt, self.site.name);
    }
}

fn end_raw(stream: &CudaStream) -> Result<sys::CUgraph, DriverError> {
    // SAFETY: the stream is alive and is the one the capture was begun on.
    unsafe { result::stream::end_capture(stream.cu_stream()) }
}

/// cudarc records errors of calls that cannot return one (drops of buffers, for instance) on
/// the context and returns them from the next call. After a failed capture such errors are
/// consequences of that failure; clear them so they do not fail an unrelated later call.
fn clear_recorded_errors(rt: &Runtime, graph: &'static str) -> Option<DriverError> {
    let e = rt.context().check_err().err();
    if let Some(e) = e {
        tracing::debug!(graph, error = ?e, "cleared an error cudarc recorded during the capture");
    }
    e
}

/// The eager warmup runs, then a synchronize so that an asynchronous failure is reported as
/// one, then a check of the errors cudarc recorded meanwhile.
fn warm_up(
    rt: &Runtime,
    site: &'static GraphSite,
    body: &mut dyn FnMut() -> Result<(), GraphError>,
) -> Result<(), GraphError> {
    let graph = site.name;
    let failed = |iteration: u32, e: GraphError| GraphError::Warmup {
        graph,
        iteration,
        warmup: site.warmup,
        source: Box::new(e),
    };
    for run in 1..=site.warmup {
        let _phase = PhaseScope::enter(Phase::Warmup { graph, run });
        body().map_err(|e| failed(run, e))?;
    }
    rt.stream()
        .synchronize()
        .map_err(|e| failed(site.warmup, e.into()))?;
    match clear_recorded_errors(rt, graph) {
        Some(e) => Err(failed(site.warmup, e.into())),
        None => Ok(()),
    }
}

/// Warmup, capture, instantiate and upload `body`. See the module docs.
pub(crate) fn capture_graph(
    rt: &Runtime,
    site: &'static GraphSite,
    static_bytes: usize,
    body: &mut dyn FnMut() -> Result<(), GraphError>,
) -> Result<Graph, GraphError> {
    let graph = site.name;
    // One capture procedure per thread at a time: a body that captures another graph, during
    // its warmup or its capture, gets an error instead of a deadlock on the capture lock.
    let _procedure = match ProcedureScope::enter(graph) {
        Ok(scope) => scope,
        Err(outer) => return Err(GraphError::NestedCapture { graph, outer }),
    };
    let _serial = rt.capture_lock();

    let started = Instant::now();
    // Warmup draws random numbers; every generator is put back afterwards, so that the first
    // replay draws what the first eager call would (see `crate::rng`).
    let generators = WarmupSnapshot::take(rt)?;
    let warmed = warm_up(rt, site, body).map_err(|e| {
        let run = match &e {
            GraphError::Warmup { iteration, .. } => *iteration,
            _ => 1,
        };
        e.with_oom_context(
            rt,
            || format!("warmup run {run} of `{graph}` (the body's own allocations)"),
            None,
        )
    });
    let restored = generators.restore(rt, site.warmup);
    warmed?; // a failed warmup is the error to report, not what followed from it
    let rng = restored?;
    let warmup_time = started.elapsed();

    let capture_started = Instant::now();
    let active = ActiveCapture::begin(rt, site)?;
    let body_result = body();
    let (raw, capture_time) = match body_result {
        Err(e) => {
            drop(active);
            return Err(GraphError::in_capture(graph, e));
        }
        Ok(()) => {
            let ended = active.end();
            let recorded = clear_recorded_errors(rt, graph);
            match ended {
                Ok(raw) if recorded.is_none() => (raw, capture_started.elapsed()),
                Ok(raw) => {
                    if !raw.is_null() {
                        // SAFETY: `raw` came from cuStreamEndCapture and is owned here.
                        let _ = unsafe { result::graph::destroy(raw) };
                    }
                    let e = recorded.expect("checked above");
                    return Err(GraphError::in_capture(graph, e.into()));
                }
                Err(end_err) => {
                    // Prefer the root cause cudarc recorded (a 900 from a dropped guard, say)
                    // over the 901 that CUDA returns when ending an invalidated capture.
                    let cause = recorded
                        .filter(|r| r.0 != sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
                        .unwrap_or(end_err);
                    return Err(GraphError::from_driver(graph, cause));
                }
            }
        }
    };
    if raw.is_null() {
        return Err(GraphError::EmptyGraph { graph });
    }

    let info = GraphInfo {
        rng,
        temp_bytes: 0,
        static_bytes,
        early_edges: 0,
        name: graph,
        kinds: Default::default(),
        warmup: site.warmup,
        warmup_time,
        capture_time,
        instantiate_time: Duration::ZERO,
    };
    let built = Graph::instantiate(rt, raw, info)?;
    tracing::debug!(
        graph,
        nodes = built.info().nodes(),
        temp_bytes = built.info().temp_bytes,
        static_bytes,
        early_edges = built.info().early_edges,
        warmup = site.warmup,
        warmup_ms = warmup_time.as_secs_f64() * 1e3,
        capture_ms = capture_time.as_secs_f64() * 1e3,
        instantiate_ms = built.info().instantiate_time.as_secs_f64() * 1e3,
        "captured CUDA graph"
    );
    Ok(built)
}
