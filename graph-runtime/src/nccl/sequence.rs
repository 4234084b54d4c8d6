//! What a collective is, as far as ranks must agree on it, and how the ranks' views of one
//! point of a capture are compared.
//!
//! NCCL matches the collectives of the ranks of a communicator by their order alone: the
//! third call on rank 0 meets the third call on rank 1. If the two are not the same operation
//! on the same number of elements of the same type (and, for a broadcast, the same root),
//! both ranks wait for a partner that never comes, and a graph that recorded them hangs on
//! every replay. So before a graph with collectives is instantiated, every rank's list of
//! [`CollectiveCall`]s is compared with the others' ([`compare`]), on the host.

use std::fmt;
use std::panic::Location;

use cudarc::nccl::sys;

/// A reduction applied element-wise by [`all_reduce`](crate::nccl::Communicator::all_reduce)
/// and [`reduce_scatter`](crate::nccl::Communicator::reduce_scatter).
///
/// See [NCCL's `ncclRedOp_t`](https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/types.html#ncclredop-t).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum over the ranks.
    Sum,
    /// The product over the ranks.
    Prod,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
    /// The mean over the ranks (the sum divided by the number of ranks).
    Avg,
}

impl ReduceOp {
    pub(crate) fn raw(self) -> sys::ncclRedOp_t {
        match self {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Prod => sys::ncclRedOp_t::ncclProd,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        }
    }

    /// The operation's name in messages and on the wire (`sum`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }

    /// The operation [`ReduceOp::name`] names.
    pub(crate) fn from_name(name: &str) -> Option<ReduceOp> {
        [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ]
        .into_iter()
        .find(|op| op.name() == name)
    }
}

/// Which collective, with the arguments every rank must pass alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveOp {
    /// `ncclAllReduce`.
    AllReduce(ReduceOp),
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter(ReduceOp),
    /// `ncclBroadcast` from rank `root`.
    Broadcast {
        /// The rank whose buffer is sent.
        root: usize,
    },
}

impl fmt::Display for CollectiveOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollectiveOp::AllReduce(op) => write!(f, "all_reduce({})", op.name()),
            CollectiveOp::AllGather => f.write_str("all_gather"),
            CollectiveOp::ReduceScatter(op) => write!(f, "reduce_scatter({})", op.name()),
            CollectiveOp::Broadcast { root } => write!(f, "broadcast(root {root})"),
        }
    }
}

/// Where in the program a collective was called: Rust's `#[track_caller]` location, kept as
/// plain data so that it can cross to the ranks of other processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallSite {
    /// The source file.
    pub file: &'static str,
    /// The line, from 1.
    pub line: u32,
    /// The column, from 1.
    pub column: u32,
}

impl From<&'static Location<'static>> for CallSite {
    fn from(l: &'static Location<'static>) -> Self {
        CallSite {
            file: l.file(),
            line: l.line(),
            column: l.column(),
        }
    }
}

impl fmt::Display for CallSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// One collective as one rank issued it: what NCCL matches across ranks, plus where in the
/// program it was called (for messages; not compared).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CollectiveCall {
    /// The operation.
    pub op: CollectiveOp,
    /// The element type, as Rust names it (`f32`).
    pub dtype: &'static str,
    /// NCCL's `count`: elements per rank (what each rank sends for an all-gather, what each
    /// rank receives for a reduce-scatter).
    pub count: usize,
    /// The communicator group (the same number on every rank of a group).
    pub group: u64,
    /// Where the collective was called.
    pub location: CallSite,
}

impl CollectiveCall {
    /// Whether NCCL would match `self` on one rank with `other` on another: same operation,
    /// element type, count and communicator group.
    pub fn matches(&self, other: &CollectiveCall) -> bool {
        self.op == other.op
            && self.dtype == other.dtype
            && self.count == other.count
            && self.group == other.group
    }
}

impl fmt::Display for CollectiveCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} × {} (group {}) at {}",
            self.op, self.count, self.dtype, self.group, self.location
        )
    }
}

/// Where one rank is in a capture session when it meets the others (see
/// [`crate::nccl`]'s "How the ranks stay together").
#[derive(Debug, Clone)]
pub(crate) enum Checkpoint {
    /// Joining the group, on device `ordinal`.
    Joined { ordinal: usize },
    /// About to issue collective `index` (from 0) of warmup run `run` of `graph`.
    Warmup {
        graph: &'static str,
        run: u32,
        index: usize,
        call: CollectiveCall,
    },
    /// Done capturing `graph`, which recorded `calls`.
    Captured {
        graph: &'static str,
        calls: Vec<CollectiveCall>,
    },
    /// Every capture of the session succeeded on this rank.
    Done,
    /// At a host barrier.
    Barrier,
    /// Registering a symmetric window of `bytes`; `allocated` is whether this rank's memory
    /// for it could be allocated.
    Window { bytes: usize, allocated: bool },
    /// Setting up the one-shot all-reduce: whether this rank's memory is `ready`, its context
    /// and device, and the address of its memory (compared for nothing: exchanged).
    PeerMemory {
        ready: bool,
        ctx: u64,
        base: u64,
        ordinal: usize,
    },
}

