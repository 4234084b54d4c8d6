//! The host-side meeting point of the ranks of one process: each rank posts a value for a
//! step and gets everyone's values back, or learns that a rank failed, or gives up after a
//! timeout. Nothing here touches the GPU or NCCL: a hang-prone collective cannot be used to
//! find out whether the ranks would hang.
//!
//! Steps are keyed by a *channel* (one per capture session, plus one for joining the group
//! and one per host step outside captures) and a step number within it, so ranks that drift apart meet
//! the wrong step of the right channel and the comparison of what they posted names the
//! difference. A failure is sticky per channel: once a rank has failed (an error, a panic,
//! a timeout), every rank that waits on that channel, or arrives later, is told which rank
//! failed and why, at once.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::store::{poll_interval, StoreClient};

/// A value ranks in other processes can read: what a [`Rendezvous`] over a store posts.
pub(crate) trait Wire: Sized {
    /// The value as bytes.
    fn to_wire(&self) -> Vec<u8>;
    /// The value `bytes` encode, or `None`.
    fn from_wire(bytes: &[u8]) -> Option<Self>;
}

impl Wire for super::sequence::Checkpoint {
    fn to_wire(&self) -> Vec<u8> {
        super::wire::encode(self)
    }

    fn from_wire(bytes: &[u8]) -> Option<Self> {
        super::wire::decode(bytes)
    }
}

/// Where the ranks of a group in several processes meet: a key-value store every process
/// reaches ([`super::store`]), under a prefix of the group's own.
struct StoreMeeting {
    client: StoreClient,
    prefix: String,
}

/// A rank that failed, and why (in words, for the other ranks' errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The rank that failed.
    pub rank: usize,
    /// What happened to it.
    pub reason: String,
}

/// Why an exchange did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WaitError {
    /// A rank failed on this channel (possibly the caller itself, earlier).
    Failed(Failure),
    /// Not every rank arrived within the timeout; `missing` never did.
    Timeout {
        missing: Vec<usize>,
        waited: Duration,
    },
}

/// The channel of communicator set-up.
pub(crate) const JOIN: u64 = 0;
/// The first channel of capture sessions (one channel per `comm.capture` call).
pub(crate) const FIRST_SESSION: u64 = 2;
/// The first channel of host steps outside captures (barriers, window registrations): one
/// channel per step, so that a failure of one (a disagreement, a timeout) stays that step's
/// and the next barrier starts clean. Far above any session channel.
pub(crate) const FIRST_HOST_STEP: u64 = 1 << 62;
/// The channel on which the ranks meet at their communicators' drop before freeing the
/// one-shot all-reduce's memory, which their peers write into. Between the sessions' and the
/// host steps' channels.
pub(crate) const ONE_SHOT_RELEASE: u64 = 1 << 61;

struct Round<T> {
    posted: Vec<Option<T>>,
    collected: usize,
}

impl<T> Round<T> {
    fn complete(&self) -> bool {
        self.posted.iter().all(Option::is_some)
    }
}

struct State<T> {
    rounds: HashMap<(u64, u64), Round<T>>,
    failed: HashMap<u64, Failure>,
}

impl<T> State<T> {
    /// Forgets the rounds of `channel` that some rank never reached (after a failure
    /// there); complete rounds stay until every rank has collected them.
    fn drop_incomplete(&mut self, channel: u64) {
        self.rounds
            .retain(|(c, _), round| *c != channel || round.complete());
    }
}

/// Where the `world` ranks of a group meet; see the module docs. The ranks of one process
/// meet on a mutex; ranks in other processes meet on a store ([`Rendezvous::over_store`]),
/// with the same semantics (sticky failures per channel, a timeout that fails the channel).
pub(crate) struct Rendezvous<T> {
    world: usize,
    state: Mutex<State<T>>,
    arrived: Condvar,
    store: Option<StoreMeeting>,
}

impl<T> std::fmt::Debug for Rendezvous<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous")
            .field("world", &self.world)
            .finish_non_exhaustive()
    }
}

impl<T: Clone + Wire> Rendezvous<T> {
    /// A meeting point for ranks `0..world`, all threads of this process.
    pub(crate) fn new(world: usize) -> Self {
        Rendezvous {
            world,
            state: Mutex::new(State {
                rounds: HashMap::new(),
                failed: HashMap::new(),
            }),
            arrived: Condvar::new(),
            store: None,
        }
    }

