//! What the current thread is doing as far as graphs are concerned: running eagerly,
//! warming a graph up, or capturing one; and the one helper every host-side operation uses
//! to refuse to run while the thread captures.
//!
//! The phase is thread-local: a capture records the work of the thread that runs the body
//! (the runtime captures in `thread_local` mode by default), so "am I being captured" is a
//! question about this thread.

use std::cell::{Cell, RefCell};
use std::panic::Location;

use crate::error::GraphError;

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
    /// The kernels the current run looked up through the runtime, while a capture procedure
    /// with determinism checks records them.
    static LOOKUPS: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    /// The graph whose capture procedure (warmup included) runs on this thread.
    static PROCEDURE: Cell<Option<&'static str>> = const { Cell::new(None) };
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
    let location = Location::caller();
    refuse_while_capturing(|graph| GraphError::SyncInCapture {
        op,
        graph,
        location,
    })
}

/// The one "not while capturing" check: `Err(refusal(graph))` when this thread is capturing
/// `graph`, `Ok(())` otherwise. Every host-side operation that a capture would record
/// wrongly (a sync, a host read of generator state, a new generator, a new side stream)
/// calls this with the error that names it.
#[inline]
pub(crate) fn refuse_while_capturing(
    refusal: impl FnOnce(&'static str) -> GraphError,
) -> Result<(), GraphError> {
    match phase() {
        Phase::Capture { graph } => Err(refusal(graph)),
        _ => Ok(()),
    }
}

/// Sets the thread's phase and puts the previous one back on drop (also on panic).
pub(crate) struct PhaseScope(Phase);

impl PhaseScope {
    pub(crate) fn enter(phase: Phase) -> Self {
        PhaseScope(PHASE.with(|p| p.replace(phase)))
    }
}

impl Drop for PhaseScope {
    fn drop(&mut self) {
        PHASE.with(|p| p.set(self.0));
    }
}

/// Marks the thread as running the capture procedure of one graph, until dropped.
pub(crate) struct ProcedureScope;

impl ProcedureScope {
    /// Enters the procedure of `graph`, or names the graph whose procedure already runs on
    /// this thread (captures do not nest).
    pub(crate) fn enter(graph: &'static str) -> Result<Self, &'static str> {
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

/// Whether this thread is running a capture procedure (warmup, capture or verification of a
/// graph), so it already holds its runtime's capture lock.
pub(crate) fn in_procedure() -> bool {
    PROCEDURE.with(|p| p.get().is_some())
}

/// Records the kernels this thread looks up through the runtime (`Runtime::function`) while
/// it lives, so the capture procedure can compare its warmup with its capture.
pub(crate) struct KernelLookups {
    on: bool,
}

impl KernelLookups {
    /// Starts recording when `on`.
    pub(crate) fn start(on: bool) -> Self {
        if on {
            LOOKUPS.with(|l| *l.borrow_mut() = Some(Vec::new()));
        }
        KernelLookups { on }
    }

    /// The lookups recorded since the last `take` (empty when off); recording goes on.
    pub(crate) fn take(&self) -> Vec<String> {
        if !self.on {
            return Vec::new();
        }
        LOOKUPS.with(|l| {
            l.borrow_mut()
                .as_mut()
                .map(std::mem::take)
                .unwrap_or_default()
        })
    }
}

impl Drop for KernelLookups {
    fn drop(&mut self) {
        if self.on {
            LOOKUPS.with(|l| *l.borrow_mut() = None);
        }
    }
}

/// Notes a kernel lookup when a capture procedure records them. Lookups inside the body of a
/// `graph_while` / `graph_if` are not noted: eagerly the body runs once per iteration, while
/// captured it is recorded a fixed number of times, so the two could not be compared.
pub(crate) fn note_kernel_lookup(name: &str) {
    if in_conditional_body() {
        return;
    }
    LOOKUPS.with(|l| {
        if let Some(v) = l.borrow_mut().as_mut() {
            v.push(name.to_owned());
        }
    });
}

/// Counts the early launches ([`crate::EarlyLaunch`]) this thread makes while it lives, so a
/// capture knows whether its graph can have programmatic edges at all.
pub(crate) struct EarlyLaunches {
    before: u64,
}

thread_local! {
    static EARLY: Cell<u64> = const { Cell::new(0) };
}

impl EarlyLaunches {
    pub(crate) fn start() -> Self {
        EarlyLaunches {
            before: EARLY.with(Cell::get),
        }
    }

    /// Early launches since `start`.
    pub(crate) fn count(&self) -> usize {
        (EARLY.with(Cell::get) - self.before) as usize
    }
}

/// Notes one early launch on this thread.
pub(crate) fn note_early_launch() {
    EARLY.with(|c| c.set(c.get() + 1));
}

thread_local! {
    /// How many `graph_while` / `graph_if` bodies this thread is inside (eagerly or recording).
    static CONDITIONAL_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// How many `fork` closures this thread is inside.
    static FORK_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is running (or recording) the body of a `graph_while` / `graph_if`.
pub(crate) fn in_conditional_body() -> bool {
    CONDITIONAL_DEPTH.with(Cell::get) > 0
}

/// Whether this thread is inside the closure of a [`Runtime::fork`](crate::Runtime::fork).
pub(crate) fn in_fork() -> bool {
    FORK_DEPTH.with(Cell::get) > 0
}

/// Marks the thread as inside a conditional body (or a fork's closure) until dropped, also
/// on panic.
pub(crate) struct DepthScope(&'static std::thread::LocalKey<Cell<u32>>);

impl DepthScope {
    /// Inside the body of a `graph_while` / `graph_if`.
    pub(crate) fn conditional() -> Self {
        CONDITIONAL_DEPTH.with(|d| d.set(d.get() + 1));
        DepthScope(&CONDITIONAL_DEPTH)
    }

    /// Inside a fork's closure.
    pub(crate) fn fork() -> Self {
        FORK_DEPTH.with(|d| d.set(d.get() + 1));
        DepthScope(&FORK_DEPTH)
    }
}

impl Drop for DepthScope {
    fn drop(&mut self) {
        self.0.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_nest_and_unwind() {
        assert_eq!(phase(), Phase::Eager);
        {
            let _w = PhaseScope::enter(Phase::Warmup { graph: "g", run: 1 });
            assert!(!is_capturing());
            assert!(ensure_not_capturing("op").is_ok());
            {
                let _c = PhaseScope::enter(Phase::Capture { graph: "g" });
                assert!(is_capturing());
                let err = ensure_not_capturing("op").unwrap_err();
                assert!(matches!(
                    err,
                    GraphError::SyncInCapture {
                        op: "op",
                        graph: "g",
                        ..
                    }
                ));
            }
            assert_eq!(phase(), Phase::Warmup { graph: "g", run: 1 });
        }
        let unwound = std::panic::catch_unwind(|| {
            let _c = PhaseScope::enter(Phase::Capture { graph: "p" });
            panic!("inside a capture");
        });
        assert!(unwound.is_err());
        assert_eq!(phase(), Phase::Eager, "a panic puts the phase back");
    }

    #[test]
    fn depth_scopes_count_and_unwind() {
        assert!(!in_conditional_body() && !in_fork());
        {
            let _a = DepthScope::conditional();
            let _b = DepthScope::conditional();
            assert!(in_conditional_body());
            assert!(!in_fork());
            let _f = DepthScope::fork();
            assert!(in_fork());
        }
        assert!(!in_conditional_body() && !in_fork());
        let unwound = std::panic::catch_unwind(|| {
            let _c = DepthScope::conditional();
            panic!("inside a loop body");
        });
        assert!(unwound.is_err());
        assert!(!in_conditional_body(), "a panic leaves the body");
    }

    #[test]
    fn procedures_do_not_nest() {
        let outer = ProcedureScope::enter("a").expect("first");
        assert_eq!(ProcedureScope::enter("b").err(), Some("a"));
        drop(outer);
        assert!(ProcedureScope::enter("b").is_ok());
    }
}
