//! Warmup, capture and the capture guard: the procedure behind every generated `capture`.
//!
//! 1. Read the seed and offset of every random generator of the runtime, and snapshot on the
//!    device every `&mut` state of the graph (unless opted out with `#[state(no_restore)]`).
//! 2. Run the body `warmup` times, eagerly, on the runtime's stream (kernels get compiled
//!    and loaded, cuBLAS picks its algorithms, allocations settle). After every run the
//!    body's state and outputs must still hold the buffers they were captured with.
//! 3. Synchronize, so an asynchronous failure of the warmup is reported as one.
//! 4. Restore the generators and the state, so the graph starts where an eager program
//!    would.
//! 5. Begin capture on the same stream, run the body once more, end capture, check the
//!    addresses again.
//! 6. Instantiate (temporaries freed on relaunch), upload, count the nodes.
//!
//! An error and a panic unwind the same way at every step: the capture is ended (a guard,
//! [`ActiveCapture`]), the half-recorded graph destroyed, errors cudarc recorded meanwhile
//! are cleared, the generators and the state are put back (the state only when it still
//! holds the buffers it was snapshotted from), and the runtime is usable for the next
//! capture.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe, Location};
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaStream, DriverError};

use crate::conditional::record::{self, CaptureRecord};
use crate::driver;
use crate::error::{GraphError, When};
use crate::fingerprint::Fingerprint;
use crate::graph::recorded_memory_nodes;
use crate::graph::{Graph, GraphInfo};
use crate::inputs::InputNodes;
use crate::phase::{with_frame, FrameScope, Phase};
use crate::recorded::RecordedGraph;
use crate::rng::WarmupSnapshot;
use crate::runtime::Runtime;
use crate::site::{GraphSite, Step};
use crate::snapshot::StateSnapshot;
use crate::state::AddressBook;
use crate::watchdog::Watch;

/// A capture in progress on the runtime's stream. Dropping it without [`ActiveCapture::end`]
/// (an error or a panic in the body) ends and discards the capture.
struct ActiveCapture<'r> {
    rt: &'r Runtime,
    site: &'static GraphSite,
    _phase: FrameScope,
    /// Reports a body that does not return while the capture is invalidated (a spin on a
    /// query, say): see `crate::watchdog`.
    _watch: Watch,
    open: bool,
}

impl<'r> ActiveCapture<'r> {
    fn begin(
        rt: &'r Runtime,
        site: &'static GraphSite,
        owns_island: OwnsIsland,
    ) -> Result<Self, GraphError> {
        rt.refuse_event_tracking("capturing a graph")?;
        rt.context().bind_to_thread()?;
        // From here on `rt.stream()` is, on this thread, the stream the capture records on
        // (the runtime's capture stream, see `Runtime`'s "Threads").
        rt.gate().begin_capture();
        let stream = rt.stream();
        // SAFETY: the stream is alive (borrowed from the runtime) and belongs to the context
        // just bound to this thread.
        let begun = unsafe { driver::begin_capture(stream.cu_stream(), site.mode.raw()) };
        if let Err(e) = begun {
            rt.gate().end_capture();
            return Err(GraphError::from_driver(site.name, e));
        }
        // The graph being recorded: conditional handles are created for it (see
        // `crate::conditional`).
        // SAFETY: the stream began capturing on this thread just above.
        let root = match unsafe { driver::capture_point(stream.cu_stream()) } {
            Ok((root, _)) => root,
            Err(e) => {
                // Whatever was recorded is destroyed as it drops.
                drop(end_raw(stream));
                rt.gate().end_capture();
                return Err(GraphError::from_driver(site.name, e));
            }
        };
        record::open_record(root, site.mode.raw());
        SegmentLog::open(site.name, stream.cu_stream(), site.mode.raw(), owns_island);
        Ok(ActiveCapture {
            rt,
            site,
            _phase: FrameScope::phase(Phase::Capture { graph: site.name }),
            _watch: Watch::start(site.name, stream.cu_stream(), stream.context().cu_ctx()),
            open: true,
        })
    }

    /// Ends the capture and hands back the recorded graph (`None` when nothing was recorded),
    /// or the error CUDA gave, with what the capture recorded about its conditionals, and the
    /// segments recorded before its eager islands (see [`island`]).
    fn end(
        mut self,
    ) -> (
        Result<Option<RecordedGraph>, DriverError>,
        CaptureRecord,
        Vec<Boundary>,
    ) {
        self.open = false;
        let boundaries = SegmentLog::close();
        let record = record::close_record().expect("a capture has a record");
        let result = end_raw(self.rt.stream());
        self.rt.gate().end_capture();
        if record.poisoned {
            // A conditional body's recording failed inside its node: the graph must not be
            // used or destroyed (see `crate::conditional`); it is leaked.
            if let Ok(Some(graph)) = result {
                graph.leak();
            }
            return (
                Err(DriverError(
                    sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                )),
                record,
                boundaries,
            );
        }
        (result, record, boundaries)
    }
}

impl Drop for ActiveCapture<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        // The segments recorded before the islands are destroyed as they drop.
        drop(SegmentLog::close());
        let poisoned = record::close_record().is_some_and(|r| r.poisoned);
        // The body failed or panicked: end the capture and throw the recording away (unless
        // a conditional body's failed recording left it unusable: then it is leaked).
        if let Ok(Some(graph)) = end_raw(self.rt.stream()) {
            if poisoned {
                graph.leak();
            } else {
                drop(graph);
            }
        }
        self.rt.gate().end_capture();
        clear_recorded_errors(self.rt, self.site.name);
    }
}

