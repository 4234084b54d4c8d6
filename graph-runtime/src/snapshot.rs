//! [`StateSnapshot`]: a device copy of the `&mut` state an [`AddressBook`] recorded, taken
//! before the warmup runs (and around a verification) and written back after them. It sits
//! above the runtime, whose stream it copies on; the rest of `state` sits below it.

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::driver;
use crate::error::GraphError;
use crate::region::DeviceRegion;
use crate::runtime::Runtime;
use crate::state::AddressBook;

/// A device copy of the restorable state of an [`AddressBook`], taken before the warmup runs
/// and written back after them.
pub(crate) struct StateSnapshot {
    copy: Option<CudaSlice<u8>>,
    regions: Vec<DeviceRegion>,
}

impl StateSnapshot {
    /// Copies every restorable region of `book` into one device buffer, on the runtime's
    /// stream.
    pub(crate) fn take(rt: &Runtime, book: &AddressBook) -> Result<Self, GraphError> {
        Self::take_regions(rt, book, book.restorable().collect())
    }

    /// Copies every `&mut` state of `book`, restorable or not (for a verification, which
    /// must leave all of it as it found it).
    pub(crate) fn take_mutable(rt: &Runtime, book: &AddressBook) -> Result<Self, GraphError> {
        Self::take_regions(rt, book, book.mutable().collect())
    }

    fn take_regions(
        rt: &Runtime,
        book: &AddressBook,
        regions: Vec<DeviceRegion>,
    ) -> Result<Self, GraphError> {
        let total: usize = regions.iter().map(|r| r.bytes).sum();
        if total == 0 {
            return Ok(StateSnapshot {
                copy: None,
                regions,
            });
        }
        let stream = rt.stream();
        let copy = stream.alloc_zeros::<u8>(total).map_err(|e| {
            rt.oom_context(
                e.into(),
                || {
                    format!(
                        "snapshotting the `&mut` state of `{}` before its warmup (opt a parameter out with \
                         `#[state(no_restore)]`)",
                        book.graph()
                    )
                },
                Some(total),
            )
        })?;
        let snapshot = StateSnapshot {
            copy: Some(copy),
            regions,
        };
        snapshot.copy_all(rt, true)?;
        Ok(snapshot)
    }

    /// Bytes the snapshot holds.
    pub(crate) fn bytes(&self) -> usize {
        self.copy.as_ref().map_or(0, |c| c.len())
    }

    /// Writes the snapshot back into the state, on the runtime's stream. The caller has
    /// checked that the state still holds the recorded buffers.
    pub(crate) fn restore(&self, rt: &Runtime) -> Result<(), GraphError> {
        self.copy_all(rt, false)
    }

    fn copy_all(&self, rt: &Runtime, into_snapshot: bool) -> Result<(), GraphError> {
        let Some(copy) = &self.copy else {
            return Ok(());
        };
        let stream = rt.stream();
        let (base, _sync) = copy.device_ptr(stream);
        let mut offset = 0u64;
        for r in &self.regions {
            let (dst, src) = if into_snapshot {
                (base + offset, r.ptr)
            } else {
                (r.ptr, base + offset)
            };
            // SAFETY: `r` is a device region of state that the graph holds for its whole
            // capture (borrowed, shared or owned), recorded by `AddressBook::record` and
            // checked unchanged after every body run before a restore; the snapshot buffer
            // holds the sum of the regions' sizes; both copies are ordered on the runtime's
            // stream, where the body's own work runs.
            unsafe { driver::copy_dtod(dst, src, r.bytes, stream.cu_stream()) }?;
            offset += r.bytes as u64;
        }
        Ok(())
    }
}
