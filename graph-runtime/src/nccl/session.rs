//! Capture sessions: how the ranks of a group capture graphs with collectives together.
//!
//! [`Communicator::capture`](super::Communicator::capture) opens a session on the calling
//! thread (one per group at a time) and runs the user's `FooGraph::capture(…)` inside it. The
//! collectives the body issues then report to the session ([`warmup_collective`],
//! [`record_captured`]) and the capture procedure calls [`before_instantiate`] between the
//! end of the capture and the instantiation. At each of these points the ranks meet on the
//! host ([`meet_raw`], a [`Rendezvous`] with a timeout) and compare what they did:
//!
//! * before each collective of a warmup run (warmup runs execute it: a rank that skipped it
//!   would leave the others' GPUs waiting forever, so it is checked *before* it is issued);
//! * at the end of each capture, with the whole list of recorded collectives (so a body that
//!   behaves differently while capturing is caught before any rank instantiates);
//! * when the session ends, so that every rank keeps its graphs only if every rank
//!   succeeded.
//!
//! A rank whose capture fails (an error or a panic) posts the failure before returning it,
//! so the others stop at their next meeting with [`CollectiveError::PeerFailed`] instead of
//! waiting; a rank that never arrives makes the others give up after the group's timeout.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::rendezvous::{Rendezvous, WaitError};
use super::sequence::{compare, Checkpoint, CollectiveCall};
use crate::error::CollectiveError;
use crate::error::GraphError;
use crate::phase::{phase, Phase};
use crate::site::{CaptureMode, GraphSite};

/// What a communicator hands to a new session.
#[derive(Debug)]
pub(crate) struct SessionKey {
    /// The group (the same number on every rank).
    pub group: u64,
    /// This rank.
    pub rank: usize,
    /// The session's rendezvous channel (the same on every rank for its n-th session).
    pub channel: u64,
    /// Where the ranks meet.
    pub rendezvous: Arc<Rendezvous<Checkpoint>>,
    /// How long a rank waits for the others at each meeting.
    pub timeout: Duration,
}