fn end_raw(stream: &CudaStream) -> Result<Option<RecordedGraph>, DriverError> {
    // SAFETY: the stream is alive and is the one this thread began capturing.
    unsafe { RecordedGraph::end_capture(stream.cu_stream()) }
}

/// cudarc records errors of calls that cannot return one (drops of buffers, for instance) on
/// the context and returns them from the next call. After a failed capture such errors are
/// consequences of that failure; clear them so they do not fail an unrelated later call.
fn clear_recorded_errors(rt: &Runtime, graph: &'static str) -> Option<DriverError> {
    let e = rt.take_recorded_error();
    if let Some(e) = &e {
        tracing::debug!(graph, error = ?e, "cleared an error cudarc recorded during the capture");
    }
    e
}

/// What the warmup snapshotted, to be put back on every path out of the warmup.
struct Snapshots {
    generators: WarmupSnapshot,
    state: StateSnapshot,
}

impl Snapshots {
    fn take(rt: &Runtime, book: &AddressBook) -> Result<Self, GraphError> {
        Ok(Snapshots {
            generators: WarmupSnapshot::take(rt)?,
            state: StateSnapshot::take(rt, book)?,
        })
    }

    /// Puts the generators back, and the state when `state_intact` (its buffers are the ones
    /// it was snapshotted from: restoring into a replaced buffer would write freed memory).
    fn restore(
        self,
        rt: &Runtime,
        warmup: u32,
        state_intact: bool,
    ) -> Result<(Vec<crate::rng::RngAdvance>, usize), GraphError> {
        let bytes = self.state.bytes();
        let state = if state_intact {
            self.state.restore(rt)
        } else {
            Ok(())
        };
        let rng = self.generators.restore(rt, warmup)?;
        state?;
        Ok((rng, bytes))
    }
}

/// The eager warmup runs, each followed by an address check, then a synchronize (so an
/// asynchronous failure is reported as one) and a check of the errors cudarc recorded.
///
/// Returns whether the state is intact (still in the buffers it was recorded with) and the
/// outcome. A panic in a run is caught so the caller can restore, then resumed.
fn warm_up(
    rt: &Runtime,
    site: &'static GraphSite,
    body: &mut dyn FnMut(Step) -> Result<(), GraphError>,
    lookups: &crate::phase::KernelLookups,
) -> Result<(), WarmupFailure> {
    let graph = site.name;
    let failed = |iteration: u32, e: GraphError| {
        let e = GraphError::Warmup {
            graph,
            iteration,
            warmup: site.warmup,
            source: Box::new(e),
        };
        // Out of memory is reported as such, naming the run.
        rt.oom_context(
            e,
            || format!("warmup run {iteration} of `{graph}` (the body's own allocations)"),
            None,
        )
    };
    for run in 1..=site.warmup {
        // Only the last run's kernel lookups are compared with the capture's.
        drop(lookups.take());
        let ran = {
            let _phase = FrameScope::phase(Phase::Warmup { graph, run });
            panic::catch_unwind(AssertUnwindSafe(|| body(Step::Run(When::Warmup { run }))))
        };
        let checked = body(Step::Check(When::Warmup { run }));
        match (ran, checked) {
            (Err(panic), checked) => {
                return Err(WarmupFailure::Panic {
                    payload: panic,
                    state_intact: checked.is_ok(),
                })
            }
            (Ok(_), Err(moved)) => {
                return Err(WarmupFailure::Error {
                    error: moved,
                    state_intact: false,
                })
            }
            (Ok(Err(e)), Ok(())) => {
                return Err(WarmupFailure::Error {
                    error: failed(run, e),
                    state_intact: true,
                })
            }
            (Ok(Ok(())), Ok(())) => {}
        }
    }
    let synced = rt
        .stream()
        .synchronize()
        .map_err(|e| failed(site.warmup, e.into()));
    let recorded = clear_recorded_errors(rt, graph).map(|e| failed(site.warmup, e.into()));
    match synced.err().or(recorded) {
        Some(error) => Err(WarmupFailure::Error {
            error,
            state_intact: true,
        }),
        None => Ok(()),
    }
}

/// How the warmup ended when it did not succeed.
enum WarmupFailure {
    Error {
        error: GraphError,
        state_intact: bool,
    },
    Panic {
        payload: Box<dyn std::any::Any + Send>,
        state_intact: bool,
    },
}

