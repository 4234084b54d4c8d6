//! What one capture records about its conditionals: the handles it created, the nodes it
//! added with their body graphs. The record itself is held in the thread's capture frame
//! (`crate::phase::Frame`) while the capture runs.

use super::*;
use crate::phase::with_frame;
pub(crate) use crate::phase::{CaptureRecord, HandleRecord, NodeRecord};

pub(super) static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// Starts the record of a capture that began recording into `root` in `mode`.
pub(crate) fn open_record(root: sys::CUgraph, mode: sys::CUstreamCaptureMode) {
    let record = CaptureRecord::new(NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed), root, mode);
    with_frame(|f| *f.record.borrow_mut() = Some(record));
}

/// Ends the record of the current capture and hands it back.
pub(crate) fn close_record() -> Option<CaptureRecord> {
    with_frame(|f| f.record.borrow_mut().take())
}

pub(super) fn with_record<R>(f: impl FnOnce(&mut CaptureRecord) -> R) -> Option<R> {
    with_frame(|fr| fr.record.borrow_mut().as_mut().map(f))
}
