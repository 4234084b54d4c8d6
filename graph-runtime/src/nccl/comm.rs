//! [`CommGroup`] (the ranks of one communicator, set up once per process) and
//! [`Communicator`] (one rank's end of it, on one runtime and one thread).

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::nccl::sys;

use super::library::{self, NcclVersion};
use super::one_shot::OneShot;
use super::raw;
use super::rendezvous::{Rendezvous, FIRST_HOST_STEP, FIRST_SESSION, JOIN, ONE_SHOT_RELEASE};
use super::sequence::Checkpoint;
use super::session::{self, SessionKey};
use crate::error::CollectiveError;
use crate::error::GraphError;
use crate::phase::refuse_while_capturing;
use crate::runtime::Runtime;
use crate::state::{lent_shared, DeviceRegion};

/// How long a rank waits for the others at a meeting, unless set with
/// [`CommGroup::set_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The largest `f32` or `bf16` sum (in bytes) the one-shot all-reduce takes, unless set with
/// [`CommGroup::set_one_shot_limit`].
pub const DEFAULT_ONE_SHOT_LIMIT: usize = 256 << 10;

static NEXT_GROUP: AtomicU64 = AtomicU64::new(1);

/// The ranks of one NCCL communicator in this process: one rank per GPU, one thread per rank.
///
/// Made once, outside any capture, before the ranks start: it loads NCCL (a typed error
/// when it cannot, see [`crate::nccl`]'s "Finding libnccl"), makes the communicator's
/// unique id and the host meeting point the ranks use to capture together. Each rank then
/// calls [`CommGroup::join`] from its own thread with its own [`Runtime`] (or
/// [`CommGroup::run`] does all of that), and gets its [`Communicator`].
///
/// A cheap handle: clones share the group.
#[derive(Clone)]
pub struct CommGroup {
    inner: Arc<GroupInner>,
}

struct GroupInner {
    id: u64,
    world: usize,
    unique_id: sys::ncclUniqueId,
    version: NcclVersion,
    timeout_ms: AtomicU64,
    one_shot_limit: AtomicU64,
    rendezvous: Arc<Rendezvous<Checkpoint>>,
    joined: Mutex<Vec<bool>>,
    /// For a group of processes ([`CommGroup::connect`]): the one rank this process holds.
    process_rank: Option<usize>,
}

impl std::fmt::Debug for CommGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommGroup")
            .field("id", &self.inner.id)
            .field("world", &self.inner.world)
            .field("nccl", &self.inner.version.to_string())
            .finish_non_exhaustive()
    }
}