/// Warmup, capture, instantiate and upload `body`: the procedure behind every generated
/// `capture` and every graph of a bucket family. See the module docs.
///
/// `book` holds the addresses of the graph's state and outputs (the body checks them when
/// asked with [`Step::Check`]) and says which state to snapshot around the warmup;
/// `static_bytes` is what the graph's static buffers take, for its report; `owns_island` tells
/// the body's own eager islands from those of another `#[cuda_graph]` function it calls.
#[doc(hidden)]
pub fn capture(
    rt: &Runtime,
    site: &'static GraphSite,
    book: &AddressBook,
    inputs: &InputNodes,
    static_bytes: usize,
    owns_island: OwnsIsland,
    body: &mut dyn FnMut(Step) -> Result<(), GraphError>,
) -> Result<Captured, GraphError> {
    let graph = site.name;
    // One capture procedure per thread at a time: a body that captures another graph, during
    // its warmup or its capture, gets an error instead of a deadlock on the capture lock.
    let _procedure = match FrameScope::procedure(graph) {
        Ok(scope) => scope,
        Err(outer) => return Err(GraphError::NestedCapture { graph, outer }),
    };
    let _serial = rt.capture_lock();
    let _span = tracing::debug_span!("cuda_graph_capture", graph).entered();

    let started = Instant::now();
    // What the runtime's framework keeps while a graph is recorded (candle: its small shape
    // uploads, cached during warmup and reused by the capture).
    let _framework_hold = rt.framework().map(|f| f.hold_during_capture());
    let input_copy = inputs.prepare(rt)?;
    let lookups = crate::phase::KernelLookups::start(site.determinism);
    let warmed = warm_up_and_restore(rt, site, book, body, &lookups)?;
    let warmup_time = started.elapsed();
    tracing::trace!(graph, ms = warmup_time.as_secs_f64() * 1e3, "warmup done");

    let capture_started = Instant::now();
    let early_launches = crate::phase::EarlyLaunches::start();
    let Recorded {
        ended,
        input_nodes,
        lookups: capture_lookups,
    } = record(
        rt,
        site,
        owns_island,
        inputs,
        input_copy.as_ref(),
        body,
        &lookups,
    )?;
    let capture_time = capture_started.elapsed();
    // On every early return below, the recorded graphs are destroyed as they drop.
    body(Step::Check(When::Capture))?;
    let (segments, islands) = ended.into_segments(graph)?;
    let checks_started = Instant::now();
    if site.determinism {
        // A graph too large to map is refused before the body is recorded a second time
        // (which could run out of memory itself and lose what was asked for).
        for (raw, record) in segments.iter().flatten() {
            crate::graph::refuse_unmappable(rt, graph, raw, record)?;
        }
        let copy = input_copy.as_ref().map(|c| (inputs, c));
        check_determinism(
            rt,
            site,
            owns_island,
            body,
            &segments,
            copy,
            &warmed.lookups,
            capture_lookups,
        )?;
    }
    let checks_time = checks_started.elapsed();
    // Ranks capturing collectives together compare what they recorded before any of them
    // instantiates (see `crate::nccl`; the first recording's collectives, not the
    // determinism check's second recording's); without an open session this does nothing.
    #[cfg(feature = "nccl")]
    crate::nccl::session::before_instantiate(site)?;

    let info = GraphInfo {
        rng: warmed.rng,
        temp_bytes: 0,
        temp_requested_bytes: 0,
        pool_added_bytes: 0,
        pool_shared_bytes: 0,
        pool_reserved_bytes: 0,
        exec_bytes: None,
        static_bytes,
        // Counted by `Graph::instantiate`, which reads the edges only when this is not 0.
        early_edges: early_launches.count(),
        state_snapshot_bytes: warmed.state_snapshot_bytes,
        foreign_buffers: 0,
        name: graph,
        kinds: Default::default(),
        warmup: site.warmup,
        warmup_time,
        capture_time,
        checks_time,
        instantiate_time: Duration::ZERO,
        inspect_time: Duration::ZERO,
        upload_time: Duration::ZERO,
    };
    let built = instantiate(rt, book, info, segments, input_nodes)?;
    with_islands(site, built, islands)
}

/// The warmup's outcome once state and generators are put back (see [`capture`]).
struct Warmed {
    /// How far each generator's warmup draws went (`GraphInfo::rng`).
    rng: Vec<crate::rng::RngAdvance>,
    state_snapshot_bytes: usize,
    /// The kernel lookups of the last warmup run, for the determinism check.
    lookups: Vec<String>,
}

/// The warmup runs between a snapshot of the state and generators and its restore, so that
/// the first replay sees what the first eager call would have (see `crate::state`). A
/// warmup that fails restores what it can and reports its own error (or resumes its panic).
fn warm_up_and_restore(
    rt: &Runtime,
    site: &'static GraphSite,
    book: &AddressBook,
    body: &mut dyn FnMut(Step) -> Result<(), GraphError>,
    lookups: &crate::phase::KernelLookups,
) -> Result<Warmed, GraphError> {
    let snapshots = Snapshots::take(rt, book)?;
    let warmed = warm_up(rt, site, body, lookups);
    let warmup_lookups = lookups.take();
    let (rng, state_snapshot_bytes) = match warmed {
        Ok(()) => snapshots.restore(rt, site.warmup, true)?,
        Err(WarmupFailure::Error {
            error,
            state_intact,
        }) => {
            // The warmup's failure is the error to report, not what followed from it.
            let _ = snapshots.restore(rt, site.warmup, state_intact);
            return Err(name_the_failed_allocation(rt, site, body, error));
        }
        Err(WarmupFailure::Panic {
            payload,
            state_intact,
        }) => {
            let _ = snapshots.restore(rt, site.warmup, state_intact);
            clear_recorded_errors(rt, site.name);
            panic::resume_unwind(payload);
        }
    };
    Ok(Warmed {
        rng,
        state_snapshot_bytes,
        lookups: warmup_lookups,
    })
}

