//! The capture-session protocol on the CPU: two or three "ranks" as threads, collectives
//! as calls to the session functions under the phases the capture procedure sets. No GPU
//! and no NCCL: what is tested is that every disagreement, failure and absence becomes a
//! typed error on every rank, without a hang.

use std::panic::Location;
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::nccl::sequence::{CollectiveOp, ReduceOp};
use crate::phase::FrameScope;

const GROUP: u64 = 41;
const LONG: Duration = Duration::from_secs(30);

static SITE: GraphSite = GraphSite {
    name: "tp_mlp",
    warmup: 2,
    mode: CaptureMode::ThreadLocal,
    determinism: false,
};

static GLOBAL_SITE: GraphSite = GraphSite {
    name: "tp_mlp",
    warmup: 2,
    mode: CaptureMode::Global,
    determinism: false,
};

#[track_caller]
fn all_reduce(count: usize) -> CollectiveCall {
    CollectiveCall {
        op: CollectiveOp::AllReduce(ReduceOp::Sum),
        dtype: "f32",
        count,
        group: GROUP,
        location: Location::caller().into(),
    }
}

fn key(rank: usize, rv: &Arc<Rendezvous<Checkpoint>>, timeout: Duration) -> SessionKey {
    SessionKey {
        group: GROUP,
        rank,
        channel: 7,
        rendezvous: rv.clone(),
        timeout,
    }
}

/// What one rank's `FooGraph::capture` does, as far as sessions see it: `warmup` runs that
/// issue `warm` collectives each, a capture that records `captured`, the check before
/// instantiation.
fn procedure(
    site: &'static GraphSite,
    warm: &[CollectiveCall],
    captured: &[CollectiveCall],
) -> Result<&'static str, GraphError> {
    for run in 1..=site.warmup {
        let _p = FrameScope::phase(Phase::Warmup {
            graph: site.name,
            run,
        });
        for c in warm {
            warmup_collective(GROUP, site.name, run, *c)?;
        }
    }
    {
        let _p = FrameScope::phase(Phase::Capture { graph: site.name });
        for c in captured {
            record_captured(GROUP, site.name, *c);
        }
    }
    before_instantiate(site)?;
    Ok("graph")
}