impl CommGroup {
    /// A group of `world` ranks (ranks `0..world`).
    ///
    /// Without a CUDA driver this is [`GraphError::NoDriver`]; without a loadable libnccl,
    /// [`CollectiveError::LibraryMissing`], naming what was searched and the fix.
    pub fn new(world: usize) -> Result<Self, GraphError> {
        refuse_while_capturing(|graph| {
            CollectiveError::SetupInCapture {
                op: "CommGroup::new",
                graph,
            }
            .into()
        })?;
        if world == 0 {
            return Err(CollectiveError::RankOutOfRange { rank: 0, world }.into());
        }
        let version = library::load()?;
        let unique_id = raw::unique_id()
            .map_err(|e| raw::error("ncclGetUniqueId", 0, e, Some(std::ptr::null_mut())))?;
        let id = NEXT_GROUP.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            group = id,
            world,
            nccl = %version,
            nvls = std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default(),
            "NCCL communicator group made"
        );
        Ok(CommGroup::assemble(
            id,
            world,
            unique_id,
            version,
            Arc::new(Rendezvous::new(world)),
            None,
        ))
    }

    /// A group from its parts: its number, size, NCCL's id and version, where its ranks
    /// meet, and (for a group of processes) the rank this process holds.
    pub(super) fn assemble(
        id: u64,
        world: usize,
        unique_id: sys::ncclUniqueId,
        version: NcclVersion,
        rendezvous: Arc<Rendezvous<Checkpoint>>,
        process_rank: Option<usize>,
    ) -> CommGroup {
        CommGroup {
            inner: Arc::new(GroupInner {
                id,
                world,
                unique_id,
                version,
                timeout_ms: AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64),
                one_shot_limit: AtomicU64::new(if process_rank.is_some() {
                    0
                } else {
                    DEFAULT_ONE_SHOT_LIMIT as u64
                }),
                rendezvous,
                joined: Mutex::new(vec![false; world]),
                process_rank,
            }),
        }
    }

    /// For a group whose ranks are processes ([`CommGroup::connect`]), the rank this
    /// process holds; `None` for a group of threads.
    pub fn process_rank(&self) -> Option<usize> {
        self.inner.process_rank
    }

    /// How many ranks the group has.
    pub fn world_size(&self) -> usize {
        self.inner.world
    }

    /// The group's number in this process (the same on every rank; it appears in
    /// collective mismatch messages).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The NCCL library's version.
    pub fn nccl_version(&self) -> NcclVersion {
        self.inner.version
    }

    /// How long a rank waits for the others at a meeting (joining, each step of a
    /// [`Communicator::capture`], a [`Communicator::barrier`]) before it gives up with
    /// [`CollectiveError::Timeout`]. [`DEFAULT_TIMEOUT`] unless set.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.inner.timeout_ms.load(Ordering::Relaxed))
    }

    /// Sets [`CommGroup::timeout`] for every rank (set it before the ranks start).
    pub fn set_timeout(&self, timeout: Duration) {
        let ms = timeout.as_millis().clamp(1, u64::MAX as u128) as u64;
        self.inner.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// The largest all-reduce (in bytes) that communicators joined from now on run with the
    /// one-shot kernel instead of NCCL: sums of `f32` or `bf16` (in place or not; `bf16`
    /// summed in `f32`, rounded once), when every rank is
    /// a thread of this process and every pair of GPUs can access each other's memory.
    /// Larger messages, other types and operations, and groups without peer access use
    /// NCCL. Each rank holds `2 × world` times the limit in device memory for it.
    ///
    /// The kernel writes each rank's input into every rank's memory, waits for every rank
    /// (flags in peer memory) and sums in rank order, so the ranks' results are bitwise equal
    /// and the same whether called eagerly or replayed. On two H200s, inside a graph, a sum
    /// of 4–64 KiB takes 8.7–8.9 µs per operation back to back against NCCL's 10.9–11.6 µs
    /// (a graph of one empty kernel: 4.2 µs), and 6.0–6.2 µs per call from the host against
    /// 9.7–11.3 µs (`examples/24-allreduce-floor.rs`).
    pub fn one_shot_limit(&self) -> usize {
        self.inner.one_shot_limit.load(Ordering::Relaxed) as usize
    }

    /// Sets [`CommGroup::one_shot_limit`] (0 turns the one-shot all-reduce off) for the
    /// communicators joined after the call; set it before [`CommGroup::run`]. A group of
    /// processes keeps 0.
    pub fn set_one_shot_limit(&self, bytes: usize) {
        if self.inner.process_rank.is_none() {
            self.inner
                .one_shot_limit
                .store(bytes as u64, Ordering::Relaxed);
        }
    }

    /// Rank `rank`'s communicator on `rt`'s device. Call it from the thread that will use
    /// the communicator, once per rank, every rank at about the same time: it waits (up to
    /// [`CommGroup::timeout`]) until every rank has joined, checks that no two ranks share a
    /// device, then creates the NCCL communicator (`ncclCommInitRank`, which returns when
    /// every rank has called it).
    pub fn join(&self, rt: &Runtime, rank: usize) -> Result<Communicator, GraphError> {
        refuse_while_capturing(|graph| {
            CollectiveError::SetupInCapture {
                op: "CommGroup::join",
                graph,
            }
            .into()
        })?;
        let g = &self.inner;
        if rank >= g.world {
            return Err(CollectiveError::RankOutOfRange {
                rank,
                world: g.world,
            }
            .into());
        }
        if let Some(own) = g.process_rank.filter(|&own| own != rank) {
            return Err(CollectiveError::Launch {
                detail: format!(
                    "this process is rank {own} of its group; it cannot join rank {rank}, \
                     which another process holds"
                ),
            }
            .into());
        }
        {
            let mut joined = g.joined.lock().unwrap_or_else(|p| p.into_inner());
            if joined[rank] {
                return Err(CollectiveError::AlreadyJoined { rank }.into());
            }
            joined[rank] = true;
        }
        let ordinal = rt.context().ordinal();
        let all = session::meet_raw(
            &g.rendezvous,
            JOIN,
            0,
            rank,
            self.timeout(),
            Checkpoint::Joined { ordinal },
            "while joining the group",
            false,
        )?;
        let ordinals: Vec<usize> = all
            .iter()
            .map(|c| match c {
                Checkpoint::Joined { ordinal } => *ordinal,
                _ => unreachable!("the join step only holds joins"),
            })
            .collect();
        // Ranks in other processes may be on other hosts, where the same ordinal is another
        // GPU: NCCL itself refuses two ranks on one GPU there.
        let duplicates = match g.process_rank {
            None => duplicate(&ordinals),
            Some(_) => None,
        };
        if let Some((first, second)) = duplicates {
            return Err(CollectiveError::DuplicateDevice {
                ordinal: ordinals[first],
                first,
                second,
            }
            .into());
        }
        rt.context().bind_to_thread()?;
        let started = Instant::now();
        // SAFETY: the rank's context was bound to this thread just above, which is the
        // device NCCL gives the communicator.
        let comm = unsafe { raw::comm_init_rank(g.world, g.unique_id, rank) }
            .map_err(|e| raw::error("ncclCommInitRank", rank, e, Some(std::ptr::null_mut())))?;
        tracing::debug!(
            group = g.id,
            rank,
            ordinal,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "NCCL communicator ready"
        );
        let mut communicator = Communicator {
            comm,
            rt: rt.clone(),
            rank,
            group: self.clone(),
            sessions: std::cell::Cell::new(0),
            host_steps: std::cell::Cell::new(0),
            captured: std::cell::Cell::new(false),
            peer_lost: std::cell::Cell::new(false),
            windows: std::cell::RefCell::new(Vec::new()),
            one_shot: None,
        };
        communicator.one_shot = OneShot::set_up(&communicator, self.one_shot_limit())?;
        if communicator.one_shot.is_some() {
            communicator.connect()?;
        }
        Ok(communicator)
    }

    /// Runs `f` once per rank, each on its own thread, with a [`Runtime`] on device
    /// `devices[rank]` and its [`Communicator`]; returns the ranks' results in rank order.
    ///
    /// When ranks fail, the error returned is the first (by rank) that is not a
    /// consequence of another rank's failure ([`CollectiveError::PeerFailed`]); the others
    /// are logged at debug level. A rank that panics is
    /// [`CollectiveError::RankPanicked`].
    ///
    /// Outside [`Communicator::capture`] the ranks are not watched: a rank that returns
    /// early while the others issue eager collectives leaves them waiting on the GPU, as
    /// with any NCCL program.
    ///
    /// Each rank joins a group once, so a group runs once; make a new group for another
    /// run.
    pub fn run<R, F>(&self, devices: &[usize], f: F) -> Result<Vec<R>, GraphError>
    where
        R: Send,
        F: Fn(&Communicator) -> Result<R, GraphError> + Sync,
    {
        if let Some(own) = self.inner.process_rank {
            return Err(CollectiveError::Launch {
                detail: format!(
                    "this group's ranks are processes and this one is rank {own}: call \
                     `group.join(&rt, {own})` (or `Communicator::from_env()`) instead of `run`"
                ),
            }
            .into());
        }
        if devices.len() != self.inner.world {
            return Err(CollectiveError::DeviceCount {
                given: devices.len(),
                world: self.inner.world,
            }
            .into());
        }
        let results: Vec<Result<R, GraphError>> = std::thread::scope(|s| {
            let handles: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, &ordinal)| {
                    let f = &f;
                    std::thread::Builder::new()
                        .name(format!("rank-{rank}"))
                        .spawn_scoped(s, move || self.rank_main(rank, ordinal, f))
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(rank, h)| match h {
                    Ok(h) => h.join().unwrap_or_else(|p| {
                        Err(CollectiveError::RankPanicked {
                            rank,
                            message: session::panic_message(p.as_ref()),
                        }
                        .into())
                    }),
                    Err(e) => Err(GraphError::User(Box::new(e))),
                })
                .collect()
        });
        let mut values = Vec::with_capacity(results.len());
        let (mut root, mut consequence) = (None, None);
        for (rank, r) in results.into_iter().enumerate() {
            let e = match r {
                Ok(v) => {
                    values.push(v);
                    continue;
                }
                Err(e) => e,
            };
            let follows = matches!(e.collective(), Some(CollectiveError::PeerFailed { .. }));
            let slot = if follows { &mut consequence } else { &mut root };
            match slot {
                None => *slot = Some(e),
                Some(_) => tracing::debug!(rank, error = %e, "another rank's error"),
            }
        }
        match root.or(consequence) {
            None => Ok(values),
            Some(e) => Err(e),
        }
    }

    /// One rank of [`CommGroup::run`]: its runtime, its communicator, `f`.
    fn rank_main<R>(
        &self,
        rank: usize,
        ordinal: usize,
        f: &(dyn Fn(&Communicator) -> Result<R, GraphError> + Sync),
    ) -> Result<R, GraphError> {
        let ran = panic::catch_unwind(AssertUnwindSafe(|| {
            let rt = Runtime::new(ordinal).inspect_err(|e| {
                // The others are (or will be) waiting to join: tell them.
                self.inner
                    .rendezvous
                    .fail(JOIN, rank, format!("its runtime failed: {e}"));
            })?;
            let comm = self.join(&rt, rank)?;
            f(&comm)
        }));
        ran.unwrap_or_else(|payload| {
            let message = session::panic_message(payload.as_ref());
            self.inner
                .rendezvous
                .fail(JOIN, rank, format!("it panicked: {message}"));
            Err(CollectiveError::RankPanicked { rank, message }.into())
        })
    }
}