impl Checkpoint {
    /// Where the rank is, in words, for a message about ranks that are not at the same point.
    fn whereabouts(&self) -> String {
        match self {
            Checkpoint::Joined { ordinal } => format!("is joining the group on device {ordinal}"),
            Checkpoint::Warmup {
                graph,
                run,
                index,
                call,
            } => format!(
                "is about to issue collective #{} of warmup run {run} of `{graph}`: {call}",
                index + 1
            ),
            Checkpoint::Captured { graph, calls } => format!(
                "has finished capturing `{graph}` ({} collective{})",
                calls.len(),
                if calls.len() == 1 { "" } else { "s" }
            ),
            Checkpoint::Done => "has finished every capture of this `capture` call".to_owned(),
            Checkpoint::Barrier => "is at a host barrier".to_owned(),
            Checkpoint::Window { bytes, .. } => {
                format!("is making a symmetric buffer of {bytes} bytes")
            }
            Checkpoint::PeerMemory { .. } => "is setting up the one-shot all-reduce".to_owned(),
        }
    }
}

/// Two ranks that do not agree, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Disagreement {
    /// What the ranks were doing: "in warmup run 1 of `f`, collective #2".
    pub at: String,
    /// The lower rank and what it did.
    pub first: (usize, String),
    /// The other rank and what it did.
    pub second: (usize, String),
}

/// Compares what every rank posted at one point of a session (`posted[r]` from rank `r`):
/// `Ok` when all agree with rank 0, otherwise the first rank that does not, and how.
pub(crate) fn compare(posted: &[Checkpoint]) -> Result<(), Disagreement> {
    let Some((base, rest)) = posted.split_first() else {
        return Ok(());
    };
    for (i, other) in rest.iter().enumerate() {
        if let Some((at, a, b)) = differ(base, other) {
            return Err(Disagreement {
                at,
                first: (0, a),
                second: (i + 1, b),
            });
        }
    }
    Ok(())
}

/// How `a` (rank 0) and `b` differ: where, what `a` did, what `b` did.
fn differ(a: &Checkpoint, b: &Checkpoint) -> Option<(String, String, String)> {
    use Checkpoint as C;
    match (a, b) {
        (C::Joined { .. }, C::Joined { .. })
        | (C::Done, C::Done)
        | (C::Barrier, C::Barrier)
        | (C::PeerMemory { .. }, C::PeerMemory { .. }) => None,
        (C::Window { bytes, .. }, C::Window { bytes: b2, .. }) => (bytes != b2).then(|| {
            (
                "making a symmetric buffer (every rank must ask for the same size)".to_owned(),
                format!("asks for {bytes} bytes"),
                format!("asks for {b2} bytes"),
            )
        }),
        (
            C::Warmup {
                graph,
                run,
                index,
                call,
            },
            C::Warmup {
                graph: g2,
                run: r2,
                index: i2,
                call: c2,
            },
        ) if graph == g2 && run == r2 && index == i2 => (!call.matches(c2)).then(|| {
            (
                format!(
                    "in warmup run {run} of `{graph}`, collective #{}",
                    index + 1
                ),
                format!("issues {call}"),
                format!("issues {c2}"),
            )
        }),
        (
            C::Captured { graph, calls },
            C::Captured {
                graph: g2,
                calls: c2,
            },
        ) if graph == g2 => {
            let i = first_difference(calls, c2)?;
            let what = |calls: &[CollectiveCall]| match calls.get(i) {
                Some(c) => format!("recorded {c}"),
                None => format!(
                    "recorded nothing more (its capture has {} collective{})",
                    calls.len(),
                    if calls.len() == 1 { "" } else { "s" }
                ),
            };
            Some((
                format!("in the capture of `{graph}`, collective #{}", i + 1),
                what(calls),
                what(c2),
            ))
        }
        _ => Some((
            "in the same step of the capture procedure".to_owned(),
            a.whereabouts(),
            b.whereabouts(),
        )),
    }
}