    /// A meeting point for ranks `0..world` in several processes, through `client`'s store;
    /// `prefix` keeps this group's keys apart from other groups'.
    pub(crate) fn over_store(world: usize, client: StoreClient, prefix: String) -> Self {
        Rendezvous {
            store: Some(StoreMeeting { client, prefix }),
            ..Self::new(world)
        }
    }

    /// [`Rendezvous::exchange`] through the store: post, then poll for the others' posts
    /// and for a failure of the channel.
    #[allow(clippy::too_many_arguments)] // exchange's arguments and the store
    fn exchange_over_store(
        &self,
        meeting: &StoreMeeting,
        channel: u64,
        step: u64,
        rank: usize,
        value: T,
        timeout: Duration,
        on_timeout: impl FnOnce(&[usize]) -> String,
    ) -> Result<Vec<T>, WaitError> {
        let StoreMeeting { client, prefix } = meeting;
        let unreachable = |e: std::io::Error| {
            WaitError::Failed(Failure {
                rank: 0,
                reason: format!("the ranks' store (served by rank 0) could not be reached: {e}"),
            })
        };
        let fail_key = format!("{prefix}/failed/{channel}");
        let failed = || -> Result<Option<Failure>, WaitError> {
            Ok(client.get(&fail_key).map_err(unreachable)?.map(|b| {
                let text = String::from_utf8_lossy(&b);
                let (r, reason) = text.split_once('\n').unwrap_or(("0", &text));
                Failure {
                    rank: r.parse().unwrap_or(0),
                    reason: reason.to_owned(),
                }
            }))
        };
        if let Some(f) = failed()? {
            return Err(WaitError::Failed(f));
        }
        let key = |r: usize| format!("{prefix}/rv/{channel}/{step}/{r}");
        client
            .set(&key(rank), &value.to_wire())
            .map_err(unreachable)?;
        let mut got: Vec<Option<T>> = vec![None; self.world];
        got[rank] = Some(value);
        let started = Instant::now();
        loop {
            for (r, slot) in got.iter_mut().enumerate() {
                if slot.is_some() {
                    continue;
                }
                if let Some(bytes) = client.get(&key(r)).map_err(unreachable)? {
                    let value = T::from_wire(&bytes).ok_or_else(|| {
                        WaitError::Failed(Failure {
                            rank: r,
                            reason: "it posted what this rank cannot read (another version of \
                                     graph-runtime?)"
                                .to_owned(),
                        })
                    })?;
                    *slot = Some(value);
                }
            }
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().flatten().collect());
            }
            if let Some(f) = failed()? {
                return Err(WaitError::Failed(f));
            }
            let waited = started.elapsed();
            if waited >= timeout {
                let missing: Vec<usize> = (0..self.world).filter(|&r| got[r].is_none()).collect();
                let reason = format!("{rank}\n{}", on_timeout(&missing));
                client
                    .set_if_absent(&fail_key, reason.as_bytes())
                    .map_err(unreachable)?;
                return Err(WaitError::Timeout { missing, waited });
            }
            std::thread::sleep(poll_interval(waited));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding this lock leaves the maps consistent (every update is one
        // insert or remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Posts `value` as rank `rank`'s at `step` of `channel` and waits until every rank has
    /// posted there; returns all values, indexed by rank.
    ///
    /// Returns early with [`WaitError::Failed`] when a rank has failed on `channel` (before
    /// or while this one waits). After `timeout` without every rank, this rank is recorded as
    /// failed on `channel` with the reason `on_timeout(missing ranks)` gives (so the others
    /// stop waiting too) and [`WaitError::Timeout`] is returned.
    pub(crate) fn exchange(
        &self,
        channel: u64,
        step: u64,
        rank: usize,
        value: T,
        timeout: Duration,
        on_timeout: impl FnOnce(&[usize]) -> String,
    ) -> Result<Vec<T>, WaitError> {
        assert!(
            rank < self.world,
            "rank {rank} out of range for {} ranks",
            self.world
        );
        if let Some(meeting) = &self.store {
            return self
                .exchange_over_store(meeting, channel, step, rank, value, timeout, on_timeout);
        }
        let started = Instant::now();
        let key = (channel, step);
        let mut state = self.lock();
        if let Some(f) = state.failed.get(&channel) {
            return Err(WaitError::Failed(f.clone()));
        }
        let world = self.world;
        let round = state.rounds.entry(key).or_insert_with(|| Round {
            posted: vec![None; world],
            collected: 0,
        });
        round.posted[rank] = Some(value);
        if round.complete() {
            self.arrived.notify_all();
        }
        loop {
            // A round every rank reached is delivered even if a rank fails afterwards (the
            // ranks that compare what was posted there must all see the same values).
            if let Some(round) = state.rounds.get_mut(&key) {
                if round.complete() {
                    let all: Vec<T> = round.posted.iter().flatten().cloned().collect();
                    round.collected += 1;
                    if round.collected == world {
                        state.rounds.remove(&key);
                    }
                    return Ok(all);
                }
            }
            if let Some(f) = state.failed.get(&channel) {
                return Err(WaitError::Failed(f.clone()));
            }
            let missing: Vec<usize> = match state.rounds.get(&key) {
                Some(round) => (0..world).filter(|&r| round.posted[r].is_none()).collect(),
                None => unreachable!("an incomplete round is only removed with a failure"),
            };
            let waited = started.elapsed();
            if waited >= timeout {
                let reason = on_timeout(&missing);
                state.failed.insert(channel, Failure { rank, reason });
                state.drop_incomplete(channel);
                self.arrived.notify_all();
                return Err(WaitError::Timeout { missing, waited });
            }
            state = self
                .arrived
                .wait_timeout(state, timeout - waited)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Records that `rank` failed on `channel` (the first failure of a channel is kept) and
    /// wakes every rank waiting there.
    pub(crate) fn fail(&self, channel: u64, rank: usize, reason: String) {
        if let Some(StoreMeeting { client, prefix }) = &self.store {
            let value = format!("{rank}\n{reason}");
            if let Err(e) =
                client.set_if_absent(&format!("{prefix}/failed/{channel}"), value.as_bytes())
            {
                tracing::warn!(rank, error = %e, "could not tell the other ranks of a failure");
            }
            return;
        }
        let mut state = self.lock();
        state
            .failed
            .entry(channel)
            .or_insert(Failure { rank, reason });
        state.drop_incomplete(channel);
        self.arrived.notify_all();
    }

    /// Rounds still waiting for ranks (for tests: completed rounds are removed).
    #[cfg(test)]
    fn open_rounds(&self) -> usize {
        self.lock().rounds.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    const LONG: Duration = Duration::from_secs(30);

    fn never(_: &[usize]) -> String {
        unreachable!("no timeout expected")
    }

    impl Wire for usize {
        fn to_wire(&self) -> Vec<u8> {
            self.to_string().into_bytes()
        }
        fn from_wire(b: &[u8]) -> Option<Self> {
            std::str::from_utf8(b).ok()?.parse().ok()
        }
    }

    impl Wire for u32 {
        fn to_wire(&self) -> Vec<u8> {
            self.to_string().into_bytes()
        }
        fn from_wire(b: &[u8]) -> Option<Self> {
            std::str::from_utf8(b).ok()?.parse().ok()
        }
    }

    impl Wire for () {
        fn to_wire(&self) -> Vec<u8> {
            Vec::new()
        }
        fn from_wire(b: &[u8]) -> Option<Self> {
            b.is_empty().then_some(())
        }
    }

    /// `world` meeting points of one group over one store, one per "process" (each with its
    /// own connection, as separate processes would have).
    fn over_store<T: Clone + Wire>(
        world: usize,
    ) -> (super::super::store::StoreServer, Vec<Rendezvous<T>>) {
        let server = super::super::store::StoreServer::start("127.0.0.1:0").unwrap();
        let rvs = (0..world)
            .map(|_| {
                let c = StoreClient::connect(server.addr(), LONG).unwrap();
                Rendezvous::over_store(world, c, "g1".to_owned())
            })
            .collect();
        (server, rvs)
    }

    #[test]
    fn ranks_in_other_processes_get_every_value() {
        let (_server, rvs) = over_store::<usize>(3);
        let results: Vec<Vec<Vec<usize>>> = thread::scope(|s| {
            let handles: Vec<_> = rvs
                .iter()
                .enumerate()
                .map(|(rank, rv)| {
                    s.spawn(move || {
                        (0..20u64)
                            .map(|step| {
                                rv.exchange(5, step, rank, rank * 100 + step as usize, LONG, never)
                                    .unwrap()
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for per_rank in results {
            for (step, all) in per_rank.into_iter().enumerate() {
                assert_eq!(all, vec![step, 100 + step, 200 + step]);
            }
        }
    }

    #[test]
    fn over_a_store_a_missing_rank_times_out_and_a_failure_is_sticky() {
        let (_server, rvs) = over_store::<()>(2);
        let started = Instant::now();
        let e = rvs[0]
            .exchange(9, 0, 0, (), Duration::from_millis(100), |missing| {
                format!("missing {missing:?}")
            })
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(
            matches!(e, WaitError::Timeout { ref missing, .. } if missing == &[1]),
            "{e:?}"
        );
        // The late rank learns at once why the others left.
        let late = rvs[1].exchange(9, 0, 1, (), LONG, never).unwrap_err();
        assert_eq!(
            late,
            WaitError::Failed(Failure {
                rank: 0,
                reason: "missing [1]".to_owned()
            })
        );
        // Another channel is not affected; an explicit failure stops a waiting rank.
        thread::scope(|s| {
            let waiting = s.spawn(|| rvs[0].exchange(10, 0, 0, (), LONG, never));
            thread::sleep(Duration::from_millis(20));
            rvs[1].fail(10, 1, "boom".to_owned());
            let e = waiting.join().unwrap().unwrap_err();
            assert_eq!(
                e,
                WaitError::Failed(Failure {
                    rank: 1,
                    reason: "boom".to_owned()
                })
            );
        });
        // A rank alone on a channel with no time to wait gives up at once.
        let alone = rvs[0].exchange(11, 0, 0, (), Duration::ZERO, |_| String::new());
        assert!(matches!(alone, Err(WaitError::Timeout { .. })), "{alone:?}");
    }

    #[test]
    fn over_a_store_an_unreadable_post_is_a_failure_of_its_rank() {
        let (server, rvs) = over_store::<u32>(2);
        let raw = StoreClient::connect(server.addr(), LONG).unwrap();
        raw.set("g1/rv/3/0/1", b"not a number").unwrap();
        let e = rvs[0].exchange(3, 0, 0, 7, LONG, never).unwrap_err();
        assert!(
            matches!(e, WaitError::Failed(Failure { rank: 1, .. })),
            "{e:?}"
        );
    }

    #[test]
    fn every_rank_gets_every_value_and_rounds_are_cleaned_up() {
        let rv = Arc::new(Rendezvous::new(3));
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let rv = rv.clone();
                thread::spawn(move || {
                    (0..20)
                        .map(|step| {
                            rv.exchange(5, step, rank, rank * 100 + step as usize, LONG, never)
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        for h in handles {
            let rounds = h.join().unwrap().unwrap();
            for (step, all) in rounds.into_iter().enumerate() {
                assert_eq!(all, vec![step, 100 + step, 200 + step]);
            }
        }
        assert_eq!(rv.open_rounds(), 0);
    }

    #[test]
    fn a_rank_that_never_arrives_is_a_timeout_not_a_hang() {
        let rv = Rendezvous::new(2);
        let started = Instant::now();
        let err = rv
            .exchange(9, 0, 0, (), Duration::from_millis(100), |missing| {
                format!("waited for {missing:?}")
            })
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_secs(10));
        let WaitError::Timeout { missing, waited } = err else {
            panic!("expected a timeout, got {err:?}");
        };
        assert_eq!(missing, vec![1]);
        assert!(waited >= Duration::from_millis(100));
        // The late rank learns at once that rank 0 gave up, instead of waiting in turn.
        let late = rv.exchange(9, 0, 1, (), LONG, never).unwrap_err();
        assert_eq!(
            late,
            WaitError::Failed(Failure {
                rank: 0,
                reason: "waited for [1]".into()
            })
        );
        // Other channels are not affected.
        assert_eq!(rv.open_rounds(), 0);
        let t = {
            let rv = Arc::new(rv);
            let other = rv.clone();
            let h = thread::spawn(move || other.exchange(10, 0, 1, (), LONG, never));
            let mine = rv.exchange(10, 0, 0, (), LONG, never);
            (mine, h.join().unwrap())
        };
        assert!(t.0.is_ok() && t.1.is_ok());
    }

    #[test]
    fn a_failure_wakes_the_waiting_ranks_at_once() {
        let rv = Arc::new(Rendezvous::<u32>::new(2));
        let waiter = {
            let rv = rv.clone();
            thread::spawn(move || {
                let started = Instant::now();
                (rv.exchange(4, 3, 0, 1, LONG, never), started.elapsed())
            })
        };
        thread::sleep(Duration::from_millis(50));
        rv.fail(4, 1, "capture failed".into());
        rv.fail(4, 0, "a later failure is not the cause".into());
        let (result, took) = waiter.join().unwrap();
        assert_eq!(
            result,
            Err(WaitError::Failed(Failure {
                rank: 1,
                reason: "capture failed".into()
            }))
        );
        assert!(took < LONG / 2);
        assert_eq!(rv.open_rounds(), 0);
    }
}