/// The first two indices holding the same value.
fn duplicate(values: &[usize]) -> Option<(usize, usize)> {
    values.iter().enumerate().find_map(|(i, a)| {
        values[i + 1..]
            .iter()
            .position(|b| b == a)
            .map(|j| (i, i + 1 + j))
    })
}

/// One rank's end of a [`CommGroup`]: the NCCL communicator on the rank's [`Runtime`], used
/// from the thread that joined.
///
/// Collectives ([`Communicator::all_reduce`] and the others) run on the runtime's stream,
/// eagerly or, inside a `#[cuda_graph]` body captured with [`Communicator::capture`],
/// recorded into the graph on every rank. Pass the communicator to the body as
/// `#[state] comm: &Communicator`: the graph then borrows it, so the communicator cannot be
/// destroyed while a graph that recorded its collectives can still be replayed.
///
/// Neither `Send` nor `Sync` (it holds NCCL's raw handle): NCCL's communicators may not be
/// used from two threads at once, and keeping one on its rank's thread keeps its eager
/// collectives and its graphs' replays in one order on one stream.
pub struct Communicator {
    comm: sys::ncclComm_t,
    rt: Runtime,
    rank: usize,
    group: CommGroup,
    sessions: std::cell::Cell<u64>,
    /// Host steps made outside captures (barriers, window and one-shot set-up).
    host_steps: std::cell::Cell<u64>,
    captured: std::cell::Cell<bool>,
    /// Whether a meeting found a rank gone (see `note_lost_peer`).
    peer_lost: std::cell::Cell<bool>,
    /// The memory of every symmetric window registered on this communicator (see
    /// [`Communicator::symmetric_buffer`]): NCCL keeps the windows until the communicator is
    /// destroyed, so the memory is freed after that (or later, by a buffer that outlives it).
    pub(super) windows: std::cell::RefCell<Vec<std::rc::Rc<super::window::WindowMemory>>>,
    /// This rank's part of the one-shot all-reduce, when the group has one.
    pub(super) one_shot: Option<OneShot>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("group", &self.group.id())
            .field("rank", &self.rank)
            .field("world", &self.group.world_size())
            .field("ordinal", &self.rt.context().ordinal())
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// This rank (0 to `world_size() - 1`).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the group has.
    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// The runtime the collectives run on (their stream is its stream).
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// The group this communicator belongs to.
    pub fn group(&self) -> &CommGroup {
        &self.group
    }