struct Session {
    key: SessionKey,
    step: u64,
    /// The graph and warmup run of the last warmup collective, and the index of the next.
    warm: Option<(&'static str, u32, usize)>,
    /// The collectives recorded by the capture in progress, and its graph.
    captured: Vec<CollectiveCall>,
    captured_graph: Option<&'static str>,
    /// While the determinism check records a second time (see [`pause_recording`]).
    paused: bool,
}

/// Runs `f` on the sessions open on this thread, kept in the thread's capture frame
/// (`crate::phase::Frame`), which holds them without naming their type.
fn with_sessions<R>(f: impl FnOnce(&mut Vec<Session>) -> R) -> R {
    crate::phase::with_frame(|frame| {
        let mut slot = frame.nccl_sessions.borrow_mut();
        let sessions = slot
            .get_or_insert_with(|| Box::new(Vec::<Session>::new()))
            .downcast_mut::<Vec<Session>>()
            .expect("only this module keeps collective sessions in the frame");
        f(sessions)
    })
}

/// Whether this thread has a session open for `group`.
pub(crate) fn has(group: u64) -> bool {
    with_sessions(|s| s.iter().any(|x| x.key.group == group))
}

/// Meets the other ranks at the next step of `group`'s session, posting `checkpoint`.
fn meet(group: u64, checkpoint: Checkpoint, at: &str, in_capture: bool) -> Result<(), GraphError> {
    let found = with_sessions(|s| {
        let session = s.iter_mut().find(|x| x.key.group == group)?;
        let step = session.step;
        session.step += 1;
        let k = &session.key;
        Some((k.rendezvous.clone(), k.channel, step, k.rank, k.timeout))
    });
    let (rv, channel, step, rank, timeout) =
        found.expect("callers check that the thread has a session for the group");
    meet_raw(
        &rv, channel, step, rank, timeout, checkpoint, at, in_capture,
    )
    .map(drop)
}

/// Posts `value` as `rank`'s at `step` of `channel`, waits for every rank and compares what
/// they posted. Every way this can fail is a typed error that names `at`; a disagreement is
/// posted as a failure of the channel, so ranks that arrive later stop too.
#[allow(clippy::too_many_arguments)] // one meeting: where, who, what, how long
pub(crate) fn meet_raw(
    rv: &Rendezvous<Checkpoint>,
    channel: u64,
    step: u64,
    rank: usize,
    timeout: Duration,
    value: Checkpoint,
    at: &str,
    in_capture: bool,
) -> Result<Vec<Checkpoint>, GraphError> {
    let posted = rv.exchange(channel, step, rank, value, timeout, |missing| {
        format!(
            "it waited {:.1} s {at} for rank(s) {missing:?}, which never arrived",
            timeout.as_secs_f64()
        )
    });
    match posted {
        Ok(all) => match compare(&all) {
            Ok(()) => Ok(all),
            Err(d) => {
                rv.fail(channel, rank, format!("the ranks disagree {}", d.at));
                Err(CollectiveError::Mismatch {
                    at: d.at,
                    first: d.first,
                    second: d.second,
                    in_capture,
                }
                .into())
            }
        },
        Err(WaitError::Failed(f)) => Err(CollectiveError::PeerFailed {
            rank,
            at: at.to_owned(),
            peer: f.rank,
            reason: f.reason,
        }
        .into()),
        Err(WaitError::Timeout { missing, waited }) => {
            tracing::warn!(rank, at, ?missing, "ranks never arrived");
            Err(CollectiveError::Timeout {
                rank,
                at: at.to_owned(),
                missing,
                waited,
            }
            .into())
        }
    }
}

/// A collective of warmup run `run` of `graph` is about to be issued: meet the other ranks
/// first, so that a rank that would issue something else (or nothing) stops them all here.
pub(crate) fn warmup_collective(
    group: u64,
    graph: &'static str,
    run: u32,
    call: CollectiveCall,
) -> Result<(), GraphError> {
    let index = with_sessions(|s| {
        let session = s
            .iter_mut()
            .find(|x| x.key.group == group)
            .expect("callers check that the thread has a session for the group");
        let index = match session.warm {
            Some((g, r, next)) if g == graph && r == run => next,
            _ => 0,
        };
        session.warm = Some((graph, run, index + 1));
        index
    });
    let at = format!(
        "before collective #{} of warmup run {run} of `{graph}`",
        index + 1
    );
    meet(
        group,
        Checkpoint::Warmup {
            graph,
            run,
            index,
            call,
        },
        &at,
        false,
    )
}

/// Keeps the collectives recorded on this thread out of the lists the ranks compare until
/// the guard drops: the determinism check's second recording of a graph records the same
/// collectives again, and the ranks compare the first recording, the one instantiated.
pub(crate) fn pause_recording() -> impl Drop {
    struct Resume;
    impl Drop for Resume {
        fn drop(&mut self) {
            with_sessions(|s| s.iter_mut().for_each(|x| x.paused = false));
        }
    }
    with_sessions(|s| s.iter_mut().for_each(|x| x.paused = true));
    Resume
}

/// A collective was recorded into the capture of `graph`.
pub(crate) fn record_captured(group: u64, graph: &'static str, call: CollectiveCall) {
    with_sessions(|s| {
        if let Some(session) = s.iter_mut().find(|x| x.key.group == group && !x.paused) {
            if session.captured_graph != Some(graph) {
                session.captured.clear();
                session.captured_graph = Some(graph);
            }
            session.captured.push(call);
        }
    });
}

/// Called by the capture procedure after a capture ended and before it is instantiated:
/// every rank's recorded collectives are compared with the others' (for each session open
/// on this thread). Without an open session this does nothing.
pub(crate) fn before_instantiate(site: &GraphSite) -> Result<(), GraphError> {
    type Open = (
        u64,
        usize,
        u64,
        Arc<Rendezvous<Checkpoint>>,
        Vec<CollectiveCall>,
    );
    let open: Vec<Open> = with_sessions(|s| {
        s.iter_mut()
            .map(|x| {
                let calls = if x.captured_graph == Some(site.name) {
                    std::mem::take(&mut x.captured)
                } else {
                    Vec::new()
                };
                x.captured.clear();
                x.captured_graph = None;
                x.warm = None;
                (
                    x.key.group,
                    x.key.rank,
                    x.key.channel,
                    x.key.rendezvous.clone(),
                    calls,
                )
            })
            .collect()
    });
    for (group, rank, channel, rv, calls) in open {
        if site.mode == CaptureMode::Global {
            let e = CollectiveError::GlobalCaptureMode {
                graph: site.name,
                rank,
            };
            rv.fail(channel, rank, e.to_string());
            return Err(e.into());
        }
        tracing::debug!(
            graph = site.name,
            rank,
            collectives = calls.len(),
            "comparing the captured collectives across ranks"
        );
        let at = format!("at the end of the capture of `{}`", site.name);
        meet(
            group,
            Checkpoint::Captured {
                graph: site.name,
                calls,
            },
            &at,
            true,
        )?;
    }
    Ok(())
}

/// Removes the session of `group` from this thread when dropped (also on panic).
struct Open(u64);

impl Drop for Open {
    fn drop(&mut self) {
        with_sessions(|s| s.retain(|x| x.key.group != self.0));
    }
}

/// Runs `capture` (one or more `FooGraph::capture` calls) in a session of `key`'s group; see
/// the module docs. Returns what `capture` returned only if every rank's session succeeded.
pub(crate) fn run<G>(
    key: SessionKey,
    capture: impl FnOnce() -> Result<G, GraphError>,
) -> Result<G, GraphError> {
    let rank = key.rank;
    match phase() {
        Phase::Capture { graph } | Phase::Warmup { graph, .. } => {
            return Err(CollectiveError::NestedCapture {
                rank,
                context: format!("inside the captured body of `{graph}`"),
            }
            .into())
        }
        Phase::Eager => {}
    }
    if has(key.group) {
        return Err(CollectiveError::NestedCapture {
            rank,
            context: "inside another `comm.capture` of the same group".to_owned(),
        }
        .into());
    }
    let (group, channel, rv) = (key.group, key.channel, key.rendezvous.clone());
    with_sessions(|s| {
        s.push(Session {
            key,
            step: 0,
            warm: None,
            captured: Vec::new(),
            captured_graph: None,
            paused: false,
        })
    });
    let _open = Open(group);
    match panic::catch_unwind(AssertUnwindSafe(capture)) {
        Ok(Ok(graphs)) => {
            meet(
                group,
                Checkpoint::Done,
                "at the end of `comm.capture`",
                true,
            )?;
            Ok(graphs)
        }
        Ok(Err(e)) => {
            rv.fail(channel, rank, e.to_string());
            Err(e)
        }
        Err(payload) => {
            let message = panic_message(payload.as_ref());
            rv.fail(channel, rank, format!("it panicked: {message}"));
            panic::resume_unwind(payload)
        }
    }
}

/// The text of a panic payload (`panic!` with a literal or a format string).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests;