/// Runs `per_rank(rank)` on one thread per rank and returns the results in rank order.
fn ranks<T: Send>(
    n: usize,
    per_rank: impl Fn(usize) -> Result<T, GraphError> + Sync,
) -> Vec<Result<T, GraphError>> {
    thread::scope(|s| {
        let per_rank = &per_rank;
        let handles: Vec<_> = (0..n).map(|r| s.spawn(move || per_rank(r))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn collective_error<'a>(r: &'a Result<&'static str, GraphError>) -> &'a CollectiveError {
    r.as_ref()
        .err()
        .and_then(GraphError::collective)
        .unwrap_or_else(|| panic!("expected a collective error, got {r:?}"))
}

#[test]
fn ranks_that_agree_keep_their_graphs() {
    let rv = Arc::new(Rendezvous::new(3));
    let out = ranks(3, |rank| {
        run(key(rank, &rv, LONG), || {
            procedure(
                &SITE,
                &[all_reduce(8), all_reduce(4)],
                &[all_reduce(8), all_reduce(4)],
            )
        })
    });
    assert!(
        out.iter().all(|r| r.as_ref().is_ok_and(|g| *g == "graph")),
        "{out:?}"
    );
    assert!(!has(GROUP), "the session is closed afterwards");
}

#[test]
fn a_planted_capture_mismatch_is_a_typed_error_on_every_rank() {
    let rv = Arc::new(Rendezvous::new(2));
    let started = Instant::now();
    let out = ranks(2, |rank| {
        // Same warmup; rank 1 records another count only while capturing.
        let second = if rank == 1 { 2048 } else { 4096 };
        run(key(rank, &rv, LONG), || {
            procedure(
                &SITE,
                &[all_reduce(4096), all_reduce(4096)],
                &[all_reduce(4096), all_reduce(second)],
            )
        })
    });
    assert!(
        started.elapsed() < LONG / 2,
        "no rank waited for the timeout"
    );
    for r in &out {
        let CollectiveError::Mismatch {
            at,
            first,
            second,
            in_capture,
        } = collective_error(r)
        else {
            panic!("expected a mismatch, got {r:?}");
        };
        assert_eq!(at, "in the capture of `tp_mlp`, collective #2");
        assert!(first
            .1
            .starts_with("recorded all_reduce(sum) of 4096 × f32"));
        assert!(second
            .1
            .starts_with("recorded all_reduce(sum) of 2048 × f32"));
        assert_eq!((first.0, second.0), (0, 1));
        assert!(*in_capture);
        let text = r.as_ref().unwrap_err().to_string();
        assert!(
            text.contains("nothing was instantiated on any rank"),
            "{text}"
        );
    }
}

#[test]
fn a_warmup_mismatch_stops_before_the_collective_is_issued() {
    let rv = Arc::new(Rendezvous::new(2));
    let out = ranks(2, |rank| {
        let warm: Vec<CollectiveCall> = if rank == 0 {
            vec![all_reduce(16), all_reduce(16)]
        } else {
            vec![all_reduce(16)]
        };
        run(key(rank, &rv, LONG), || procedure(&SITE, &warm, &warm))
    });
    for r in &out {
        let CollectiveError::Mismatch {
            first,
            second,
            in_capture,
            ..
        } = collective_error(r)
        else {
            panic!("expected a mismatch, got {r:?}");
        };
        assert!(!*in_capture);
        assert!(
            first.1.contains("collective #2 of warmup run 1"),
            "{first:?}"
        );
        assert!(
            second.1.contains("collective #1 of warmup run 2"),
            "{second:?}"
        );
    }
}

#[test]
fn a_rank_that_fails_its_capture_stops_the_others_at_once() {
    let rv = Arc::new(Rendezvous::new(2));
    let started = Instant::now();
    let out = ranks(2, |rank| {
        run(key(rank, &rv, LONG), || {
            if rank == 1 {
                return Err(GraphError::EmptyGraph { graph: "tp_mlp" });
            }
            procedure(&SITE, &[all_reduce(8)], &[all_reduce(8)])
        })
    });
    assert!(started.elapsed() < LONG / 2);
    assert!(matches!(out[1], Err(GraphError::EmptyGraph { .. })));
    let CollectiveError::PeerFailed {
        rank, peer, reason, ..
    } = collective_error(&out[0])
    else {
        panic!("expected PeerFailed, got {:?}", out[0]);
    };
    assert_eq!((*rank, *peer), (0, 1));
    assert!(reason.contains("recorded no GPU work"), "{reason}");
}

#[test]
fn a_rank_that_never_arrives_is_a_timeout_after_the_configured_time() {
    let rv = Arc::new(Rendezvous::new(2));
    let timeout = Duration::from_millis(200);
    let started = Instant::now();
    let r = run(key(0, &rv, timeout), || {
        procedure(&SITE, &[all_reduce(8)], &[all_reduce(8)])
    });
    let took = started.elapsed();
    assert!(
        took >= timeout && took < Duration::from_secs(10),
        "{took:?}"
    );
    let CollectiveError::Timeout {
        rank, at, missing, ..
    } = collective_error(&r)
    else {
        panic!("expected a timeout, got {r:?}");
    };
    assert_eq!((*rank, missing.as_slice()), (0, &[1][..]));
    assert_eq!(at, "before collective #1 of warmup run 1 of `tp_mlp`");
    // The late rank is told at once instead of waiting in turn.
    let started = Instant::now();
    let late = ranks(1, |_| {
        run(key(1, &rv, LONG), || {
            procedure(&SITE, &[all_reduce(8)], &[all_reduce(8)])
        })
    });
    assert!(started.elapsed() < LONG / 2);
    assert!(matches!(
        collective_error(&late[0]),
        CollectiveError::PeerFailed { peer: 0, .. }
    ));
}

#[test]
fn a_panicking_rank_is_reported_to_the_others() {
    let rv = Arc::new(Rendezvous::new(2));
    let out = thread::scope(|s| {
        let peer = s.spawn(|| {
            run(key(1, &rv, LONG), || -> Result<&'static str, GraphError> {
                panic!("body exploded")
            })
        });
        let mine = run(key(0, &rv, LONG), || {
            procedure(&SITE, &[all_reduce(8)], &[all_reduce(8)])
        });
        (mine, peer.join())
    });
    assert!(
        out.1.is_err(),
        "the panic reaches the panicking rank's caller"
    );
    let CollectiveError::PeerFailed { reason, .. } = collective_error(&out.0) else {
        panic!("expected PeerFailed, got {:?}", out.0);
    };
    assert_eq!(reason, "it panicked: body exploded");
}

#[test]
fn sessions_do_not_nest_and_global_capture_mode_is_refused() {
    let rv = Arc::new(Rendezvous::new(1));
    let nested = run(key(0, &rv, LONG), || run(key(0, &rv, LONG), || Ok("inner")));
    assert!(matches!(
        nested.as_ref().err().and_then(GraphError::collective),
        Some(CollectiveError::NestedCapture { .. })
    ));
    let rv = Arc::new(Rendezvous::new(1));
    let global = run(key(0, &rv, LONG), || procedure(&GLOBAL_SITE, &[], &[]));
    assert!(matches!(
        collective_error(&global),
        CollectiveError::GlobalCaptureMode { .. }
    ));
    let rv = Arc::new(Rendezvous::new(1));
    let inside = {
        let _p = FrameScope::phase(Phase::Capture { graph: "outer" });
        run(key(0, &rv, LONG), || Ok("never"))
    };
    assert!(matches!(
        collective_error(&inside),
        CollectiveError::NestedCapture { .. }
    ));
}

#[test]
fn graphs_without_collectives_are_compared_too() {
    let rv = Arc::new(Rendezvous::new(2));
    let out = ranks(2, |rank| {
        run(key(rank, &rv, LONG), || {
            procedure(&SITE, &[], &[])?;
            // A second graph in the same session, with collectives only on rank 0.
            let extra: Vec<CollectiveCall> = if rank == 0 {
                vec![all_reduce(1)]
            } else {
                vec![]
            };
            procedure(&SITE, &[], &extra)
        })
    });
    for r in &out {
        assert!(matches!(
            collective_error(r),
            CollectiveError::Mismatch {
                in_capture: true,
                ..
            }
        ));
    }
}

#[test]
fn a_second_recording_for_the_determinism_check_is_not_compared() {
    // Debug builds record a graph twice (the determinism check). Rank 1 records one more
    // collective than rank 0 in each recording: the ranks compare the first recording, and
    // the mismatch names its collective #2, not a collective of the second recording.
    let rv = Arc::new(Rendezvous::new(2));
    let out = ranks(2, |rank| {
        run(key(rank, &rv, LONG), || {
            let captured: &[CollectiveCall] = match rank {
                0 => &[all_reduce(8)],
                _ => &[all_reduce(8), all_reduce(16)],
            };
            {
                let _p = FrameScope::phase(Phase::Capture { graph: SITE.name });
                for c in captured {
                    record_captured(GROUP, SITE.name, *c);
                }
                let _second = pause_recording();
                for c in captured {
                    record_captured(GROUP, SITE.name, *c);
                }
            }
            before_instantiate(&SITE)?;
            Ok("graph")
        })
    });
    for r in &out {
        let CollectiveError::Mismatch { at, first, .. } = collective_error(r) else {
            panic!("expected a mismatch, got {r:?}");
        };
        assert_eq!(
            at,
            &format!("in the capture of `{}`, collective #2", SITE.name)
        );
        assert!(first.1.starts_with("recorded nothing more"), "{first:?}");
    }
}