    /// Runs `capture` (one or more `FooGraph::capture(…)` calls of graphs whose bodies issue
    /// this group's collectives) with every other rank of the group, which must make the same
    /// call at the same point. Returns what `capture` returned only if every rank succeeded.
    ///
    /// While it runs, the ranks meet on the host before each collective of a warmup run, at
    /// the end of each capture (before instantiation) and at the end; each time they compare
    /// what they issued or recorded. A difference is [`CollectiveError::Mismatch`] on every
    /// rank, naming the first differing collective and both ranks' versions; a rank whose
    /// capture fails makes the others stop with [`CollectiveError::PeerFailed`]; a rank that
    /// does not come is [`CollectiveError::Timeout`] after [`CommGroup::timeout`]. None of
    /// these leaves a collective waiting on a GPU.
    pub fn capture<G>(
        &self,
        capture: impl FnOnce() -> Result<G, GraphError>,
    ) -> Result<G, GraphError> {
        let n = self.sessions.get();
        self.sessions.set(n + 1);
        let g = &self.group.inner;
        let result = session::run(
            SessionKey {
                group: g.id,
                rank: self.rank,
                channel: FIRST_SESSION + n,
                rendezvous: g.rendezvous.clone(),
                timeout: self.group.timeout(),
            },
            capture,
        );
        self.note_lost_peer(result.as_ref().err());
        result
    }

