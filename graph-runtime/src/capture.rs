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

use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaStream, DriverError};

use crate::conditional::record::{self, CaptureRecord};
use crate::driver;
use crate::error::{GraphError, When};
use crate::fingerprint::Fingerprint;
use crate::graph::{Graph, GraphInfo};
use crate::inputs::InputNodes;
use crate::phase::{FrameScope, Phase};
use crate::recorded::RecordedGraph;
use crate::rng::WarmupSnapshot;
use crate::runtime::Runtime;
use crate::site::{GraphSite, Step};
use crate::snapshot::StateSnapshot;
use crate::state::AddressBook;

/// A capture in progress on the runtime's stream. Dropping it without [`ActiveCapture::end`]
/// (an error or a panic in the body) ends and discards the capture.
struct ActiveCapture<'r> {
    rt: &'r Runtime,
    site: &'static GraphSite,
    _phase: FrameScope,
    open: bool,
}

impl<'r> ActiveCapture<'r> {
    fn begin(rt: &'r Runtime, site: &'static GraphSite) -> Result<Self, GraphError> {
        rt.refuse_event_tracking("capturing a graph")?;
        let stream = rt.stream();
        stream.context().bind_to_thread()?;
        rt.gate().begin_capture();
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
        Ok(ActiveCapture {
            rt,
            site,
            _phase: FrameScope::phase(Phase::Capture { graph: site.name }),
            open: true,
        })
    }

    /// Ends the capture and hands back the recorded graph (`None` when nothing was recorded),
    /// or the error CUDA gave, with what the capture recorded about its conditionals.
    fn end(mut self) -> (Result<Option<RecordedGraph>, DriverError>, CaptureRecord) {
        self.open = false;
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
            );
        }
        (result, record)
    }
}

impl Drop for ActiveCapture<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
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
/// `static_bytes` is what the graph's static buffers take, for its report.
#[doc(hidden)]
pub fn capture(
    rt: &Runtime,
    site: &'static GraphSite,
    book: &AddressBook,
    inputs: &InputNodes,
    static_bytes: usize,
    body: &mut dyn FnMut(Step) -> Result<(), GraphError>,
) -> Result<Graph, GraphError> {
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
    // candle's small shape uploads are cached during warmup and reused by the capture.
    #[cfg(feature = "candle")]
    let _htod_cache = crate::candle::hold_htod_cache(rt);
    let input_copy = inputs.prepare(rt)?;
    // Warmup draws random numbers and updates `&mut` state; both are put back afterwards, so
    // that the first replay sees what the first eager call would have (see `crate::state`).
    let snapshots = Snapshots::take(rt, book)?;
    let lookups = crate::phase::KernelLookups::start(site.determinism);
    let warmed = warm_up(rt, site, body, &lookups);
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
            clear_recorded_errors(rt, graph);
            panic::resume_unwind(payload);
        }
    };
    let warmup_time = started.elapsed();
    tracing::trace!(graph, ms = warmup_time.as_secs_f64() * 1e3, "warmup done");

    let capture_started = Instant::now();
    let active = ActiveCapture::begin(rt, site)?;
    let early_launches = crate::phase::EarlyLaunches::start();
    let input_nodes = match &input_copy {
        Some(copy) => inputs.record(rt, copy),
        None => Ok(Vec::new()),
    };
    let body_result = input_nodes.and_then(|nodes| body(Step::Run(When::Capture)).map(|()| nodes));
    let capture_lookups = lookups.take();
    let ((raw, record), input_nodes) = match body_result {
        Err(e) => {
            drop(active);
            // A body that failed may also have replaced a buffer; that is the worse news.
            body(Step::Check(When::Capture))?;
            return Err(freed_in_capture(
                rt,
                graph,
                GraphError::in_capture(graph, e),
            ));
        }
        Ok(nodes) => (
            end_capture(rt, graph, active).map_err(|e| freed_in_capture(rt, graph, e))?,
            nodes,
        ),
    };
    let capture_time = capture_started.elapsed();
    // On every early return below, the recorded graph is destroyed as it drops.
    body(Step::Check(When::Capture))?;
    let Some(raw) = raw else {
        return Err(GraphError::EmptyGraph { graph });
    };
    let checks_started = Instant::now();
    if site.determinism {
        let copy = input_copy.as_ref().map(|c| (inputs, c));
        check_determinism(
            rt,
            site,
            body,
            (&raw, &record),
            copy,
            &warmup_lookups,
            capture_lookups,
        )?;
    }
    let checks_time = checks_started.elapsed();
    // Ranks capturing collectives together compare what they recorded before any of them
    // instantiates (see `crate::nccl`; a determinism check's second capture is recorded the
    // same way on every rank); without an open session this does nothing.
    #[cfg(feature = "nccl")]
    crate::nccl::session::before_instantiate(site)?;

    let info = GraphInfo {
        rng,
        temp_bytes: 0,
        temp_requested_bytes: 0,
        pool_added_bytes: 0,
        pool_shared_bytes: 0,
        pool_reserved_bytes: 0,
        exec_bytes: None,
        static_bytes,
        // Counted by `Graph::instantiate`, which reads the edges only when this is not 0.
        early_edges: early_launches.count(),
        state_snapshot_bytes,
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
    let mut built = Graph::instantiate(rt, raw, info, input_nodes, &record)?;
    built.settle_for(book);
    tracing::debug!(
        graph,
        nodes = built.info().nodes(),
        temp_bytes = built.info().temp_bytes,
        pool_added_bytes = built.info().pool_added_bytes,
        exec_bytes = ?built.info().exec_bytes,
        static_bytes,
        state_snapshot_bytes,
        early_edges = built.info().early_edges,
        warmup = site.warmup,
        warmup_ms = warmup_time.as_secs_f64() * 1e3,
        capture_ms = capture_time.as_secs_f64() * 1e3,
        instantiate_ms = built.info().instantiate_time.as_secs_f64() * 1e3,
        "captured CUDA graph"
    );
    Ok(built)
}