/// What recording the body once gave.
struct Recorded {
    /// How the capture ended: the recorded segments and the islands between them.
    ended: Ended,
    /// The runtime's input copy nodes, first in the first segment.
    input_nodes: Vec<crate::inputs::InputNode>,
    /// The kernel lookups of the recording, for the determinism check.
    lookups: Vec<String>,
}

/// Records the body once on the capture stream, after the runtime's input copies. A body
/// that fails is checked for replaced state (the worse news) before its error is reported.
fn record(
    rt: &Runtime,
    site: &'static GraphSite,
    owns_island: OwnsIsland,
    inputs: &InputNodes,
    input_copy: Option<&cudarc::driver::CudaFunction>,
    body: &mut dyn FnMut(Step) -> Result<(), GraphError>,
    lookups: &crate::phase::KernelLookups,
) -> Result<Recorded, GraphError> {
    let graph = site.name;
    let active = ActiveCapture::begin(rt, site, owns_island)?;
    let input_nodes = match input_copy {
        Some(copy) => inputs.record(rt, copy),
        None => Ok(Vec::new()),
    };
    let body_result = input_nodes.and_then(|nodes| body(Step::Run(When::Capture)).map(|()| nodes));
    let recorded_lookups = lookups.take();
    match body_result {
        Err(e) => {
            drop(active);
            body(Step::Check(When::Capture))?;
            let e = GraphError::in_capture(graph, e);
            Err(freed_in_capture(rt, graph, e))
        }
        Ok(input_nodes) => Ok(Recorded {
            ended: end_capture(rt, graph, active).map_err(|e| freed_in_capture(rt, graph, e))?,
            input_nodes,
            lookups: recorded_lookups,
        }),
    }
}

/// Instantiates and uploads every recorded segment (`None` for one that recorded nothing):
/// the first segment gets the input copy nodes and the capture's figures.
fn instantiate(
    rt: &Runtime,
    book: &AddressBook,
    info: GraphInfo,
    segments: Vec<Option<(RecordedGraph, CaptureRecord)>>,
    input_nodes: Vec<crate::inputs::InputNode>,
) -> Result<Vec<Option<Graph>>, GraphError> {
    let mut graphs = Vec::with_capacity(segments.len());
    let mut input_nodes = Some(input_nodes);
    for segment in segments {
        let Some((raw, record)) = segment else {
            graphs.push(None);
            continue;
        };
        // The input copy nodes are the first segment's; the later segments' figures are
        // their own, the warmup's and the capture's are the first's.
        let mut info = info.clone();
        if !graphs.is_empty() {
            info.static_bytes = 0;
            info.state_snapshot_bytes = 0;
            info.rng = Vec::new();
        }
        let nodes = input_nodes.take().unwrap_or_default();
        let mut built = Graph::instantiate(rt, raw, info, nodes, &record)?;
        built.settle_for(book);
        graphs.push(Some(built));
    }
    // What the state holds and what any segment of this capture allocates (a segment after
    // an island reads the temporaries of the segments before it) is held by the graph.
    let temporaries: Vec<(u64, u64)> = graphs
        .iter()
        .flatten()
        .flat_map(|g| g.memory_nodes().0.iter().copied())
        .collect();
    let held: Vec<(u64, u64)> = book
        .regions()
        .map(|r| (r.ptr, r.bytes as u64))
        .chain(temporaries)
        .collect();
    for g in graphs.iter_mut().flatten() {
        g.held_elsewhere(held.iter().copied());
    }
    Ok(graphs)
}

/// The capture's result: the first segment's graph and, per island, its code and the graph
/// of the segment after it; `EmptyGraph` when no segment holds the body's own work.
fn with_islands(
    site: &'static GraphSite,
    graphs: Vec<Option<Graph>>,
    islands: Vec<(Box<dyn Any + Send + Sync>, &'static Location<'static>)>,
) -> Result<Captured, GraphError> {
    let graph = site.name;
    // Only the runtime's own input copies, in every segment: the body queued nothing on the
    // capture stream.
    let body_work = |g: &Graph| g.info().nodes() > g.info().kinds.input_copies;
    if !graphs.iter().flatten().any(body_work) {
        return Err(GraphError::EmptyGraph { graph });
    }
    let mut graphs = graphs.into_iter();
    let built = graphs
        .next()
        .flatten()
        .expect("the first segment is always there");
    // A segment after an island that recorded nothing is not launched at all.
    let graphs = graphs.map(|g| g.filter(|g| g.info().nodes() > 0));
    let islands: Vec<CapturedIsland> = islands
        .into_iter()
        .zip(graphs)
        .map(|((run, location), after)| CapturedIsland {
            run,
            location,
            after,
        })
        .collect();
    tracing::debug!(
        graph,
        nodes = built.info().nodes(),
        islands = islands.len(),
        temp_bytes = built.info().temp_bytes,
        pool_added_bytes = built.info().pool_added_bytes,
        exec_bytes = ?built.info().exec_bytes,
        static_bytes = built.info().static_bytes,
        state_snapshot_bytes = built.info().state_snapshot_bytes,
        early_edges = built.info().early_edges,
        warmup = site.warmup,
        warmup_ms = built.info().warmup_time.as_secs_f64() * 1e3,
        capture_ms = built.info().capture_time.as_secs_f64() * 1e3,
        instantiate_ms = built.info().instantiate_time.as_secs_f64() * 1e3,
        "captured CUDA graph"
    );
    Ok(Captured {
        graph: built,
        islands,
    })
}