    /// Remembers that a rank stopped answering (a timeout, or a rank that failed), so that
    /// dropping this communicator aborts it instead of destroying it: NCCL's destroy may wait
    /// for a peer that is gone (its process ended, say).
    fn note_lost_peer(&self, e: Option<&GraphError>) {
        if let Some(CollectiveError::Timeout { .. } | CollectiveError::PeerFailed { .. }) =
            e.and_then(GraphError::collective)
        {
            self.peer_lost.set(true);
        }
    }

    /// Waits on the host until every rank has reached its matching `barrier` call (up to
    /// [`CommGroup::timeout`]). It does not wait for the GPU.
    pub fn barrier(&self) -> Result<(), GraphError> {
        refuse_while_capturing(|graph| {
            CollectiveError::SetupInCapture {
                op: "Communicator::barrier",
                graph,
            }
            .into()
        })?;
        self.meet_on_host(Checkpoint::Barrier, "at a host barrier")
            .map(drop)
    }

    /// Meets the other ranks at the next host step of this communicator outside captures
    /// (barriers and window registrations share these steps, so a rank at a barrier and a
    /// rank registering a window are told apart), comparing what each posted. A peer that
    /// did not come is remembered for the drop (see `note_lost_peer`), whichever step it was.
    pub(super) fn meet_on_host(
        &self,
        checkpoint: Checkpoint,
        at: &str,
    ) -> Result<Vec<Checkpoint>, GraphError> {
        let step = self.host_steps.get();
        self.host_steps.set(step + 1);
        let met = session::meet_raw(
            &self.group.inner.rendezvous,
            FIRST_HOST_STEP + step,
            0,
            self.rank,
            self.group.timeout(),
            checkpoint,
            at,
            false,
        );
        self.note_lost_peer(met.as_ref().err());
        met
    }

    /// Makes NCCL connect the ranks now, with one all-reduce of one element, as the first
    /// NCCL all-reduce of a warmup run would. NCCL connects lazily, and a rank that records
    /// a collective the others do not (a mismatch the capture comparison reports) would
    /// block inside NCCL connecting if nothing had connected before; with the one-shot
    /// all-reduce taking the small sums, a warmup run may issue no NCCL call at all.
    fn connect(&self) -> Result<(), GraphError> {
        let stream = self.rt.stream();
        let mut one = stream.alloc_zeros::<f32>(1)?;
        let (ptr, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut one, stream);
        let buffers = raw::Buffers {
            send: ptr,
            recv: ptr,
            count: 1,
            dtype: sys::ncclDataType_t::ncclFloat32,
        };
        let op = super::sequence::CollectiveOp::AllReduce(super::sequence::ReduceOp::Sum);
        // SAFETY: the communicator was just made on this runtime's device, whose context is
        // bound; `one` holds one f32 of that device and lives until the stream is synchronized
        // below; every rank makes this call in its join.
        unsafe { raw::issue(op, buffers, self.comm, stream.cu_stream()) }
            .map_err(|e| raw::error("ncclAllReduce", self.rank, e, Some(self.comm)))?;
        stream.synchronize()?;
        Ok(())
    }

    pub(crate) fn raw(&self) -> sys::ncclComm_t {
        self.comm
    }

    pub(crate) fn group_id(&self) -> u64 {
        self.group.inner.id
    }

