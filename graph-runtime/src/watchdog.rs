//! The capture watchdog: a diagnostic, within about a second, for a body that waits on
//! something a capture never delivers.
//!
//! While a stream captures, a query of an event or a stream (`CudaEvent::is_complete`,
//! `cuStreamQuery`), a synchronize or a blocking call from the capturing thread fails and
//! invalidates the capture (CUDA errors 900 and 901). cudarc turns a failed query into
//! "not complete", so a body that spins until an event completes, hidden behind a type of
//! the user's, spins forever; a body that blocks on a channel fed by work that cannot run
//! during the capture waits forever too. The library cannot interrupt user code on its
//! thread. So every capture registers its stream here, and one background thread looks at
//! the registered captures every 100 ms: a capture that CUDA has invalidated and whose body
//! has not returned after a second, or whose body has run for ten seconds, is reported once
//! through `tracing` at level ERROR (target `graph_runtime::watchdog`), naming the graph, how
//! long the body has run, what CUDA says of the capture and the likely causes.
//!
//! The thread starts with the first capture of the process and only reads the capture status
//! of the registered streams (`cuStreamIsCapturing`, which no capture mode forbids).

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys;

use crate::driver;

/// How long an invalidated capture's body may go on before it is reported.
pub(crate) const INVALIDATED_AFTER: Duration = Duration::from_secs(1);
/// How long any body may run under capture before it is reported.
pub(crate) const RUNNING_AFTER: Duration = Duration::from_secs(10);
/// How often the watchdog looks.
const PERIOD: Duration = Duration::from_millis(100);

/// One capture in progress.
struct Watched {
    id: u64,
    graph: &'static str,
    stream: usize,
    ctx: usize,
    since: Instant,
    reported_invalidated: bool,
    reported_running: bool,
}

struct Registry {
    next: u64,
    watched: Vec<Watched>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 0,
    watched: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// A capture under watch; dropping it ends the watch (before the stream can go away: the
/// capture that holds it holds the runtime).
#[derive(Debug)]
pub(crate) struct Watch {
    id: u64,
}

impl Watch {
    /// Watches the capture of `graph` on `stream`, of context `ctx`.
    pub(crate) fn start(graph: &'static str, stream: sys::CUstream, ctx: sys::CUcontext) -> Self {
        static THREAD: OnceLock<()> = OnceLock::new();
        THREAD.get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("cuda-graph-watchdog".into())
                .spawn(watch_loop);
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "the capture watchdog thread could not start");
            }
        });
        let mut r = registry();
        let id = r.next;
        r.next += 1;
        r.watched.push(Watched {
            id,
            graph,
            stream: stream as usize,
            ctx: ctx as usize,
            since: Instant::now(),
            reported_invalidated: false,
            reported_running: false,
        });
        Watch { id }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        registry().watched.retain(|w| w.id != self.id);
    }
}

fn watch_loop() {
    loop {
        std::thread::sleep(PERIOD);
        let mut r = registry();
        for w in r.watched.iter_mut() {
            let ran = w.since.elapsed();
            if ran < INVALIDATED_AFTER || (w.reported_invalidated && w.reported_running) {
                continue;
            }
            // The lock is held: the stream is alive until its watch is dropped.
            let status = status_of(w.ctx as sys::CUcontext, w.stream as sys::CUstream);
            let invalidated =
                status == Some(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
            if invalidated && !w.reported_invalidated {
                w.reported_invalidated = true;
                w.reported_running = true;
                tracing::error!(
                    target: "graph_runtime::watchdog",
                    graph = w.graph,
                    seconds = ran.as_secs_f64(),
                    "the capture of `{}` was invalidated by CUDA and its body has not returned for {:.1} s: \
                     it likely waits for something a capture never delivers. A query of an event or a \
                     stream (`is_complete()`, `cuStreamQuery`) fails during a capture and cudarc reads that \
                     as \"not done\", so a loop on one spins forever; a blocking receive waits for work \
                     that cannot run. Fix: wait outside the captured body (before the capture, or in an \
                     eager island, `rt.eager(|| …)`), or order GPU work with events and `join` instead of \
                     waiting on the host",
                    w.graph,
                    ran.as_secs_f64()
                );
            } else if ran >= RUNNING_AFTER && !w.reported_running {
                w.reported_running = true;
                tracing::error!(
                    target: "graph_runtime::watchdog",
                    graph = w.graph,
                    seconds = ran.as_secs_f64(),
                    "the body of `{}` has been under capture for {:.0} s: a captured body only queues \
                     work, so it likely waits on the host (a lock, a channel, a sleep, a loop on a host \
                     condition) for something the capture holds up",
                    w.graph,
                    ran.as_secs_f64()
                );
            }
        }
    }
}

/// The capture status of `stream`, or `None` when the driver cannot say.
fn status_of(ctx: sys::CUcontext, stream: sys::CUstream) -> Option<sys::CUstreamCaptureStatus> {
    // SAFETY: `ctx` is the context the capturing runtime holds alive and `stream` a live
    // stream of it: the capture keeps both until its watch is dropped, which takes the lock
    // this function runs under.
    unsafe { driver::set_current(ctx).and_then(|()| driver::capture_status(stream)) }.ok()
}