/// What a capture made: the graph of the body (of its first segment, when the body has eager
/// islands) and, per island, its code and the graph of the segment after it.
#[doc(hidden)]
#[derive(Debug)]
pub struct Captured {
    /// The graph of the body up to its first island (all of it without islands).
    pub graph: Graph,
    /// The islands, in the order the body meets them.
    pub islands: Vec<CapturedIsland>,
}

/// One eager island of a captured body and the segment that follows it.
#[doc(hidden)]
pub struct CapturedIsland {
    /// The island's code: the graph type's island function, boxed.
    pub run: Box<dyn Any + Send + Sync>,
    /// Where the island is in the body.
    pub location: &'static Location<'static>,
    /// The graph of the segment after the island (`None` when it recorded nothing).
    pub after: Option<Graph>,
}

impl std::fmt::Debug for CapturedIsland {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedIsland")
            .field("location", &self.location)
            .field("after", &self.after)
            .finish_non_exhaustive()
    }
}

/// A capture that ended: its last segment, with what it recorded about its conditionals, and
/// the segments ended before at islands.
struct Ended {
    last: Option<RecordedGraph>,
    record: CaptureRecord,
    boundaries: Vec<Boundary>,
}

/// The segments of a capture, in order, each with its record of conditionals (`None` for a
/// segment that recorded nothing: two islands in a row, or an island last), and the islands
/// between them (one fewer).
type Segments = (
    Vec<Option<(RecordedGraph, CaptureRecord)>>,
    Vec<(Box<dyn Any + Send + Sync>, &'static Location<'static>)>,
);

impl Ended {
    /// The segments, the first always there (an empty graph when the body records nothing
    /// before its first island); `EmptyGraph` when no segment recorded anything.
    fn into_segments(self, graph: &'static str) -> Result<Segments, GraphError> {
        let mut segments = Vec::with_capacity(self.boundaries.len() + 1);
        let mut islands = Vec::with_capacity(self.boundaries.len());
        for b in self.boundaries {
            segments.push(b.recorded.map(|r| (r, b.record)));
            islands.push((b.island, b.location));
        }
        segments.push(self.last.map(|r| (r, self.record)));
        if segments.iter().all(Option::is_none) {
            return Err(GraphError::EmptyGraph { graph });
        }
        if segments[0].is_none() {
            // SAFETY: the capture bound the runtime's context to this thread.
            let empty =
                unsafe { RecordedGraph::empty() }.map_err(|e| GraphError::from_driver(graph, e))?;
            let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
            let record = CaptureRecord::new(0, empty.raw(), mode);
            segments[0] = Some((empty, record));
        }
        Ok((segments, islands))
    }
}

/// A capture's error as the runtime's framework explains it (candle: a tensor made before the
/// capture and freed in it), or as it is.
fn freed_in_capture(rt: &Runtime, graph: &'static str, e: GraphError) -> GraphError {
    match rt.framework() {
        Some(f) => f.explain_capture_error(graph, e),
        None => e,
    }
}

/// The optional checks of `check_determinism`: the kernels the last warmup run and the
/// capture looked up through the runtime must be the same, and a second capture must record
/// what the first did, segment by segment.
#[allow(clippy::too_many_arguments)]
fn check_determinism(
    rt: &Runtime,
    site: &'static GraphSite,
    owns_island: OwnsIsland,
    body: &mut dyn FnMut(Step) -> Result<(), GraphError>,
    first: &[Option<(RecordedGraph, CaptureRecord)>],
    inputs: Option<(&InputNodes, &cudarc::driver::CudaFunction)>,
    warmup_lookups: &[String],
    capture_lookups: Vec<String>,
) -> Result<(), GraphError> {
    let graph = site.name;
    if warmup_lookups != capture_lookups.as_slice() {
        return Err(GraphError::WarmupDiverged {
            graph,
            warmup: warmup_lookups.join(", "),
            capture: capture_lookups.join(", "),
        });
    }
    let skip = inputs.map_or(0, |(inputs, _)| inputs.len());
    // The ranks compare the collectives of the first recording, the one instantiated.
    #[cfg(feature = "nccl")]
    let _first_only = crate::nccl::session::pause_recording();
    let active = ActiveCapture::begin(rt, site, owns_island)?;
    let recorded = match inputs {
        Some((inputs, copy)) => inputs.record(rt, copy).map(drop),
        None => Ok(()),
    };
    let ended = match recorded.and_then(|()| body(Step::Run(When::Capture))) {
        Err(e) => {
            drop(active);
            return Err(GraphError::in_capture(graph, e));
        }
        Ok(()) => end_capture(rt, graph, active)?,
    };
    let checked = body(Step::Check(When::Capture));
    // The second capture's graphs are destroyed as they drop, right after the comparison.
    let second = ended.into_segments(graph);
    checked?;
    let difference = match second {
        Err(_) => Some("the second capture recorded nothing".to_owned()),
        Ok((second, _)) if second.len() != first.len() => Some(format!(
            "the first capture met {} island(s), the second {}",
            first.len() - 1,
            second.len() - 1
        )),
        Ok((second, _)) => {
            let mut difference = None;
            // The temporaries of the segments before the one compared, in each recording.
            let (mut earlier_a, mut earlier_b) = (Vec::new(), Vec::new());
            for (k, (a, b)) in first.iter().zip(&second).enumerate() {
                let (Some((a, ra)), Some((b, rb))) = (a, b) else {
                    if a.is_some() != b.is_some() {
                        difference = Some(format!(
                            "segment {} (of {}) recorded nothing in one capture only",
                            k + 1,
                            first.len()
                        ));
                        break;
                    }
                    continue;
                };
                let skip = if k == 0 { skip } else { 0 };
                // SAFETY: `a` and `b` are live graphs just captured on the runtime's context.
                let (fa, fb) = unsafe {
                    (
                        Fingerprint::of(a.raw(), skip, ra, &capture_lookups, &earlier_a)?,
                        Fingerprint::of(b.raw(), skip, rb, &capture_lookups, &earlier_b)?,
                    )
                };
                // SAFETY: as above.
                let (ma, mb) = unsafe {
                    (
                        recorded_memory_nodes(a.raw())?,
                        recorded_memory_nodes(b.raw())?,
                    )
                };
                earlier_a.extend(ma.0);
                earlier_b.extend(mb.0);
                if let Some(d) = fa.first_difference(&fb) {
                    difference = Some(match first.len() {
                        1 => d,
                        _ => format!("segment {} (of {}): {d}", k + 1, first.len()),
                    });
                    break;
                }
            }
            difference
        }
    };
    let Some(difference) = difference else {
        return Ok(());
    };
    // A body that keeps temporaries past its end (state it replaces with new tensors) records
    // different addresses each time: said as such, so that the caller drops that state as
    // memory of a refused graph.
    let mut lists = Vec::new();
    for (raw, _) in first.iter().flatten() {
        // SAFETY: a live graph of the first recording.
        lists.push(unsafe { recorded_memory_nodes(raw.raw()) }?);
    }
    match crate::graph::kept_bytes(lists.iter().map(|(a, f)| (a.as_slice(), f.as_slice()))) {
        0 => Err(GraphError::NondeterministicCapture { graph, difference }),
        bytes => Err(GraphError::KeptTemporary {
            graph,
            bytes: bytes as usize,
        }),
    }
}