    /// Notes that a collective of this communicator was recorded into a graph.
    pub(crate) fn mark_captured(&self) {
        self.captured.set(true);
    }

    /// Whether a collective of this communicator was ever recorded into a graph.
    pub(crate) fn has_captured(&self) -> bool {
        self.captured.get()
    }

    /// Waits up to the group's timeout for the work queued on the stream; `false` when it
    /// is still running (or cannot be waited for: the stream is capturing).
    fn stream_drained(&self) -> bool {
        let stream = self.rt.stream();
        let idle = cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let capturing = stream.capture_status() != Ok(idle);
        if capturing {
            return false;
        }
        let Ok(event) = stream.record_event(None) else {
            return false;
        };
        let deadline = Instant::now() + self.group.timeout();
        loop {
            match event.try_is_complete() {
                Ok(true) => return true,
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                _ => return false,
            }
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let _ = self.rt.context().bind_to_thread();
        let drained = self.stream_drained();
        let (call, done) = if drained && !self.peer_lost.get() {
            // SAFETY: `comm` is alive and not used again; the stream has no NCCL work left,
            // and every graph that recorded this communicator's collectives borrowed it, so
            // none is alive now.
            ("ncclCommDestroy", unsafe { raw::comm_destroy(self.comm) })
        } else {
            // SAFETY: as above; abort instead, since queued collectives would never finish
            // (or a peer is gone, whom a destroy might wait for).
            ("ncclCommAbort", unsafe { raw::comm_abort(self.comm) })
        };
        if !drained {
            tracing::warn!(
                rank = self.rank,
                "the communicator was dropped with collectives still queued (another rank \
                 stopped?); aborted it"
            );
        }
        if let Err(e) = done {
            tracing::warn!(rank = self.rank, call, code = ?e.0, "NCCL could not release the communicator");
        }
        // The windows went with the communicator; their memory goes now, unless a symmetric
        // buffer still holds it.
        self.windows.borrow_mut().clear();
        if let Some(one_shot) = self.one_shot.take() {
            let g = &self.group.inner;
            let meet = || {
                g.rendezvous
                    .exchange(
                        ONE_SHOT_RELEASE,
                        0,
                        self.rank,
                        Checkpoint::Done,
                        // A peer inside a one-shot kernel that waits for this rank gives up
                        // after one timeout, then drains and comes: wait for longer than that.
                        2 * self.group.timeout() + Duration::from_secs(5),
                        |_| String::new(),
                    )
                    .is_ok()
            };
            // Every rank of a group of threads comes here when it drops its communicator, also
            // one whose peer failed: meet them (up to the timeout) before freeing.
            one_shot.release(drained, meet);
        }
    }
}

// SAFETY: one handle region, the NCCL communicator's identity; no memory (NCCL's own
// buffers belong to the communicator, which the graph's borrow keeps alive).
lent_shared!(
    /// A communicator is `#[state]` of the graphs that record its collectives: the graph
    /// borrows it (so it outlives them) and reads no device memory of it by address. It is
    /// reported as a handle, so a communicator replaced inside a struct of yours is
    /// `StateMoved` before the next replay.
    Communicator,
    |c, visit| visit(DeviceRegion::handle(c.comm as usize as u64)),
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_devices_are_found() {
        assert_eq!(duplicate(&[0, 1, 2]), None);
        assert_eq!(duplicate(&[0, 1, 0]), Some((0, 2)));
        assert_eq!(duplicate(&[3, 1, 1, 3]), Some((0, 3)));
    }

    #[test]
    fn a_group_without_nccl_or_a_driver_is_a_typed_error() {
        match CommGroup::new(2) {
            Ok(g) => eprintln!(
                "NCCL {} is present here; nothing to check",
                g.nccl_version()
            ),
            Err(GraphError::NoDriver) => {}
            // A link stub of libnccl (scripts/cuda-toolchain.sh) loads and fails every call.
            Err(e) => assert!(
                matches!(
                    e.collective(),
                    Some(CollectiveError::LibraryMissing { .. } | CollectiveError::Nccl { .. })
                ),
                "{e}"
            ),
        }
        let none = CommGroup::new(0).expect_err("a group of no ranks");
        assert!(matches!(
            none.collective(),
            Some(CollectiveError::RankOutOfRange { world: 0, .. })
        ));
    }
}
