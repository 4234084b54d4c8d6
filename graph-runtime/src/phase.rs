//! What the current thread is doing as far as graphs are concerned: running eagerly,
//! warming a graph up, or capturing one; and the one helper every host-side operation uses
//! to refuse to run while the thread captures.
//!
//! The phase is thread-local: a capture records the work of the thread that runs the body
//! (the runtime captures in `thread_local` mode by default), so "am I being captured" is a
//! question about this thread.
//!
//! Everything the thread knows about the capture it runs lives in one `Frame` behind one
//! thread-local: the phase, the graph whose capture procedure runs, the kernel lookups and
//! early launches it counts, how deep it is in conditional bodies and forks, the record of
//! the capture's conditionals, the segments recorded before its eager islands, and (feature
//! `nccl`) the open collective sessions. Each part is
//! set for a stretch of the procedure by one guard, `FrameScope`, which puts back what was
//! there before when it drops (also on panic).

use std::cell::{Cell, RefCell};
use std::panic::Location;

use cudarc::driver::sys;

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

/// The capture state of one thread. Each part is its own cell, so reading one never waits
/// on another's borrow.
pub(crate) struct Frame {
    phase: Cell<Phase>,
    /// The graph whose capture procedure (warmup included) runs on this thread.
    procedure: Cell<Option<&'static str>>,
    /// The kernels the current run looked up through the runtime, while a capture procedure
    /// with determinism checks records them.
    lookups: RefCell<Option<Vec<String>>>,
    /// Early launches this thread made, ever (a capture counts the difference).
    early_launches: Cell<u64>,
    /// While a warmup (or `verify`'s eager run) is to be undone: the generators (by id) this
    /// thread handed to a kernel since, the only ones it puts back.
    generators: RefCell<Option<Vec<u64>>>,
    /// How many `graph_while` / `graph_if` bodies this thread is inside (eagerly or
    /// recording).
    conditional_depth: Cell<u32>,
    /// How many `fork` closures this thread is inside.
    fork_depth: Cell<u32>,
    /// What the capture in progress recorded about its conditionals (`crate::conditional`
    /// opens and closes it).
    pub(crate) record: RefCell<Option<CaptureRecord>>,
    /// The segments the capture in progress has recorded before its eager islands: owned and
    /// typed by `crate::capture`, which sits above this file, so held here without naming
    /// its type.
    pub(crate) segments: RefCell<Option<Box<dyn std::any::Any>>>,
    /// The collective sessions open on this thread: owned and typed by `crate::nccl`, which
    /// sits above this file, so held here without naming its type.
    #[cfg(feature = "nccl")]
    pub(crate) nccl_sessions: RefCell<Option<Box<dyn std::any::Any>>>,
    /// What runs when the capture procedure in progress ends (also on panic): `crate::fork`
    /// gives back the side streams it kept for the procedure.
    procedure_end: RefCell<Vec<Box<dyn FnOnce()>>>,
}

thread_local! {
    static FRAME: Frame = const {
        Frame {
            phase: Cell::new(Phase::Eager),
            procedure: Cell::new(None),
            lookups: RefCell::new(None),
            early_launches: Cell::new(0),
            generators: RefCell::new(None),
            conditional_depth: Cell::new(0),
            fork_depth: Cell::new(0),
            record: RefCell::new(None),
            segments: RefCell::new(None),
            #[cfg(feature = "nccl")]
            nccl_sessions: RefCell::new(None),
            procedure_end: RefCell::new(Vec::new()),
        }
    };
}

/// Runs `f` on this thread's [`Frame`].
#[inline]
pub(crate) fn with_frame<R>(f: impl FnOnce(&Frame) -> R) -> R {
    FRAME.with(f)
}

/// The conditionals of one capture: the handles it created, the nodes it added with their
/// bodies, and where the capture of the stream stands (filled in by `crate::conditional`).
pub(crate) struct CaptureRecord {
    pub(crate) id: u64,
    pub(crate) root: sys::CUgraph,
    pub(crate) mode: sys::CUstreamCaptureMode,
    /// Above 0 while a closure is recorded into a scratch graph to be checked: conditionals
    /// met meanwhile record their bodies inline.
    pub(crate) validating: u32,
    /// The handles tested by constructs recorded inline during the current scratch recording
    /// (cleared when one begins at the outermost level): a second test of one, such as a
    /// `graph_if` in every copy of an unrolled step, is refused there, never in a node's body.
    pub(crate) inline_tested: Vec<u64>,
    /// A body's recording failed inside a conditional node's own body graph: the driver has
    /// freed that body, so no graph of this capture may be ended, destroyed or used.
    pub(crate) poisoned: bool,
    pub(crate) handles: Vec<HandleRecord>,
    pub(crate) nodes: Vec<NodeRecord>,
}