/// Out of memory in the body's own allocation during the warmup: cudarc does not say how
/// much was asked for, so the body is recorded once more without running it (a capture
/// allocates nothing, it only records allocation nodes with their sizes) and the largest
/// allocation it asks for is reported. Other errors, and a record that fails, pass through.
fn name_the_failed_allocation(
    rt: &Runtime,
    site: &'static GraphSite,
    body: &mut dyn FnMut(Step) -> Result<(), GraphError>,
    error: GraphError,
) -> GraphError {
    let GraphError::OutOfMemory {
        during,
        requested_bytes: None,
        free_bytes,
    } = error
    else {
        return error;
    };
    let largest = (|| {
        // Only the sizes are read: any island may end a segment.
        let active = ActiveCapture::begin(rt, site, |_| true).ok()?;
        let recorded = panic::catch_unwind(AssertUnwindSafe(|| body(Step::Run(When::Capture))));
        // The segments ended at islands are destroyed as they drop: the largest allocation
        // of the last segment is what is reported.
        let raw = active.end().0.ok().flatten();
        clear_recorded_errors(rt, site.name);
        let raw = raw?;
        // SAFETY: `raw` is the live graph cuStreamEndCapture just returned, owned here.
        let sizes = unsafe { driver::graph_nodes(raw.raw()) }.ok().map(|nodes| {
            nodes
                .into_iter()
                .filter_map(|n| {
                    // SAFETY: `n` belongs to the live graph `raw`.
                    let kind = unsafe { driver::node_type(n) }.ok()?;
                    (kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC)
                        // SAFETY: `n` is an allocation node of the live graph `raw`.
                        .then(|| unsafe { driver::mem_alloc_node_params(n) }.ok())
                        .flatten()
                        .map(|p| p.bytesize)
                })
                .max()
        });
        drop(raw);
        drop(recorded);
        sizes.flatten()
    })();
    GraphError::OutOfMemory {
        during: match largest {
            Some(_) => format!("{during}: its largest allocation"),
            None => during,
        },
        requested_bytes: largest,
        free_bytes,
    }
}