/// The first position at which two ranks' sequences differ (one of them may be shorter),
/// or `None` when they match call for call.
pub(crate) fn first_difference(a: &[CollectiveCall], b: &[CollectiveCall]) -> Option<usize> {
    let common = a.len().min(b.len());
    (0..common)
        .find(|&i| !a[i].matches(&b[i]))
        .or((a.len() != b.len()).then_some(common))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn call(op: CollectiveOp, count: usize) -> CollectiveCall {
        CollectiveCall {
            op,
            dtype: "f32",
            count,
            group: 7,
            location: Location::caller().into(),
        }
    }

    const SUM: CollectiveOp = CollectiveOp::AllReduce(ReduceOp::Sum);

    #[test]
    fn calls_match_on_what_nccl_matches_and_not_on_the_line() {
        let a = call(SUM, 16);
        let b = call(SUM, 16);
        assert_ne!(a.location, b.location);
        assert!(a.matches(&b));
        assert!(!a.matches(&call(SUM, 17)));
        assert!(!a.matches(&call(CollectiveOp::AllReduce(ReduceOp::Max), 16)));
        assert!(!a.matches(&call(CollectiveOp::Broadcast { root: 0 }, 16)));
        assert!(!a.matches(&CollectiveCall { dtype: "f64", ..a }));
        assert!(!a.matches(&CollectiveCall { group: 8, ..a }));
        assert!(a
            .to_string()
            .starts_with("all_reduce(sum) of 16 × f32 (group 7) at "));
    }

    #[test]
    fn first_difference_finds_the_first_differing_or_missing_call() {
        let x = [call(SUM, 4), call(CollectiveOp::AllGather, 4)];
        let y = [call(SUM, 4), call(CollectiveOp::AllGather, 8)];
        assert_eq!(first_difference(&x, &x), None);
        assert_eq!(first_difference(&x, &y), Some(1));
        assert_eq!(first_difference(&x, &x[..1]), Some(1));
        assert_eq!(first_difference(&[], &x), Some(0));
        assert_eq!(first_difference(&[], &[]), None);
    }

    #[test]
    fn a_planted_mismatch_names_the_first_difference_and_both_ranks() {
        let same = |calls: Vec<CollectiveCall>| Checkpoint::Captured {
            graph: "tp_mlp",
            calls,
        };
        let r0 = same(vec![call(SUM, 4096), call(SUM, 4096)]);
        let r1 = same(vec![call(SUM, 4096), call(CollectiveOp::AllGather, 2048)]);
        assert_eq!(compare(&[r0.clone(), r0.clone()]), Ok(()));
        let d = compare(&[r0.clone(), r0.clone(), r1]).unwrap_err();
        assert_eq!(d.at, "in the capture of `tp_mlp`, collective #2");
        assert_eq!(d.first.0, 0);
        assert!(d
            .first
            .1
            .starts_with("recorded all_reduce(sum) of 4096 × f32"));
        assert_eq!(d.second.0, 2);
        assert!(d.second.1.starts_with("recorded all_gather of 2048 × f32"));

        let short = same(vec![call(SUM, 4096)]);
        let d = compare(&[r0, short]).unwrap_err();
        assert_eq!(
            d.second.1,
            "recorded nothing more (its capture has 1 collective)"
        );
    }

    #[test]
    fn warmup_positions_and_kinds_are_compared() {
        let at = |run, index, c| Checkpoint::Warmup {
            graph: "f",
            run,
            index,
            call: c,
        };
        assert_eq!(
            compare(&[at(1, 0, call(SUM, 8)), at(1, 0, call(SUM, 8))]),
            Ok(())
        );
        let d = compare(&[at(1, 2, call(SUM, 8)), at(1, 2, call(SUM, 9))]).unwrap_err();
        assert_eq!(d.at, "in warmup run 1 of `f`, collective #3");
        // One rank issued fewer collectives in run 1 and is already in run 2.
        let d = compare(&[at(1, 1, call(SUM, 8)), at(2, 0, call(SUM, 8))]).unwrap_err();
        assert!(d.first.1.contains("collective #2 of warmup run 1"));
        assert!(d.second.1.contains("collective #1 of warmup run 2"));
        // One rank finished its capture while the other still issues collectives.
        let done = Checkpoint::Captured {
            graph: "f",
            calls: vec![],
        };
        let d = compare(&[at(1, 0, call(SUM, 8)), done]).unwrap_err();
        assert_eq!(d.second.1, "has finished capturing `f` (0 collectives)");
        assert_eq!(compare(&[Checkpoint::Done, Checkpoint::Done]), Ok(()));
        assert!(compare(&[Checkpoint::Done, Checkpoint::Barrier]).is_err());
    }

    #[test]
    fn windows_compare_sizes_and_peer_memory_compares_nothing() {
        let window = |bytes, allocated| Checkpoint::Window { bytes, allocated };
        // Whether a rank could allocate is the caller's to act on, not a disagreement.
        assert_eq!(compare(&[window(64, true), window(64, false)]), Ok(()));
        let d = compare(&[window(64, true), window(128, true)]).unwrap_err();
        assert_eq!(d.first, (0, "asks for 64 bytes".to_owned()));
        assert_eq!(d.second, (1, "asks for 128 bytes".to_owned()));
        let d = compare(&[window(64, true), Checkpoint::Barrier]).unwrap_err();
        assert_eq!(d.first.1, "is making a symmetric buffer of 64 bytes");
        assert_eq!(d.second.1, "is at a host barrier");
        let peer = |base| Checkpoint::PeerMemory {
            ready: true,
            ctx: base + 1,
            base,
            ordinal: base as usize,
        };
        assert_eq!(compare(&[peer(0x1000), peer(0x2000)]), Ok(()));
        assert!(compare(&[peer(0x1000), Checkpoint::Barrier]).is_err());
    }
}