/// A conditional handle a capture created, and whether a conditional node tested it.
pub(crate) struct HandleRecord {
    pub(crate) handle: u64,
    pub(crate) location: &'static Location<'static>,
    pub(crate) used: bool,
}

/// One conditional node and its body graphs (owned by the node).
pub(crate) struct NodeRecord {
    pub(crate) node: sys::CUgraphNode,
    /// `CU_GRAPH_COND_TYPE_IF` or `_WHILE`, as a number.
    pub(crate) kind: u32,
    pub(crate) bodies: Vec<sys::CUgraph>,
}

impl CaptureRecord {
    /// A record of no conditionals yet, for a capture of graph `root` in `mode` (`id` tells
    /// captures apart).
    pub(crate) fn new(id: u64, root: sys::CUgraph, mode: sys::CUstreamCaptureMode) -> Self {
        CaptureRecord {
            id,
            root,
            mode,
            validating: 0,
            inline_tested: Vec::new(),
            poisoned: false,
            handles: Vec::new(),
            nodes: Vec::new(),
        }
    }

    /// The first condition created but never tested by a conditional node.
    pub(crate) fn unused_condition(&self) -> Option<&'static Location<'static>> {
        self.handles.iter().find(|h| !h.used).map(|h| h.location)
    }

    /// The conditional handles the capture created, in order.
    pub(crate) fn handles(&self) -> Vec<u64> {
        self.handles.iter().map(|h| h.handle).collect()
    }

    /// The body graphs of conditional node `node`, if it is one of this capture's.
    pub(crate) fn bodies_of(&self, node: sys::CUgraphNode) -> Option<&[sys::CUgraph]> {
        self.node(node).map(|n| n.bodies.as_slice())
    }

    /// Conditional node `node`, if it is one of this capture's.
    pub(crate) fn node(&self, node: sys::CUgraphNode) -> Option<&NodeRecord> {
        self.nodes.iter().find(|n| n.node == node)
    }
}

/// Sets one part of this thread's [`Frame`] and puts the previous value back when dropped
/// (also on panic): the one guard of the capture state.
#[must_use = "the part is put back when the scope drops"]
pub(crate) struct FrameScope(Saved);

/// What a [`FrameScope`] puts back.
enum Saved {
    Phase(Phase),
    Procedure(Option<&'static str>),
    ConditionalDepth(u32),
    ForkDepth(u32),
}

impl FrameScope {
    /// Sets the thread's phase.
    pub(crate) fn phase(phase: Phase) -> Self {
        FrameScope(Saved::Phase(with_frame(|f| f.phase.replace(phase))))
    }

    /// Enters the capture procedure of `graph`, or names the graph whose procedure already
    /// runs on this thread (captures do not nest).
    pub(crate) fn procedure(graph: &'static str) -> Result<Self, &'static str> {
        with_frame(|f| match f.procedure.get() {
            Some(outer) => Err(outer),
            None => Ok(FrameScope(Saved::Procedure(
                f.procedure.replace(Some(graph)),
            ))),
        })
    }

    /// Inside the body of a `graph_while` / `graph_if`.
    pub(crate) fn conditional() -> Self {
        with_frame(|f| {
            let depth = f.conditional_depth.get();
            f.conditional_depth.set(depth + 1);
            FrameScope(Saved::ConditionalDepth(depth))
        })
    }

    /// Inside a fork's closure.
    pub(crate) fn fork() -> Self {
        with_frame(|f| {
            let depth = f.fork_depth.get();
            f.fork_depth.set(depth + 1);
            FrameScope(Saved::ForkDepth(depth))
        })
    }
}

impl Drop for FrameScope {
    fn drop(&mut self) {
        with_frame(|f| match self.0 {
            Saved::Phase(p) => f.phase.set(p),
            Saved::Procedure(g) => {
                f.procedure.set(g);
                if g.is_none() {
                    let ends = std::mem::take(&mut *f.procedure_end.borrow_mut());
                    ends.into_iter().for_each(|end| end());
                }
            }
            Saved::ConditionalDepth(d) => f.conditional_depth.set(d),
            Saved::ForkDepth(d) => f.fork_depth.set(d),
        });
    }
}

/// The current thread's [`Phase`].
pub fn phase() -> Phase {
    with_frame(|f| f.phase.get())
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

/// Whether this thread is running a capture procedure (warmup, capture or verification of a
/// graph), so it already holds its runtime's capture lock.
/// Notes that generator `id` drew, or was handed to a kernel, on this thread (kept only
/// between [`start_noting_generators`] and [`take_generators_used`]).
pub(crate) fn note_generator(id: u64) {
    with_frame(|f| {
        if let Some(used) = f.generators.borrow_mut().as_mut() {
            if !used.contains(&id) {
                used.push(id);
            }
        }
    });
}

/// Starts noting the generators this thread uses (see [`note_generator`]).
pub(crate) fn start_noting_generators() {
    with_frame(|f| *f.generators.borrow_mut() = Some(Vec::new()));
}

/// The generators noted since [`start_noting_generators`], and stops noting.
pub(crate) fn take_generators_used() -> Vec<u64> {
    with_frame(|f| f.generators.borrow_mut().take().unwrap_or_default())
}

/// The graph whose capture procedure this thread runs, if any.
pub(crate) fn procedure_of_thread() -> Option<&'static str> {
    with_frame(|f| f.procedure.get())
}

pub(crate) fn in_procedure() -> bool {
    procedure_of_thread().is_some()
}

/// Runs `end` when the capture procedure running on this thread ends (also on panic), or
/// now when none runs.
pub(crate) fn at_procedure_end(end: Box<dyn FnOnce()>) {
    if !in_procedure() {
        return end();
    }
    with_frame(|f| f.procedure_end.borrow_mut().push(end));
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
            with_frame(|f| *f.lookups.borrow_mut() = Some(Vec::new()));
        }
        KernelLookups { on }
    }

