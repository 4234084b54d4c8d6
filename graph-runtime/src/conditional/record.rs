//! What one capture records about its conditionals: the handles it created, the nodes it
//! added with their body graphs, and the thread-local frame that holds the record while the
//! capture runs.

use super::*;

pub(super) static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// The conditionals of one capture: the handles it created, the nodes it added with their
/// bodies, and where the capture of the stream stands.
pub(crate) struct CaptureRecord {
    pub(super) id: u64,
    pub(super) root: sys::CUgraph,
    pub(super) mode: sys::CUstreamCaptureMode,
    /// Above 0 while a closure is recorded into a scratch graph to be checked: conditionals
    /// met meanwhile record their bodies inline.
    pub(super) validating: u32,
    /// A body's recording failed inside a conditional node's own body graph: the driver has
    /// freed that body, so no graph of this capture may be ended, destroyed or used.
    pub(crate) poisoned: bool,
    pub(super) handles: Vec<HandleRecord>,
    pub(super) nodes: Vec<NodeRecord>,
}

pub(super) struct HandleRecord {
    pub(super) handle: u64,
    pub(super) location: &'static Location<'static>,
    pub(super) used: bool,
}

/// One conditional node and its body graphs (owned by the node).
pub(crate) struct NodeRecord {
    pub(crate) node: sys::CUgraphNode,
    /// `CU_GRAPH_COND_TYPE_IF` or `_WHILE`, as a number.
    pub(crate) kind: u32,
    pub(crate) bodies: Vec<sys::CUgraph>,
}

impl CaptureRecord {
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

thread_local! {
    static FRAME: RefCell<Option<CaptureRecord>> = const { RefCell::new(None) };
}

/// Starts the record of a capture that began recording into `root` in `mode`.
pub(crate) fn open_record(root: sys::CUgraph, mode: sys::CUstreamCaptureMode) {
    let record = CaptureRecord {
        id: NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed),
        root,
        mode,
        validating: 0,
        poisoned: false,
        handles: Vec::new(),
        nodes: Vec::new(),
    };
    FRAME.with(|f| *f.borrow_mut() = Some(record));
}

/// Ends the record of the current capture and hands it back.
pub(crate) fn close_record() -> Option<CaptureRecord> {
    FRAME.with(|f| f.borrow_mut().take())
}

pub(super) fn with_record<R>(f: impl FnOnce(&mut CaptureRecord) -> R) -> Option<R> {
    FRAME.with(|fr| fr.borrow_mut().as_mut().map(f))
}