/// Ends a capture whose body returned `Ok` and hands back what it recorded (its last
/// segment `None` when nothing was recorded) with the record of its conditionals, or the
/// error that explains why the capture failed. A graph not handed back is destroyed as it
/// drops.
fn end_capture(
    rt: &Runtime,
    graph: &'static str,
    active: ActiveCapture<'_>,
) -> Result<Ended, GraphError> {
    let (ended, record, boundaries) = active.end();
    let recorded = clear_recorded_errors(rt, graph);
    match ended {
        Ok(raw) if recorded.is_none() => {
            let unused = std::iter::once(&record)
                .chain(boundaries.iter().map(|b| &b.record))
                .find_map(CaptureRecord::unused_condition);
            if let Some(location) = unused {
                return Err(GraphError::UnusedCondition { graph, location });
            }
            Ok(Ended {
                last: raw,
                record,
                boundaries,
            })
        }
        Ok(raw) => {
            drop(raw);
            let e = recorded.expect("checked above");
            Err(GraphError::in_capture(graph, e.into()))
        }
        Err(end_err) => {
            // Prefer the root cause cudarc recorded (a 900 from a dropped guard, say) over
            // the 901 that CUDA returns when ending an invalidated capture.
            let cause = recorded
                .filter(|r| r.0 != sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
                .unwrap_or(end_err);
            Err(GraphError::from_driver(graph, cause))
        }
    }
}

/// One eager island met by a capture: the graph recorded before it and the island's host
/// code, which a replay runs between that graph and the next.
pub(crate) struct Boundary {
    /// The segment that ends at the island.
    recorded: Option<RecordedGraph>,
    /// What that segment recorded about its conditionals.
    record: CaptureRecord,
    /// The island's code, boxed by the generated code as the graph type's island function.
    island: Box<dyn Any + Send + Sync>,
    /// Where the island is in the body.
    location: &'static Location<'static>,
}

/// The segments a capture has recorded so far, each ended at an island (held in the
/// thread's capture frame from the capture's begin to its end).
struct SegmentLog {
    graph: &'static str,
    stream: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
    owns_island: OwnsIsland,
    done: Vec<Boundary>,
}

/// Whether a boxed island function is the captured body's own (`GraphBody::owns_island`).
#[doc(hidden)]
pub type OwnsIsland = fn(&(dyn Any + Send + Sync)) -> bool;

impl SegmentLog {
    fn open(
        graph: &'static str,
        stream: sys::CUstream,
        mode: sys::CUstreamCaptureMode,
        owns_island: OwnsIsland,
    ) {
        let log: Box<dyn Any> = Box::new(SegmentLog {
            graph,
            stream,
            mode,
            owns_island,
            done: Vec::new(),
        });
        with_frame(|f| *f.segments.borrow_mut() = Some(log));
    }

    fn take() -> Option<Box<SegmentLog>> {
        with_frame(|f| f.segments.borrow_mut().take())
            .and_then(|log| log.downcast::<SegmentLog>().ok())
    }

    fn put_back(log: Box<SegmentLog>) {
        let log: Box<dyn Any> = log;
        with_frame(|f| *f.segments.borrow_mut() = Some(log));
    }

    /// The segments recorded before the islands, in order (none without islands).
    fn close() -> Vec<Boundary> {
        SegmentLog::take().map(|log| log.done).unwrap_or_default()
    }
}

/// An eager island of a `#[cuda_graph]` body (`rt.eager(|| …)`, rewritten by the macro into
/// a call of this with the island's parameters and code).
///
/// Eagerly, in a warmup run and in `verify`'s eager run, the island's code runs here. In the
/// capture it does not run: the segment recorded so far ends, the code is kept (`boxed` turns
/// it into the graph type's island function, which the generated `GraphBody::island` calls
/// on every replay, between that segment and the next), and recording goes on in a new
/// segment.
#[doc(hidden)]
#[track_caller]
pub fn island<P, E, F, B>(params: P, code: F, boxed: impl FnOnce(F) -> B) -> Result<(), E>
where
    F: Fn(P) -> Result<(), E> + Send + Sync + 'static,
    E: From<GraphError>,
    B: Any + Send + Sync,
{
    let location = Location::caller();
    match crate::phase::phase() {
        Phase::Capture { graph } => {
            if crate::phase::in_conditional_body() || crate::phase::in_fork() {
                return Err(GraphError::IslandMisuse {
                    graph,
                    location,
                    reason: "an island cannot be inside a `graph_while` / `graph_if` body or a \
                             fork: their work is recorded into one node, which cannot stop for \
                             host code",
                }
                .into());
            }
            island_boundary(graph, Box::new(boxed(code)), location).map_err(E::from)
        }
        _ => {
            let _span = tracing::trace_span!("cuda_graph_island", line = location.line()).entered();
            let ran = code(params);
            if ran.is_err() {
                FAILED_ISLAND.with(|f| f.set(Some(location)));
            }
            ran
        }
    }
}

thread_local! {
    /// Where the last island that failed eagerly on this thread is (see [`take_failed_island`]).
    static FAILED_ISLAND: std::cell::Cell<Option<&'static Location<'static>>> =
        const { std::cell::Cell::new(None) };
}

/// Where the last island that failed eagerly on this thread is, cleared: `verify`'s eager
/// run names a failing island the way a replay does.
pub(crate) fn take_failed_island() -> Option<&'static Location<'static>> {
    FAILED_ISLAND.with(|f| f.take())
}

/// Ends the segment the capture of `graph` is recording at an island, keeps it with the
/// island's code, and begins the next segment on the same stream.
fn island_boundary(
    graph: &'static str,
    island: Box<dyn Any + Send + Sync>,
    location: &'static Location<'static>,
) -> Result<(), GraphError> {
    let Some(mut log) = SegmentLog::take() else {
        return Err(GraphError::IslandMisuse {
            graph,
            location,
            reason: "the thread captures, but not through the graph's own `capture`",
        });
    };
    if !(log.owns_island)(&*island) {
        SegmentLog::put_back(log);
        return Err(GraphError::IslandMisuse {
            graph,
            location,
            reason: "the island belongs to another `#[cuda_graph]` function that this body calls, and a replay \
                     of this graph runs only its own islands. Fix: capture the called function as a graph of \
                     its own and replay the two graphs one after the other, or move the island into this \
                     function's body",
        });
    }
    let ended = (|| {
        let record = record::close_record().expect("a capture has a record");
        if record.poisoned {
            // Left for the capture's guard, which leaks the unusable recording.
            return Err(GraphError::from_driver(
                graph,
                DriverError(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
            ));
        }
        // SAFETY: the stream is the live stream whose capture this thread's procedure began
        // (the log is opened by `ActiveCapture::begin` and closed before the capture ends).
        let recorded = unsafe { RecordedGraph::end_capture(log.stream) }
            .map_err(|e| GraphError::from_driver(graph, e))?;
        // SAFETY: the same stream, no longer capturing; its context is bound to this thread.
        unsafe { driver::begin_capture(log.stream, log.mode) }
            .map_err(|e| GraphError::from_driver(graph, e))?;
        // SAFETY: the stream began capturing on this thread just above.
        let (root, _) = unsafe { driver::capture_point(log.stream) }
            .map_err(|e| GraphError::from_driver(graph, e))?;
        record::open_record(root, log.mode);
        tracing::trace!(graph, line = location.line(), "segment ended at an island");
        Ok(Boundary {
            recorded,
            record,
            island,
            location,
        })
    })();
    let result = ended.map(|b| log.done.push(b));
    debug_assert_eq!(log.graph, graph);
    SegmentLog::put_back(log);
    result
}

/// What the macro writes in place of an island it refused (inside a closure, inside an
/// expression), next to the error: never run.
#[doc(hidden)]
pub fn misplaced_island() -> Result<(), GraphError> {
    Ok(())
}

/// A local of a body with eager islands, probed for being device data: `(&&Probe(&x))`
/// finds [`ProbeHost::crosses`] when `x`'s type is a host value the runtime knows (a number, a
/// tuple or `Vec` of them), else [`ProbeDevice::crosses`] when it is
/// [`DeviceState`](crate::DeviceState) (a `CudaSlice`, a candle `Tensor`, a
/// `#[derive(DeviceState)]` struct), else [`ProbeOther::crosses`] (a kernel, a stream, a
/// shape, a reference): method lookup takes the impl reached with the fewest references. The
/// macro writes `….crosses().across()` after an island for each local made before it and used
/// after it, and `….crosses().taken()` before it for each local its code uses: device data
/// fails to compile there, anything else passes.
#[doc(hidden)]
#[derive(Debug)]
pub struct Probe<'a, T: ?Sized>(pub &'a T);

/// What probing a local that holds device data gives (see [`Probe`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct DeviceValue<T: ?Sized>(std::marker::PhantomData<T>);

/// What probing a local that holds no device data gives (see [`Probe`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct HostValue;

/// The probe of a host value the runtime knows (see [`Probe`]).
#[doc(hidden)]
pub trait ProbeHost {
    /// Probes.
    fn crosses(&self) -> HostValue;
}

impl<T: crate::state::HostData + ?Sized> ProbeHost for &Probe<'_, T> {
    #[inline(always)]
    fn crosses(&self) -> HostValue {
        HostValue
    }
}