    /// The lookups recorded since the last `take` (empty when off); recording goes on.
    pub(crate) fn take(&self) -> Vec<String> {
        if !self.on {
            return Vec::new();
        }
        with_frame(|f| {
            f.lookups
                .borrow_mut()
                .as_mut()
                .map(std::mem::take)
                .unwrap_or_default()
        })
    }
}

impl Drop for KernelLookups {
    fn drop(&mut self) {
        if self.on {
            with_frame(|f| *f.lookups.borrow_mut() = None);
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
    with_frame(|f| {
        if let Some(v) = f.lookups.borrow_mut().as_mut() {
            v.push(name.to_owned());
        }
    });
}

/// Counts the early launches ([`crate::EarlyLaunch`]) this thread makes while it lives, so a
/// capture knows whether its graph can have programmatic edges at all.
pub(crate) struct EarlyLaunches {
    before: u64,
}

impl EarlyLaunches {
    pub(crate) fn start() -> Self {
        EarlyLaunches {
            before: with_frame(|f| f.early_launches.get()),
        }
    }

    /// Early launches since `start`.
    pub(crate) fn count(&self) -> usize {
        (with_frame(|f| f.early_launches.get()) - self.before) as usize
    }
}

/// Notes one early launch on this thread.
pub(crate) fn note_early_launch() {
    with_frame(|f| f.early_launches.set(f.early_launches.get() + 1));
}

/// Whether this thread is running (or recording) the body of a `graph_while` / `graph_if`.
pub(crate) fn in_conditional_body() -> bool {
    with_frame(|f| f.conditional_depth.get()) > 0
}

/// Whether this thread is inside the closure of a [`Runtime::fork`](crate::Runtime::fork).
pub(crate) fn in_fork() -> bool {
    with_frame(|f| f.fork_depth.get()) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_nest_and_unwind() {
        assert_eq!(phase(), Phase::Eager);
        {
            let _w = FrameScope::phase(Phase::Warmup { graph: "g", run: 1 });
            assert!(!is_capturing());
            assert!(ensure_not_capturing("op").is_ok());
            {
                let _c = FrameScope::phase(Phase::Capture { graph: "g" });
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
            let _c = FrameScope::phase(Phase::Capture { graph: "p" });
            panic!("inside a capture");
        });
        assert!(unwound.is_err());
        assert_eq!(phase(), Phase::Eager, "a panic puts the phase back");
    }

    #[test]
    fn depth_scopes_count_and_unwind() {
        assert!(!in_conditional_body() && !in_fork());
        {
            let _a = FrameScope::conditional();
            let _b = FrameScope::conditional();
            assert!(in_conditional_body());
            assert!(!in_fork());
            let _f = FrameScope::fork();
            assert!(in_fork());
        }
        assert!(!in_conditional_body() && !in_fork());
        let unwound = std::panic::catch_unwind(|| {
            let _c = FrameScope::conditional();
            panic!("inside a loop body");
        });
        assert!(unwound.is_err());
        assert!(!in_conditional_body(), "a panic leaves the body");
    }

    #[test]
    fn procedures_do_not_nest() {
        let outer = FrameScope::procedure("a").expect("first");
        assert_eq!(FrameScope::procedure("b").err(), Some("a"));
        drop(outer);
        assert!(FrameScope::procedure("b").is_ok());
    }
}
