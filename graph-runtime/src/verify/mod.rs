//! Built-in verification: a replay checked against the eager function on the same inputs.
//!
//! Every generated graph has `verify(inputs…, tolerance)`. It runs the annotated function
//! eagerly on copies of the inputs into shadow outputs, puts back everything that eager run
//! changed (the `&mut` state from device snapshots, the random generators' seeds and
//! offsets), replays the graph on the same inputs, and compares every output and every
//! `&mut` state, element by element. The result is a [`VerifyReport`]: per output, whether
//! it is bitwise equal, the largest absolute and relative error and the first index that
//! differs. Afterwards the graph, its state and the generators are exactly where a plain
//! `replay` would have left them: the check has no side effect of its own.
//!
//! Generators draw the same numbers on both sides: the eager run starts from the generators'
//! state, which is then restored for the replay.
//!
//! `#[cuda_graph(verify = "doubling")]` (replays 1, 2, 4, 8, …: the default in debug
//! builds), `verify = "first"`, `verify = "every"` or `verify_every = N` make replays verify
//! themselves and fail with [`GraphError::VerifyMismatch`], naming the replay, when they
//! disagree; release builds never verify unless asked.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::driver;
use crate::error::GraphError;
use crate::rng::WarmupSnapshot;
use crate::runtime::Runtime;
use crate::snapshot::StateSnapshot;
use crate::state::{AddressBook, DeviceRegion, DeviceState};

pub(crate) use crate::report::compare;
use crate::report::Observed;
pub use crate::report::{Compared, ItemReport, Tolerance, VerifyReport};

impl VerifyReport {
    /// The report when every item passed, or [`GraphError::VerifyMismatch`] naming the
    /// first that did not.
    pub fn into_result(self) -> Result<Self, GraphError> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(GraphError::VerifyMismatch {
                graph: self.graph,
                report: Box::new(self),
            })
        }
    }
}

/// Drives one verification; the generated `verify` calls it in this order:
/// [`Verifier::begin`], the eager call, [`Verifier::eager_output`] per output,
/// [`Verifier::rewind`], the replay, [`Verifier::replay_output`] per output,
/// [`Verifier::finish`].
#[doc(hidden)]
pub struct Verifier<'a> {
    rt: &'a Runtime,
    book: &'a AddressBook,
    tolerance: Tolerance,
    state: StateSnapshot,
    generators: Option<WarmupSnapshot>,
    items: Vec<Observed>,
}

impl std::fmt::Debug for Verifier<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("tolerance", &self.tolerance)
            .field("observed", &self.items.len())
            .finish_non_exhaustive()
    }
}

impl<'a> Verifier<'a> {
    /// Snapshots every `&mut` state of the graph and every generator of the runtime, so the
    /// eager run can be undone before the replay.
    pub fn begin(
        rt: &'a Runtime,
        book: &'a AddressBook,
        tolerance: Tolerance,
    ) -> Result<Self, GraphError> {
        Ok(Verifier {
            rt,
            book,
            tolerance,
            state: StateSnapshot::take_mutable(rt, book)?,
            generators: Some(WarmupSnapshot::take(rt)?),
            items: Vec::new(),
        })
    }

    /// Reads what the eager run wrote to output `name` (a shadow buffer).
    pub fn eager_output<B: DeviceState + ?Sized>(
        &mut self,
        name: &'static str,
        shadow: &B,
    ) -> Result<(), GraphError> {
        self.output(true, name, shadow)
    }

    /// Reads what the eager run left in the `&mut` state, then restores the state and the
    /// generators to where they were before it.
    pub fn rewind(&mut self) -> Result<(), GraphError> {
        for (name, regions) in self.book.mutable_entries() {
            let eager = read_regions(self.rt, &regions)?;
            self.items.push(Observed {
                name,
                kind: Compared::State,
                regions,
                eager,
                replay: Vec::new(),
            });
        }
        self.state.restore(self.rt)?;
        if let Some(g) = self.generators.take() {
            g.restore(self.rt, 1)?;
        }
        Ok(())
    }

    /// [`Verifier::eager_output`] when `eager`, else [`Verifier::replay_output`]: what the
    /// generated code calls for each output, once for the eager run and once for the replay.
    pub fn output<B: DeviceState + ?Sized>(
        &mut self,
        eager: bool,
        name: &'static str,
        value: &B,
    ) -> Result<(), GraphError> {
        let mut regions = Vec::new();
        value.regions(&mut |r| regions.push(r));
        self.output_regions(eager, name, regions)
    }

    /// Reads what the replay wrote to output `name` (the graph's own buffer).
    pub fn replay_output<B: DeviceState + ?Sized>(
        &mut self,
        name: &'static str,
        output: &B,
    ) -> Result<(), GraphError> {
        self.output(false, name, output)
    }

    /// [`Verifier::output`] of the bytes of `regions` (a bucket family's valid rows).
    pub(crate) fn output_regions(
        &mut self,
        eager: bool,
        name: &'static str,
        regions: Vec<DeviceRegion>,
    ) -> Result<(), GraphError> {
        let bytes = read_regions(self.rt, &regions)?;
        if eager {
            self.items.push(Observed {
                name,
                kind: Compared::Output,
                regions,
                eager: bytes,
                replay: Vec::new(),
            });
        } else if let Some(item) = self
            .items
            .iter_mut()
            .find(|i| i.kind == Compared::Output && i.name == name)
        {
            item.replay = bytes;
        }
        Ok(())
    }