/// The probe of device data (see [`Probe`]).
#[doc(hidden)]
pub trait ProbeDevice {
    /// What the probe found.
    type Found;
    /// Probes.
    fn crosses(&self) -> Self::Found;
}

impl<T: crate::DeviceState + ?Sized> ProbeDevice for &&Probe<'_, T> {
    type Found = DeviceValue<T>;
    #[inline(always)]
    fn crosses(&self) -> DeviceValue<T> {
        DeviceValue(std::marker::PhantomData)
    }
}

/// The probe of anything else (see [`Probe`]).
#[doc(hidden)]
pub trait ProbeOther {
    /// Probes.
    fn crosses(&self) -> HostValue;
}

impl<T: ?Sized> ProbeOther for Probe<'_, T> {
    #[inline(always)]
    fn crosses(&self) -> HostValue {
        HostValue
    }
}

impl HostValue {
    /// A host value may cross an island.
    #[inline(always)]
    pub fn across(self) {}
    /// A host value may be taken by an island's code (copied: the code is `move`).
    #[inline(always)]
    pub fn taken(self) {}
}

impl<T: ?Sized> DeviceValue<T> {
    /// Device data may not cross an island in a local (see [`CrossesIsland`]).
    #[inline(always)]
    pub fn across(self)
    where
        T: CrossesIsland,
    {
    }
    /// Device data may not be taken by an island's code (see [`TakenByIsland`]).
    #[inline(always)]
    pub fn taken(self)
    where
        T: TakenByIsland,
    {
    }
}

/// Implemented by nothing: the error of device data in a local that crosses an eager island.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is device data made before an eager island and used after it",
    label = "a temporary of an earlier segment, read after the island",
    note = "each segment is its own CUDA graph: a temporary recorded in one is not the graph's to hand to the next, and the island's eager work in between may reuse its memory; keep device data that crosses an island in a buffer the graph owns (an output `&mut`, or `#[state]`), or make it again after the island"
)]
pub trait CrossesIsland {}

/// Implemented by nothing: the error of device data of the body taken by an island's code.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "the island's code uses `{Self}`, device data of the body",
    label = "a local of the body, used inside `eager(|| …)`",
    note = "on a replay the island runs without the body: it sees the function's parameters (inputs, outputs, `#[state]`, `#[island]` state) and copies of host values made at capture; pass device data through a parameter (an output `&mut`, or `#[state]`)"
)]
pub trait TakenByIsland {}