/// In a capture on a candle runtime, CUDA's invalid-value error is what freeing a tensor made
/// before the capture gives (candle frees op outputs as they drop): name that cause.
fn freed_in_capture(rt: &Runtime, graph: &'static str, e: GraphError) -> GraphError {
    #[cfg(feature = "candle")]
    if rt.candle_device().is_some() {
        let code = match &e {
            GraphError::Driver(d) => Some(d.0),
            GraphError::Body { source, .. } => match &**source {
                GraphError::Driver(d) => Some(d.0),
                _ => None,
            },
            _ => None,
        };
        if code == Some(sys::CUresult::CUDA_ERROR_INVALID_VALUE) {
            return GraphError::FreedInCapture { graph };
        }
    }
    let _ = (rt, graph);
    e
}

/// The optional checks of `check_determinism`: the kernels the last warmup run and the
/// capture looked up through the runtime must be the same, and a second capture must record
/// what the first did.
fn check_determinism(
    rt: &Runtime,
    site: &'static GraphSite,
    body: &mut dyn FnMut(Step) -> Result<(), GraphError>,
    first: (&RecordedGraph, &CaptureRecord),
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
    // SAFETY: `first` is the live graph just captured on the runtime's context.
    let a = unsafe { Fingerprint::of(first.0.raw(), skip, first.1) }?;
    let active = ActiveCapture::begin(rt, site)?;
    let recorded = match inputs {
        Some((inputs, copy)) => inputs.record(rt, copy).map(drop),
        None => Ok(()),
    };
    let (second, second_record) = match recorded.and_then(|()| body(Step::Run(When::Capture))) {
        Err(e) => {
            drop(active);
            return Err(GraphError::in_capture(graph, e));
        }
        Ok(()) => end_capture(rt, graph, active)?,
    };
    let checked = body(Step::Check(When::Capture));
    let b = match second {
        None => None,
        Some(second) => {
            // SAFETY: `second` is the live graph just captured; destroyed right after, as it
            // drops.
            let b = unsafe { Fingerprint::of(second.raw(), skip, &second_record) };
            drop(second);
            Some(b?)
        }
    };
    checked?;
    let difference = match b {
        None => Some("the second capture recorded nothing".to_owned()),
        Some(b) => a.first_difference(&b),
    };
    match difference {
        None => Ok(()),
        Some(difference) => Err(GraphError::NondeterministicCapture { graph, difference }),
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
        let active = ActiveCapture::begin(rt, site).ok()?;
        let recorded = panic::catch_unwind(AssertUnwindSafe(|| body(Step::Run(When::Capture))));
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

/// Ends a capture whose body returned `Ok` and hands back the recorded graph (`None` when
/// nothing was recorded) with the record of its conditionals, or the error that explains why
/// the capture failed. A graph not handed back is destroyed as it drops.
fn end_capture(
    rt: &Runtime,
    graph: &'static str,
    active: ActiveCapture<'_>,
) -> Result<(Option<RecordedGraph>, CaptureRecord), GraphError> {
    let (ended, record) = active.end();
    let recorded = clear_recorded_errors(rt, graph);
    match ended {
        Ok(raw) if recorded.is_none() => {
            if let Some(location) = record.unused_condition() {
                drop(raw);
                return Err(GraphError::UnusedCondition { graph, location });
            }
            Ok((raw, record))
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