    /// Reads the `&mut` state after the replay and compares everything.
    pub fn finish(mut self) -> Result<VerifyReport, GraphError> {
        for (name, regions) in self.book.mutable_entries() {
            let replay = read_regions(self.rt, &regions)?;
            if let Some(item) = self
                .items
                .iter_mut()
                .find(|i| i.kind == Compared::State && i.name == name)
            {
                item.replay = replay;
            }
        }
        let tolerance = self.tolerance;
        let items = self.items.iter().map(|o| compare(o, tolerance)).collect();
        let report = VerifyReport {
            graph: self.book.graph(),
            tolerance,
            items,
            replay: None,
            bucket: None,
        };
        tracing::debug!(
            graph = report.graph,
            ok = report.is_ok(),
            "verified a replay against eager"
        );
        Ok(report)
    }
}

/// Copies regions of device memory to the host, one after the other (waits for the stream).
fn read_regions(rt: &Runtime, regions: &[DeviceRegion]) -> Result<Vec<u8>, GraphError> {
    let mut out = Vec::with_capacity(regions.iter().map(|r| r.bytes).sum());
    let stream = rt.stream();
    for r in regions.iter().filter(|r| !r.host && r.bytes > 0) {
        let start = out.len();
        out.resize(start + r.bytes, 0);
        // SAFETY: `r` is a device region of a buffer the graph holds (an output it owns, a
        // shadow output owned by the caller, or state checked unchanged by the address
        // book), alive for this call; the copy is ordered on the runtime's stream, after the
        // work that wrote it, and synchronised just below before the bytes are read.
        unsafe { driver::copy_dtoh(&mut out[start..], r.ptr, stream.cu_stream()) }?;
    }
    stream.synchronize()?;
    Ok(out)
}

/// When generated replays verify themselves (`verify = …` in the attribute).
#[doc(hidden)]
#[derive(Debug)]
pub struct VerifySchedule {
    /// Verify replay 1, 1 + every, 1 + 2·every, …; 0 is never, `u64::MAX` only the first.
    every: u64,
    replays: AtomicU64,
    tolerance: Tolerance,
}

impl VerifySchedule {
    /// Never verify.
    pub const NEVER: u64 = 0;
    /// Only the first replay.
    pub const FIRST: u64 = u64::MAX;
    /// Replays 1, 2, 4, 8, … (the powers of two): the default of debug builds. A host value
    /// frozen into the graph at capture, or host work a replay skips, shows as soon as it
    /// changes an output, at a cost of one eager run per doubling of the replay count.
    pub const DOUBLING: u64 = u64::MAX - 1;

    /// [`VerifySchedule::DOUBLING`] when `debug` (the generated code passes
    /// `cfg!(debug_assertions)` of the user's crate), else [`VerifySchedule::NEVER`].
    pub const fn default_for(debug: bool) -> u64 {
        if debug {
            Self::DOUBLING
        } else {
            Self::NEVER
        }
    }

    /// A schedule verifying every `every`-th replay from the first (see the constants).
    pub fn new(every: u64, tolerance: Tolerance) -> Self {
        VerifySchedule {
            every,
            replays: AtomicU64::new(0),
            tolerance,
        }
    }

    /// Counts a replay and says whether to verify it: its number (from 1) and the
    /// tolerance.
    #[inline]
    pub fn due(&self) -> Option<(u64, Tolerance)> {
        if self.every == Self::NEVER {
            return None;
        }
        let n = self.replays.fetch_add(1, Ordering::Relaxed);
        let due = match self.every {
            Self::FIRST => n == 0,
            Self::DOUBLING => (n + 1).is_power_of_two(),
            every => n.is_multiple_of(every),
        };
        due.then_some((n + 1, self.tolerance))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::Elem;
    use crate::report::compare;
    use crate::report::tests::observed;

    #[test]
    fn schedules() {
        let never = VerifySchedule::new(VerifySchedule::NEVER, Tolerance::BITWISE);
        assert!((0..5).all(|_| never.due().is_none()));
        let first = VerifySchedule::new(VerifySchedule::FIRST, Tolerance::BITWISE);
        assert_eq!(
            (0..4).map(|_| first.due().is_some()).collect::<Vec<_>>(),
            [true, false, false, false]
        );
        let every = VerifySchedule::new(3, Tolerance::new(1e-6, 0.0));
        assert_eq!(
            (0..7).map(|_| every.due().is_some()).collect::<Vec<_>>(),
            [true, false, false, true, false, false, true]
        );
        let doubling = VerifySchedule::new(VerifySchedule::DOUBLING, Tolerance::BITWISE);
        let verified: Vec<u64> = (0..20)
            .filter_map(|_| doubling.due().map(|(n, _)| n))
            .collect();
        assert_eq!(verified, [1, 2, 4, 8, 16], "replays 1, 2, 4, 8, 16 of 20");
    }

    #[test]
    fn reports_read_as_sentences() {
        let report = VerifyReport {
            graph: "g",
            tolerance: Tolerance::BITWISE,
            items: vec![compare(
                &observed(Elem::F32, &[1.0, 2.0], &[1.0, 3.0]),
                Tolerance::BITWISE,
            )],
            replay: Some(4),
            bucket: None,
        };
        let text = report.to_string();
        assert!(
            text.contains("MISMATCH")
                && text.contains("first difference at 1")
                && text.contains("replay 4"),
            "{text}"
        );
        let in_family = VerifyReport {
            bucket: Some(8),
            ..report.clone()
        };
        let text = in_family.to_string();
        assert!(
            text.starts_with("verify `g` (bucket 8, bitwise, replay 4): MISMATCH"),
            "{text}"
        );
        let err = report.into_result().unwrap_err();
        assert!(matches!(err, GraphError::VerifyMismatch { graph: "g", .. }));
        assert!(err.to_string().contains("output `y`"), "{err}");
    }
}
