//! Collectives composed with the other features of a body, on two or more GPUs (feature
//! `nccl`): the `nccl × …` pairs of issue 31's composition table.
//!
//! * A fork: compute on the side branch while the main stream sums and gathers inside the
//!   fork's closure (the overlap `graph_runtime::nccl` recommends).
//! * Bucket families whose body sums (one-shot kernel) and takes the maximum (NCCL) over the
//!   ranks: every bucket captured up front inside `comm.capture`; and a `lazy` family, whose
//!   bucket captured by a replay outside `comm.capture` is `CollectiveError::OutsideCapture`
//!   on every rank (nothing issued, the family serves on), and captured by the same replay
//!   inside it, buckets evicted and captured again as batches come.
//! * An eager island between two segments with collectives (the island agrees on a host
//!   value with an eager all-reduce), read-only `#[state]` weights, `verify = "every"` and the
//!   `verify` method.
//! * The one-shot all-reduce inside `graph_while`, `graph_while_unrolled` and `graph_if`, with
//!   `check_determinism = true`; NCCL's all-gather inside `graph_if` (supported or refused
//!   alike on every rank, the runtime usable afterwards).
//! * The runtime's generator (the same seed on every rank) beside an early-launched layer, a
//!   nested `#[cuda_graph]` call (a cuBLAS product, then the sum) and a kernel launched early
//!   right after the sum.
//! * A second thread that captures and replays a graph of its own on a rank's runtime while
//!   the rank replays its collectives.
//! * The determinism check failing on one rank (its error there, `PeerFailed` on the others),
//!   and a verify mismatch on one rank (that rank's error alone; every rank's replay ran).
//!
//! Each result is compared with the same function called eagerly (bitwise; on a twin
//! generator where it draws) and with the exact sum, maximum or gather computed on the host,
//! over at least four replays with new inputs on every rank. Inputs are small integers where
//! the order of a sum could matter; otherwise the host sums in rank order, as the one-shot
//! kernel does (NCCL's sum of two ranks is the same `a + b`).
//!
//! The tests are written for any number of GPUs from two (`group.world_size()` ranks, rank r
//! on GPU r; the harness gives them two). None can hang when a rank fails: each rank returns
//! what it saw and the assertions run after `CommGroup::run` has joined every rank (as
//! `tests/multi_gpu.rs` does); the ranks meet on the host (`comm.barrier()`) before each step
//! that launches collectives, so a rank that stopped makes the others stop there with a typed
//! error after the group's timeout (30 s here) instead of launching collectives it never
//! joins; and the one-shot all-reduce gives up after the same timeout.
//!
//! Without a CUDA driver they count as ignored (failed with `CUDA_GRAPH_REQUIRE_GPU=1`); with
//! one GPU as ignored, saying they need two; with no loadable libnccl as ignored (see
//! `scripts/with-nccl.sh`).

use std::cell::Cell;
use std::fmt::Display;
use std::process::ExitCode;
use std::sync::mpsc::{channel, Sender};
use std::time::Duration;

use graph_runtime::cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::nccl::{CollectiveError, CommGroup, Communicator, ReduceOp};
use graph_runtime::{
    cuda_graph, Compare, Condition, ForkedStream, Generator, GraphError, Runtime, SideMut, SideRef,
    Tolerance,
};
use rand::rngs::SmallRng;
use rand::Rng;
use workloads::check::first_mismatch;
use workloads::kernels::ELEMENTWISE;
use workloads::ops::blas::{matmul, MatMul};
use workloads::ops::linear::linear_bias_gelu;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

/// Elements of most buffers: 4 KiB of `f32`, a sum the one-shot kernel takes.
const N: usize = 1024;
/// Replays (with new inputs) per graph.
const REPLAYS: usize = 5;
/// How long a rank waits for the others before it gives up with a typed error.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The test's kernels, on the conditional device API (for `scale_count_guarded`).
const SRC: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
// y += h.
extern "C" __global__ void add_into(float *y, const float *h, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += h[i];
}

// z = k[0] y.
extern "C" __global__ void scale_by_first(const float *y, const float *k, float *z, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = k[0] * y[i];
}

// y = a y.
extern "C" __global__ void scale_inplace(float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * y[i];
}

// y = a x + b.
extern "C" __global__ void affine(const float *x, float *y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

// y = c t, iters[0] += 1; nothing in a step of an unrolled loop after the one that stopped it.
extern "C" __global__ void scale_count_guarded(const float *t, float *y, int n, float c,
                                               unsigned int *iters, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = c * t[i];
    if (i == 0) iters[0] += 1u;
}
"#
);

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

// --- kernels the bodies launch -------------------------------------------------------------

/// `y += h`.
fn add_into(rt: &Runtime, y: &mut CudaSlice<f32>, h: &CudaSlice<f32>) -> Result<(), GraphError> {
    assert_eq!(y.len(), h.len(), "add_into: lengths");
    let f = rt.function(SRC, "add_into")?;
    let n = y.len() as i32;
    // SAFETY: reads and writes `n` floats of `y`, reads `n` of `h` (the same length).
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *y)
            .arg(h)
            .arg(&n)
            .launch(grid(n as usize))
    }?;
    Ok(())
}

/// `y = a ∘ b` with ELEMENTWISE's kernel `name` (`mul`, `add`: element by element).
fn elementwise(
    rt: &Runtime,
    name: &str,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    assert!(a.len() == y.len() && b.len() == y.len(), "{name}: lengths");
    let f = rt.function(ELEMENTWISE, name)?;
    let n = y.len() as i32;
    // SAFETY: `mul` and `add` read `n` floats of `a` and `b` and write `n` of `y` (all of
    // length `n`).
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(a)
            .arg(b)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(n as usize))
    }?;
    Ok(())
}

/// `z = k[0] · y`.
fn scale_by_first(
    rt: &Runtime,
    y: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    assert!(
        y.len() == z.len() && !k.is_empty(),
        "scale_by_first: lengths"
    );
    let f = rt.function(SRC, "scale_by_first")?;
    let n = z.len() as i32;
    // SAFETY: reads `n` floats of `y` and one of `k`, writes `n` of `z`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(y)
            .arg(k)
            .arg(&mut *z)
            .arg(&n)
            .launch(grid(n as usize))
    }?;
    Ok(())
}

/// `y = a · y`.
fn scale_inplace(rt: &Runtime, y: &mut CudaSlice<f32>, a: f32) -> Result<(), GraphError> {
    let f = rt.function(SRC, "scale_inplace")?;
    let n = y.len() as i32;
    // SAFETY: reads and writes the `n` floats of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *y)
            .arg(&a)
            .arg(&n)
            .launch(grid(n as usize))
    }?;
    Ok(())
}

/// `y = a · x + b`.
fn affine(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    a: f32,
    b: f32,
) -> Result<(), GraphError> {
    assert_eq!(x.len(), y.len(), "affine: lengths");
    let f = rt.function(SRC, "affine")?;
    let n = y.len() as i32;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut *y)
            .arg(&a)
            .arg(&b)
            .arg(&n)
            .launch(grid(n as usize))
    }?;
    Ok(())
}

/// `y += 1`, launched early: ELEMENTWISE's `add_one_inplace_early` waits for the kernel
/// before it (`griddepcontrol.wait`) before it touches memory.
fn add_one_early(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let f = rt.function(ELEMENTWISE, "add_one_inplace_early")?;
    let n = y.len() as i32;
    // SAFETY: reads and writes the `n` floats of `y`, only after `griddepcontrol.wait`
    // (nothing before it), as the early-launch contract asks.
    unsafe {
        rt.launch_early(&f)
            .buf_mut(y)
            .arg(n)
            .launch(grid(n as usize))
    }?;
    Ok(())
}

/// `y = x + a` on a fork's side stream, on buffers borrowed until the join.
fn add_scalar_side<'f>(
    side: &ForkedStream<'f, '_>,
    rt: &Runtime,
    x: SideRef<'f, f32>,
    y: SideMut<'f, f32>,
    a: f32,
) -> Result<(), GraphError> {
    assert_eq!(x.len(), y.len(), "add_scalar_side: lengths");
    let n = x.len() as i32;
    let f = rt.function(ELEMENTWISE, "add_scalar")?;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`; both hold `n`.
    unsafe {
        side.launch_builder(&f)
            .buf(x)
            .buf_mut(y)
            .arg(a)
            .arg(n)
            .launch(grid(n as usize))?;
    }
    Ok(())
}

// --- host side: inputs, exact results, comparisons -----------------------------------------

/// The ranks' devices: rank r on GPU r.
fn devices(group: &CommGroup) -> Vec<usize> {
    (0..group.world_size()).collect()
}

/// `n` random integers in `[-16, 16)`, as `f32`: sums, maxima and small products of them are
/// exact in any order.
fn ints(rng: &mut SmallRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-16i32..16) as f32)
        .collect()
}

/// Every rank's inputs for `steps` steps: `plan[step][rank]`, `n` random integers each.
fn int_plan(rng: &mut SmallRng, steps: usize, world: usize, n: usize) -> Vec<Vec<Vec<f32>>> {
    (0..steps)
        .map(|_| (0..world).map(|_| ints(rng, n)).collect())
        .collect()
}

/// The sum over the ranks' values, in rank order: what the one-shot all-reduce computes
/// (NCCL's sum of two ranks too; exact in any order for integers).
fn rank_sum(per_rank: &[Vec<f32>]) -> Vec<f32> {
    let mut sum = per_rank[0].clone();
    for v in &per_rank[1..] {
        for (s, x) in sum.iter_mut().zip(v) {
            *s += x;
        }
    }
    sum
}

/// The maximum over the ranks' values.
fn rank_max(per_rank: &[Vec<f32>]) -> Vec<f32> {
    let mut max = per_rank[0].clone();
    for v in &per_rank[1..] {
        for (m, x) in max.iter_mut().zip(v) {
            *m = m.max(*x);
        }
    }
    max
}

/// `world` copies of `v` summed in rank order (every rank holding the same value).
fn summed_copies(v: &[f32], world: usize) -> Vec<f32> {
    rank_sum(&vec![v.to_vec(); world])
}

/// Asserts that `got` equals `want` bit for bit, naming `what` and the first difference.
fn same(what: impl Display, got: &[f32], want: &[f32]) {
    if let Some(m) = first_mismatch(got, want) {
        panic!(
            "{what}: differs first at index {} ({} vs {}); {} vs {} elements",
            m.index,
            m.a,
            m.b,
            got.len(),
            want.len()
        );
    }
}

/// Meets the other ranks on the host before a step that launches collectives: a rank that
/// stopped makes the others stop here, with a typed error after the group's timeout, instead
/// of leaving them waiting on the GPU for collectives it never issues.
fn together(comm: &Communicator) -> Result<(), GraphError> {
    comm.barrier()
}

/// The group the harness gave, with the tests' timeout.
fn with_timeout(group: &CommGroup) -> &CommGroup {
    group.set_timeout(TIMEOUT);
    group
}

/// A new group of `world` ranks with the tests' timeout (a group runs once).
fn new_group(world: usize) -> Result<CommGroup, GraphError> {
    let group = CommGroup::new(world)?;
    group.set_timeout(TIMEOUT);
    Ok(group)
}

/// A thread's failure as a `GraphError`.
fn panicked(what: &str) -> GraphError {
    GraphError::User(format!("{what} panicked").into())
}

// --- G3: a collective overlapped with a fork -----------------------------------------------

/// `h = x + 1` on a fork's side stream while the main stream sums `x` over the ranks (the
/// one-shot kernel) and gathers it (NCCL), inside the fork's closure; after the join,
/// `y += h`.
#[cuda_graph(warmup = 2)]
fn overlapped(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    h: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    gathered: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|side| {
        add_scalar_side(side, rt, side.read(x), side.write(h), 1.0)?;
        comm.all_reduce(x, &mut *y, ReduceOp::Sum)?;
        comm.all_gather(x, &mut *gathered)
    })?;
    add_into(rt, y, h)
}

/// Pairs: fork × nccl.
/// The overlap the nccl module documents (compute on a fork's side branch, the collectives on
/// the main stream inside the closure), captured on every rank and replayed with new inputs:
/// the side branch, the sum plus the side branch after the join, and the gather equal the
/// eager call bitwise and the exact host values.
#[gpu_test(gpus = 2)]
fn a_collective_overlapped_with_a_fork_replays_like_eager(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_collective_overlapped_with_a_fork_replays_like_eager");
    let world = group.world_size();
    let plan = int_plan(&mut rng, REPLAYS + 1, world, N);
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let x0 = s.clone_htod(&plan[0][rank])?;
        let mut graph =
            comm.capture(|| OverlappedGraph::capture(rt, &x0, comm, N, N, world * N))?;
        let (mut h, mut y, mut g) = (
            s.alloc_zeros::<f32>(N)?,
            s.alloc_zeros::<f32>(N)?,
            s.alloc_zeros::<f32>(world * N)?,
        );
        let mut seen = Vec::new();
        for step in &plan[1..] {
            together(comm)?;
            let out = graph.replay(&step[rank])?;
            let replayed = [
                s.clone_dtoh(out.h)?,
                s.clone_dtoh(out.y)?,
                s.clone_dtoh(out.gathered)?,
            ];
            let x = s.clone_htod(&step[rank])?;
            overlapped(rt, &x, comm, &mut h, &mut y, &mut g)?;
            let eager = [s.clone_dtoh(&h)?, s.clone_dtoh(&y)?, s.clone_dtoh(&g)?];
            seen.push((replayed, eager));
        }
        Ok(seen)
    })?;
    for (rank, steps) in seen.iter().enumerate() {
        for (k, ((replayed, eager), inputs)) in steps.iter().zip(&plan[1..]).enumerate() {
            let h: Vec<f32> = inputs[rank].iter().map(|v| v + 1.0).collect();
            let y: Vec<f32> = rank_sum(inputs)
                .iter()
                .zip(&h)
                .map(|(s, h)| s + h)
                .collect();
            let want = [h, y, inputs.concat()];
            let names = ["h (side branch)", "y (sum, then + h)", "gathered"];
            for (i, name) in names.iter().enumerate() {
                let at = format!("rank {rank}, replay {k}: {name}");
                same(
                    format_args!("{at}, replay vs eager"),
                    &replayed[i],
                    &eager[i],
                );
                same(format_args!("{at}, replay vs host"), &replayed[i], &want[i]);
            }
        }
    }
    Ok(())
}

// --- G8: bucket families with collectives ---------------------------------------------------

/// Elements per row of the families' inputs and outputs.
const ROW: usize = 256;
/// The families' buckets.
const BUCKETS: [usize; 3] = [1, 2, 4];

/// `sum = Σ x` (the one-shot kernel) and `max = max x` (NCCL) over the ranks.
fn sum_and_max(
    comm: &Communicator,
    x: &CudaSlice<f32>,
    sum: &mut CudaSlice<f32>,
    max: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, sum, ReduceOp::Sum)?;
    comm.all_reduce(x, max, ReduceOp::Max)
}

/// Rows summed and maximised over the ranks, one graph per bucket, all captured up front.
#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4]))]
fn rows_summed(
    _rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    sum: &mut CudaSlice<f32>,
    max: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    sum_and_max(comm, x, sum, max)
}

/// The same, each bucket captured by the first replay that needs it, at most two live.
#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4], lazy = 2))]
fn rows_summed_lazy(
    _rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    sum: &mut CudaSlice<f32>,
    max: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    sum_and_max(comm, x, sum, max)
}

/// The smallest bucket that holds `batch` rows.
fn bucket_of(batch: usize) -> usize {
    *BUCKETS
        .iter()
        .find(|&&b| b >= batch)
        .expect("a batch within the buckets")
}

/// The rows of a replay of a family: the valid rows of `sum` and `max`.
type Rows = [Vec<f32>; 2];

/// A family's function (`rows_summed`, `rows_summed_lazy`), to be called eagerly.
type RowsFn = fn(
    &Runtime,
    &CudaSlice<f32>,
    &Communicator,
    &mut CudaSlice<f32>,
    &mut CudaSlice<f32>,
    usize,
) -> Result<(), GraphError>;

/// The family's function `f` called eagerly on `x`'s rows padded with zeros to their bucket
/// (what the bucket's graph computes), its first `batch` rows read back.
fn rows_eagerly(f: RowsFn, comm: &Communicator, x: &[f32]) -> Result<Rows, GraphError> {
    let s = comm.runtime().stream();
    let batch = x.len() / ROW;
    let bucket = bucket_of(batch);
    let mut padded = x.to_vec();
    padded.resize(bucket * ROW, 0.0);
    let x = s.clone_htod(&padded)?;
    let (mut sum, mut max) = (
        s.alloc_zeros::<f32>(bucket * ROW)?,
        s.alloc_zeros::<f32>(bucket * ROW)?,
    );
    f(comm.runtime(), &x, comm, &mut sum, &mut max, bucket)?;
    let valid = 0..batch * ROW;
    Ok([
        s.clone_dtoh(&sum.slice(valid.clone()))?,
        s.clone_dtoh(&max.slice(valid))?,
    ])
}

/// Asserts one rank's replays of a family against the eager calls and the host: step `k` ran
/// `batches[k]` rows of `plan[k]`.
fn check_rows(rank: usize, seen: &[(Rows, Rows)], plan: &[Vec<Vec<f32>>], batches: &[usize]) {
    assert_eq!(seen.len(), batches.len(), "rank {rank}: steps");
    for (k, ((replayed, eager), (inputs, &batch))) in
        seen.iter().zip(plan.iter().zip(batches)).enumerate()
    {
        let rows: Vec<Vec<f32>> = inputs.iter().map(|x| x[..batch * ROW].to_vec()).collect();
        let want = [rank_sum(&rows), rank_max(&rows)];
        for (i, name) in ["sum", "max"].iter().enumerate() {
            let at = format!("rank {rank}, step {k} (batch {batch}): {name}");
            same(
                format_args!("{at}, replay vs eager"),
                &replayed[i],
                &eager[i],
            );
            same(format_args!("{at}, replay vs host"), &replayed[i], &want[i]);
        }
    }
}

/// Batches the families serve, in order.
const BATCHES: [usize; 8] = [3, 1, 4, 2, 3, 1, 2, 4];

/// Pairs: family-eager × nccl.
/// A bucket family whose body sums (one-shot kernel) and takes the maximum (NCCL) over the
/// ranks, every bucket captured up front inside `comm.capture`; batches of 1 to 4 rows with
/// new inputs equal the eager call on the padded rows bitwise and the exact host values.
#[gpu_test(gpus = 2)]
fn a_bucket_family_with_collectives_serves_every_batch_like_eager(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_bucket_family_with_collectives_serves_every_batch_like_eager");
    let world = group.world_size();
    let plan = int_plan(&mut rng, BATCHES.len(), world, 4 * ROW);
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let mut family = comm.capture(|| RowsSummedBuckets::capture(rt, ROW, comm, ROW, ROW))?;
        let live = family.buckets().graphs().count();
        let mut seen = Vec::new();
        for (step, &batch) in plan.iter().zip(&BATCHES) {
            let x = &step[rank][..batch * ROW];
            together(comm)?;
            let out = family.replay(x)?;
            let replayed = [s.clone_dtoh(&out.sum)?, s.clone_dtoh(&out.max)?];
            seen.push((replayed, rows_eagerly(rows_summed, comm, x)?));
        }
        let stats = family.buckets().stats();
        Ok((live, stats.captures(), stats.replays(), seen))
    })?;
    for (rank, (live, captures, replays, steps)) in seen.iter().enumerate() {
        assert_eq!(
            *live,
            BUCKETS.len(),
            "rank {rank}: buckets live after capture"
        );
        assert_eq!(*captures, BUCKETS.len() as u64, "rank {rank}: captures");
        assert_eq!(*replays, BATCHES.len() as u64, "rank {rank}: replays");
        check_rows(rank, steps, &plan, &BATCHES);
    }
    Ok(())
}

/// For each batch of `batches`, whether a lazy family of `BUCKETS` keeping at most `max_live`
/// graphs (least recently used dropped first) must capture its bucket.
fn lazy_misses(batches: &[usize], max_live: usize) -> Vec<bool> {
    let mut live: Vec<(usize, u64)> = Vec::new();
    let mut clock = 0;
    batches
        .iter()
        .map(|&batch| {
            let bucket = bucket_of(batch);
            let miss = !live.iter().any(|(b, _)| *b == bucket);
            if miss {
                if live.len() >= max_live {
                    let lru = (0..live.len())
                        .min_by_key(|&i| live[i].1)
                        .expect("a live bucket");
                    live.swap_remove(lru);
                }
                clock += 1; // the capture counts as a use
                live.push((bucket, clock));
            }
            clock += 1;
            let used = live.iter_mut().find(|(b, _)| *b == bucket);
            used.expect("live after its capture").1 = clock;
            miss
        })
        .collect()
}

/// One replay of the lazy family, read back.
fn lazy_rows(
    rt: &Runtime,
    family: &mut RowsSummedLazyBuckets<'_>,
    x: &[f32],
) -> Result<Rows, GraphError> {
    let out = family.replay(x)?;
    Ok([
        rt.stream().clone_dtoh(&out.sum)?,
        rt.stream().clone_dtoh(&out.max)?,
    ])
}

/// Pairs: family-lazy × nccl.
/// A lazy family (at most two graphs live) whose body sums and takes the maximum over the
/// ranks. A replay that needs a bucket not yet captured, outside `comm.capture`, is
/// `CollectiveError::OutsideCapture` on every rank, raised in the bucket's first warmup run
/// before any collective is issued (no rank waits), and leaves the family empty; the same
/// replay inside `comm.capture` captures the bucket on every rank. Then 8 batches, with
/// buckets evicted and captured again (inside `comm.capture` where the LRU says so), equal the
/// eager call and the exact host values.
#[gpu_test(gpus = 2)]
fn a_lazy_bucket_with_collectives_is_captured_only_inside_comm_capture(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_lazy_bucket_with_collectives_is_captured_only_inside_comm_capture");
    let world = group.world_size();
    let plan = int_plan(&mut rng, BATCHES.len(), world, 4 * ROW);
    let misses = lazy_misses(&BATCHES, 2);
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let rank = comm.rank();
        // A lazy family captures nothing here: no collective, no `comm.capture` needed.
        let mut family = RowsSummedLazyBuckets::capture(rt, ROW, comm, ROW, ROW)?;
        let first = &plan[0][rank][..BATCHES[0] * ROW];
        together(comm)?;
        let refused = family.replay(first).map(drop).err();
        let stats = family.buckets().stats();
        let after_refusal = (stats.captures(), family.buckets().graphs().count());
        let mut seen = Vec::new();
        let mut captured_by = Vec::new();
        for (step, &batch) in plan.iter().zip(&BATCHES) {
            let x = &step[rank][..batch * ROW];
            together(comm)?;
            let miss = family.buckets().graph_of(bucket_of(batch)).is_none();
            let replayed = if miss {
                comm.capture(|| lazy_rows(rt, &mut family, x))?
            } else {
                lazy_rows(rt, &mut family, x)?
            };
            captured_by.push(miss);
            seen.push((replayed, rows_eagerly(rows_summed_lazy, comm, x)?));
        }
        let stats = family.buckets().stats();
        let evictions: u64 = stats.buckets.iter().map(|b| b.evictions).sum();
        Ok((
            refused,
            after_refusal,
            captured_by,
            (stats.captures(), evictions),
            seen,
        ))
    })?;
    let captures = misses.iter().filter(|&&m| m).count() as u64;
    for (rank, (refused, after_refusal, captured_by, counts, steps)) in seen.iter().enumerate() {
        let e = refused
            .as_ref()
            .unwrap_or_else(|| panic!("rank {rank}: a lazy capture outside comm.capture ran"));
        assert!(
            matches!(e, GraphError::Bucket { bucket: 4, .. }),
            "rank {rank}: not the error of bucket 4: {e:?}"
        );
        assert!(
            matches!(
                e.collective(),
                Some(CollectiveError::OutsideCapture {
                    phase: "warming up",
                    graph: "rows_summed_lazy",
                    ..
                })
            ),
            "rank {rank}: expected OutsideCapture in the warmup, got {e:?}"
        );
        assert!(e.to_string().contains("comm.capture"), "rank {rank}: {e}");
        assert_eq!(
            *after_refusal,
            (0, 0),
            "rank {rank}: (captures, live graphs) after the refusal"
        );
        assert_eq!(captured_by, &misses, "rank {rank}: which replays captured");
        assert_eq!(
            *counts,
            (captures, captures - 2),
            "rank {rank}: (captures, evictions)"
        );
        check_rows(rank, steps, &plan, &BATCHES);
    }
    Ok(())
}

// --- G17: an eager island, read-only state and verify ---------------------------------------

/// Segment 1: `y = w ⊙ x` (read-only `#[state]` weights), summed over the ranks. The island:
/// each rank counts its positive inputs on the host and the ranks agree on the total with an
/// eager all-reduce into `k`. Segment 2: `z = k[0] · y`, and `x` gathered (NCCL). Every
/// replay verifies itself against an eager run.
#[allow(clippy::too_many_arguments)] // one output per stage
#[cuda_graph(warmup = 2, verify = "every")]
fn island_between_collectives(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    k: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
    gathered: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    elementwise(rt, "mul", w, x, y)?;
    comm.all_reduce_in_place(y, ReduceOp::Sum)?;
    rt.eager(|| {
        let mine = rt.stream().clone_dtoh(x)?;
        let positive = mine.iter().filter(|v| **v > 0.0).count() as f32;
        rt.stream().memcpy_htod(&[positive], &mut k)?;
        comm.all_reduce_in_place(&mut k, ReduceOp::Sum)
    })?;
    scale_by_first(rt, y, k, z)?;
    comm.all_gather(x, gathered)
}

/// Pairs: island × nccl, devstate-ro × nccl, nccl × verify, island × verify, devstate-ro × verify.
/// Collectives in both segments around an eager island that itself all-reduces a host value,
/// with read-only `#[state]` weights and `verify = "every"`: each of 5 replays with new inputs
/// (each verified against an eager run on every rank) equals the eager call and the exact host
/// values, and the `verify` method reports a bitwise match on every rank afterwards.
#[gpu_test(gpus = 2)]
fn an_island_between_collectives_verifies_every_replay_on_every_rank(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("an_island_between_collectives_verifies_every_replay_on_every_rank");
    let world = group.world_size();
    let plan = int_plan(&mut rng, REPLAYS + 1, world, N);
    let weights: Vec<Vec<f32>> = (0..world)
        .map(|_| (0..N).map(|_| rng.random_range(-4i32..4) as f32).collect())
        .collect();
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let w = s.clone_htod(&weights[rank])?;
        let x0 = s.clone_htod(&plan[0][rank])?;
        let mut graph = comm.capture(|| {
            IslandBetweenCollectivesGraph::capture(rt, &x0, comm, &w, N, 1, N, world * N)
        })?;
        let islands = graph.islands().len();
        let (mut y, mut k, mut z, mut g) = (
            s.alloc_zeros::<f32>(N)?,
            s.alloc_zeros::<f32>(1)?,
            s.alloc_zeros::<f32>(N)?,
            s.alloc_zeros::<f32>(world * N)?,
        );
        let mut seen = Vec::new();
        for step in &plan[1..] {
            together(comm)?;
            let out = graph.replay(&step[rank])?;
            let replayed = [
                s.clone_dtoh(out.y)?,
                s.clone_dtoh(out.k)?,
                s.clone_dtoh(out.z)?,
                s.clone_dtoh(out.gathered)?,
            ];
            let x = s.clone_htod(&step[rank])?;
            island_between_collectives(rt, &x, comm, &w, &mut y, &mut k, &mut z, &mut g)?;
            let eager = [
                s.clone_dtoh(&y)?,
                s.clone_dtoh(&k)?,
                s.clone_dtoh(&z)?,
                s.clone_dtoh(&g)?,
            ];
            seen.push((replayed, eager));
        }
        together(comm)?;
        let report = graph.verify(&plan[REPLAYS][rank], Tolerance::BITWISE)?;
        Ok((islands, report.is_ok(), report.to_string(), seen))
    })?;
    for (rank, (islands, verified, report, steps)) in seen.iter().enumerate() {
        assert_eq!(*islands, 1, "rank {rank}: islands");
        assert!(verified, "rank {rank}: the verify method: {report}");
        for (i, ((replayed, eager), inputs)) in steps.iter().zip(&plan[1..]).enumerate() {
            let products: Vec<Vec<f32>> = inputs
                .iter()
                .zip(&weights)
                .map(|(x, w)| x.iter().zip(w).map(|(x, w)| x * w).collect())
                .collect();
            let y = rank_sum(&products);
            let positive = |x: &Vec<f32>| x.iter().filter(|v| **v > 0.0).count() as f32;
            let k = rank_sum(&inputs.iter().map(|x| vec![positive(x)]).collect::<Vec<_>>());
            let z: Vec<f32> = y.iter().map(|v| k[0] * v).collect();
            let want = [y, k, z, inputs.concat()];
            let names = [
                "y (segment 1)",
                "k (the island)",
                "z (segment 2)",
                "gathered",
            ];
            for (j, name) in names.iter().enumerate() {
                let at = format!("rank {rank}, replay {i}: {name}");
                same(
                    format_args!("{at}, replay vs eager"),
                    &replayed[j],
                    &eager[j],
                );
                same(format_args!("{at}, replay vs host"), &replayed[j], &want[j]);
            }
        }
    }
    Ok(())
}

// --- G17: conditionals and the determinism check -------------------------------------------

/// `scale_count_guarded(t, y, iters, c, go)`: `y = c · t`, `iters += 1`, nothing in a step of an
/// unrolled loop after the one that stopped it. `f` is the kernel, looked up once outside the
/// loop (so the determinism check sees the same lookups in the warmup and the capture).
fn scale_count_guarded(
    rt: &Runtime,
    f: &CudaFunction,
    t: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
    c: f32,
    go: &Condition,
) -> Result<(), GraphError> {
    assert!(t.len() == y.len() && !iters.is_empty(), "lengths");
    let n = y.len() as i32;
    let arg = go.kernel_arg(rt);
    // SAFETY: reads `n` floats of `t`, writes `n` of `y` and one word of `iters`; `arg` is the
    // condition's argument for this step.
    unsafe {
        rt.stream()
            .launch_builder(f)
            .arg(t)
            .arg(&mut *y)
            .arg(&n)
            .arg(&c)
            .arg(&mut *iters)
            .arg(&arg)
            .launch(grid(n as usize))
    }?;
    Ok(())
}

/// `y = Σ x` over the ranks; then, while `y[0] > 1` (the same on every rank), each step
/// sums `y` over the ranks into `t` (the one-shot kernel inside the loop's body) and sets
/// `y = t / (2 · world)`, counting the steps (`unroll` steps per iteration of the loop node);
/// then, when at least 3 steps ran, `y` is summed over the ranks once more inside a
/// `graph_if`. Every capture is recorded twice and compared (`check_determinism`).
#[cuda_graph(warmup = 2, check_determinism = true)]
fn sum_then_halve_while_large(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
    #[constant] unroll: u32,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let c = 0.5 / comm.world_size() as f32;
    let step = rt.function(SRC, "scale_count_guarded")?;
    let mut t = s.alloc_zeros::<f32>(x.len())?;
    let go = rt.condition(false)?;
    let again = rt.condition(false)?;
    comm.all_reduce(x, &mut *y, ReduceOp::Sum)?;
    s.memset_zeros(&mut *iters)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while_unrolled(&go, Some(64), unroll, |rt| {
        comm.all_reduce(&*y, &mut t, ReduceOp::Sum)?;
        scale_count_guarded(rt, &step, &t, y, iters, c, &go)?;
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })?;
    again.set_from(rt, &*iters, Compare::Ge, 3u32)?;
    rt.graph_if(&again, |_rt| {
        comm.all_reduce_in_place(&mut *y, ReduceOp::Sum)
    })
}

/// What `sum_then_halve_while_large` computes, on the host, in the device's order.
fn halve_on_host(inputs: &[Vec<f32>]) -> (Vec<f32>, u32) {
    let world = inputs.len();
    let c = 0.5 / world as f32;
    let mut y = rank_sum(inputs);
    let mut iters = 0u32;
    while y[0] > 1.0 && iters < 64 {
        y = summed_copies(&y, world).iter().map(|t| c * t).collect();
        iters += 1;
    }
    if iters >= 3 {
        y = summed_copies(&y, world);
    }
    (y, iters)
}

/// Pairs: while × nccl, unrolled × nccl, if × nccl, nccl × debugchecks.
/// The one-shot all-reduce inside a `graph_while` body, the same loop unrolled 3 steps per
/// iteration (the steps after the stop still run the collective on every rank, and change
/// nothing the loop reads), and inside a `graph_if` on the steps' count, each graph captured
/// with `check_determinism = true` on every rank: 5 replays with new inputs (no step, then
/// several, then random counts) equal the eager call and the host loop bitwise, plain and
/// unrolled alike, with the branch taken and not taken. (These sums take the one-shot kernel,
/// one kernel node, which needs peer access between the GPUs, as NVLink gives; NCCL's own
/// collectives in a conditional are the next test.)
#[gpu_test(gpus = 2)]
fn collectives_inside_loops_and_branches_replay_like_eager(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("collectives_inside_loops_and_branches_replay_like_eager");
    let world = group.world_size();
    let mut plan = int_plan(&mut rng, REPLAYS + 1, world, N);
    // y[0] = Σ x[0]: below 1 (no step), 40 (6 steps), then random up to ~8000 (13 steps).
    for (k, step) in plan.iter_mut().enumerate() {
        for x in step.iter_mut() {
            x[0] = match k {
                1 => 0.25,
                2 => 40.0,
                _ => rng.random_range(-4.0f32..9.0).exp(),
            } / world as f32;
        }
    }
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let x0 = s.clone_htod(&plan[0][rank])?;
        let (mut plain, mut unrolled) = comm.capture(|| {
            Ok((
                SumThenHalveWhileLargeGraph::capture(rt, &x0, comm, N, 1, 1)?,
                SumThenHalveWhileLargeGraph::capture(rt, &x0, comm, N, 1, 3)?,
            ))
        })?;
        let infos = [plain.info(), unrolled.info()]
            .map(|i| (i.kinds.conditionals, i.checks_time > Duration::ZERO));
        let (mut y, mut iters) = (s.alloc_zeros::<f32>(N)?, s.alloc_zeros::<u32>(1)?);
        let mut seen = Vec::new();
        for step in &plan[1..] {
            together(comm)?;
            let out = plain.replay(&step[rank])?;
            let by_plain = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.iters)?[0]);
            let out = unrolled.replay(&step[rank])?;
            let by_unrolled = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.iters)?[0]);
            let x = s.clone_htod(&step[rank])?;
            sum_then_halve_while_large(rt, &x, comm, &mut y, &mut iters, 3)?;
            let eager = (s.clone_dtoh(&y)?, s.clone_dtoh(&iters)?[0]);
            seen.push([by_plain, by_unrolled, eager]);
        }
        Ok((infos, seen))
    })?;
    let mut branches = [false; 2];
    for (rank, (infos, steps)) in seen.iter().enumerate() {
        for (which, (conditionals, checked)) in ["plain", "unrolled"].iter().zip(infos) {
            assert_eq!(*conditionals, 2, "rank {rank}, {which}: conditional nodes");
            assert!(checked, "rank {rank}, {which}: the determinism check ran");
        }
        for (k, (runs, inputs)) in steps.iter().zip(&plan[1..]).enumerate() {
            let (y, iters) = halve_on_host(inputs);
            branches[usize::from(iters >= 3)] = true;
            for ((got, got_iters), name) in runs.iter().zip(["plain", "unrolled", "eager"]) {
                let at = format!("rank {rank}, replay {k}: {name}");
                assert_eq!(*got_iters, iters, "{at}: steps");
                same(format_args!("{at}: y vs host"), got, &y);
            }
        }
    }
    assert_eq!(branches, [true; 2], "the graph_if was taken and not taken");
    Ok(())
}

/// `x` gathered over the ranks by NCCL inside a `graph_if` (whose condition holds).
#[cuda_graph(warmup = 1)]
fn gather_inside_if(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    gathered: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_if(&go, |_rt| comm.all_gather(x, &mut *gathered))
}

/// `y = Σ x` over the ranks (the one-shot kernel).
#[cuda_graph(warmup = 1)]
fn summed(
    _rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, y, ReduceOp::Sum)
}

/// `sum = Σ x` (the one-shot kernel) and `gathered = [x of every rank]` (NCCL).
#[cuda_graph(warmup = 1)]
fn sum_and_gather(
    _rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    sum: &mut CudaSlice<f32>,
    gathered: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, sum, ReduceOp::Sum)?;
    comm.all_gather(x, gathered)
}

/// What a rank saw of `gather_inside_if`: its capture's error, or its replays and eager calls.
#[derive(Debug)]
enum Outcome {
    Refused(GraphError),
    Supported(Vec<[Vec<f32>; 2]>),
}

/// Pairs: if × nccl.
/// NCCL's own all-gather (not the one-shot kernel) inside a `graph_if`: NCCL records more
/// than kernels when it is captured (with its graph-mixing support, on by default, event
/// record and wait nodes), which CUDA does not allow in a conditional body. Whatever NCCL
/// records, every rank gets the same outcome and none waits: a typed refusal naming the
/// `graph_if` (`ForbiddenInConditional`, or `ConditionalBody` if NCCL's recording itself
/// fails) on every rank, or a graph on every rank whose replays equal the eager call and the
/// exact gather. Afterwards the runtime captures and replays the one-shot sum on the same
/// communicator, and NCCL's gather on a second one, exactly.
#[gpu_test(gpus = 2)]
fn an_nccl_collective_inside_graph_if_is_refused_or_replays_alike_on_every_rank(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng =
        fresh_rng("an_nccl_collective_inside_graph_if_is_refused_or_replays_alike_on_every_rank");
    let world = group.world_size();
    let plan = int_plan(&mut rng, REPLAYS + 1, world, N);
    // For the gather after the refusal: a communicator NCCL's refused recording never touched.
    let second = new_group(world)?;
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let x0 = s.clone_htod(&plan[0][rank])?;
        let outcome = match comm.capture(|| GatherInsideIfGraph::capture(rt, &x0, comm, world * N))
        {
            Err(e) => Outcome::Refused(e),
            Ok(mut graph) => {
                let mut g = s.alloc_zeros::<f32>(world * N)?;
                let mut seen = Vec::new();
                for step in &plan[1..] {
                    together(comm)?;
                    let replayed = s.clone_dtoh(graph.replay(&step[rank])?.gathered)?;
                    gather_inside_if(rt, &s.clone_htod(&step[rank])?, comm, &mut g)?;
                    seen.push([replayed, s.clone_dtoh(&g)?]);
                }
                Outcome::Supported(seen)
            }
        };
        // The runtime goes on: the one-shot sum on this communicator, a gather on another.
        let comm2 = second.join(rt, rank)?;
        let mut sum = comm.capture(|| SummedGraph::capture(rt, &x0, comm, N))?;
        let mut both =
            comm2.capture(|| SumAndGatherGraph::capture(rt, &x0, &comm2, N, world * N))?;
        let mut after = Vec::new();
        for step in &plan[1..] {
            together(comm)?;
            let by_sum = s.clone_dtoh(sum.replay(&step[rank])?.y)?;
            let out = both.replay(&step[rank])?;
            after.push([by_sum, s.clone_dtoh(out.sum)?, s.clone_dtoh(out.gathered)?]);
        }
        Ok((outcome, after))
    })?;
    let refused = seen
        .iter()
        .filter(|(o, _)| matches!(o, Outcome::Refused(_)))
        .count();
    assert!(
        refused == 0 || refused == world,
        "the ranks disagree: {refused} of {world} refused: {:?}",
        seen.iter().map(|(o, _)| o).collect::<Vec<_>>()
    );
    for (rank, (outcome, after)) in seen.iter().enumerate() {
        match outcome {
            Outcome::Refused(e) => {
                eprintln!("rank {rank}: NCCL's all-gather in a graph_if is refused: {e}");
                assert!(
                    matches!(
                        e,
                        GraphError::ForbiddenInConditional {
                            construct: "graph_if",
                            graph: "gather_inside_if",
                            ..
                        } | GraphError::ConditionalBody {
                            construct: "graph_if",
                            graph: "gather_inside_if",
                            ..
                        }
                    ),
                    "rank {rank}: not a typed refusal of the graph_if: {e:?}"
                );
            }
            Outcome::Supported(steps) => {
                eprintln!("rank {rank}: NCCL's all-gather in a graph_if replays");
                for (k, (pair, inputs)) in steps.iter().zip(&plan[1..]).enumerate() {
                    let at = format!("rank {rank}, replay {k}: gathered");
                    same(format_args!("{at}, replay vs eager"), &pair[0], &pair[1]);
                    same(
                        format_args!("{at}, replay vs host"),
                        &pair[0],
                        &inputs.concat(),
                    );
                }
            }
        }
        for (k, (got, inputs)) in after.iter().zip(&plan[1..]).enumerate() {
            let at = format!("rank {rank}, replay {k} afterwards");
            same(
                format_args!("{at}: one-shot sum"),
                &got[0],
                &rank_sum(inputs),
            );
            same(
                format_args!("{at}: sum, second communicator"),
                &got[1],
                &rank_sum(inputs),
            );
            same(
                format_args!("{at}: gather, second communicator"),
                &got[2],
                &inputs.concat(),
            );
        }
    }
    Ok(())
}

// --- G17: the runtime's generator, early launch, a nested graph function, cuBLAS ------------

/// Rows of the tensor-parallel block.
const ROWS: usize = 8;
/// Its input width.
const IN: usize = 64;
/// Its hidden width (the column-parallel layer's outputs).
const HID: usize = 128;
/// Its output width (the row-parallel layer's).
const OUT: usize = 256;

/// A row-parallel layer: this rank's partial product `p = h · w2` (cuBLAS), summed over the
/// ranks into `y` (the one-shot kernel).
#[cuda_graph(warmup = 1)]
fn row_parallel(
    rt: &Runtime,
    h: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    #[state] w2: &CudaSlice<f32>,
    p: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    matmul(rt, h, w2, &mut *p, MatMul::nn(ROWS, OUT, HID))?;
    comm.all_reduce(&*p, y, ReduceOp::Sum)
}

/// A tensor-parallel block: `h = gelu(x · w1ᵀ + b1)` launched early (a column-parallel layer),
/// uniform noise from `g` added to it, the row-parallel layer (a nested `#[cuda_graph]` call:
/// cuBLAS, then the sum over the ranks), and `y += 1` launched early, right after the sum.
#[allow(clippy::too_many_arguments)] // the block's weights, and one output per stage
#[cuda_graph(warmup = 2)]
fn tp_block(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    #[state] g: &Generator,
    #[state] w1: &CudaSlice<f32>,
    #[state] b1: &CudaSlice<f32>,
    #[state] w2: &CudaSlice<f32>,
    h: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    p: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    linear_bias_gelu(rt, true, x, w1, b1, &mut *h, ROWS, HID, IN)?;
    g.uniform(rt, &mut *noise, -1.0, 1.0)?;
    let mut hn = rt.stream().alloc_zeros::<f32>(ROWS * HID)?;
    elementwise(rt, "add", h, noise, &mut hn)?;
    row_parallel(rt, &hn, comm, w2, p, &mut *y)?;
    add_one_early(rt, y)
}

/// What one rank saw at one step of the tensor-parallel block: the replay's `h`, `noise`, `p`
/// and `y`, the eager call's, and the seed and offset of the graph's generator and of the
/// eager call's twin afterwards.
#[derive(Debug)]
struct BlockStep {
    replayed: [Vec<f32>; 4],
    eager: [Vec<f32>; 4],
    generator: (u64, u64),
    twin: (u64, u64),
}

/// Pairs: rng × nccl, early × nccl, nccl × cublas, nccl × nested, rng × early, rng × cublas, rng × nested, early × cublas, early × nested, cublas × nested.
/// A tensor-parallel block in one graph per rank: an early-launched layer, noise drawn from the
/// runtime's generator (seeded alike on every rank), a nested `#[cuda_graph]` call holding a
/// cuBLAS product and the sum over the ranks, and a kernel launched early right after the sum.
/// Over 5 replays with new inputs every output equals the eager call on a twin generator
/// bitwise, the generator's seed and offset equal the twin's and are the same on every rank,
/// the noise is the same on every rank and new on every replay, `y` is the ranks' partial
/// products summed in rank order plus one, and the graph keeps its two early-launch edges.
#[gpu_test(gpus = 2)]
fn a_tensor_parallel_block_with_noise_early_launches_and_cublas_replays_like_eager(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng(
        "a_tensor_parallel_block_with_noise_early_launches_and_cublas_replays_like_eager",
    );
    let world = group.world_size();
    let seed: u64 = rng.random();
    let inputs: Vec<Vec<Vec<f32>>> = (0..=REPLAYS)
        .map(|_| {
            (0..world)
                .map(|_| random_vec(&mut rng, ROWS * IN))
                .collect()
        })
        .collect();
    let scaled = |v: Vec<f32>, a: f32| v.into_iter().map(|x| a * x).collect::<Vec<f32>>();
    let weights: Vec<[Vec<f32>; 3]> = (0..world)
        .map(|_| {
            [
                scaled(random_vec(&mut rng, HID * IN), 0.125),
                random_vec(&mut rng, HID),
                scaled(random_vec(&mut rng, HID * OUT), 0.125),
            ]
        })
        .collect();
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let [w1, b1, w2] = &weights[rank];
        let (w1, b1, w2) = (s.clone_htod(w1)?, s.clone_htod(b1)?, s.clone_htod(w2)?);
        // The runtime's generator, seeded alike on every rank; the eager calls draw from a
        // twin with the same seed.
        rt.rng().manual_seed(rt, seed)?;
        let twin = rt.generator(seed)?;
        let x0 = s.clone_htod(&inputs[0][rank])?;
        let mut graph = comm.capture(|| {
            let (hidden, out) = (ROWS * HID, ROWS * OUT);
            TpBlockGraph::capture(
                rt,
                &x0,
                comm,
                rt.rng(),
                &w1,
                &b1,
                &w2,
                hidden,
                hidden,
                out,
                out,
            )
        })?;
        let early_edges = graph.info().early_edges;
        let start = (rt.rng().seed_and_offset(rt)?, twin.seed_and_offset(rt)?);
        let (mut h, mut noise) = (
            s.alloc_zeros::<f32>(ROWS * HID)?,
            s.alloc_zeros::<f32>(ROWS * HID)?,
        );
        let (mut p, mut y) = (
            s.alloc_zeros::<f32>(ROWS * OUT)?,
            s.alloc_zeros::<f32>(ROWS * OUT)?,
        );
        let mut seen = Vec::new();
        for step in &inputs[1..] {
            together(comm)?;
            let out = graph.replay(&step[rank])?;
            let replayed = [
                s.clone_dtoh(out.h)?,
                s.clone_dtoh(out.noise)?,
                s.clone_dtoh(out.p)?,
                s.clone_dtoh(out.y)?,
            ];
            let generator = rt.rng().seed_and_offset(rt)?;
            let x = s.clone_htod(&step[rank])?;
            tp_block(
                rt, &x, comm, &twin, &w1, &b1, &w2, &mut h, &mut noise, &mut p, &mut y,
            )?;
            let eager = [
                s.clone_dtoh(&h)?,
                s.clone_dtoh(&noise)?,
                s.clone_dtoh(&p)?,
                s.clone_dtoh(&y)?,
            ];
            let twin = twin.seed_and_offset(rt)?;
            seen.push(BlockStep {
                replayed,
                eager,
                generator,
                twin,
            });
        }
        Ok((rt.compute_capability(), early_edges, start, seen))
    })?;
    let names = [
        "h (early-launched layer)",
        "noise",
        "p (cuBLAS, nested)",
        "y",
    ];
    for (rank, (capability, early_edges, start, steps)) in seen.iter().enumerate() {
        // At least the sum's kernel → `y += 1` and one into the early layer (the graph may
        // make more of its kernels' edges programmatic).
        if *capability >= (9, 0) {
            assert!(
                *early_edges >= 2,
                "rank {rank}: early-launch edges {early_edges}"
            );
        } else {
            assert_eq!(*early_edges, 0, "rank {rank}: early-launch edges");
        }
        assert_eq!(
            *start,
            ((seed, 0), (seed, 0)),
            "rank {rank}: generators at capture"
        );
        let mut offset = 0;
        for (k, step) in steps.iter().enumerate() {
            let at = format!("rank {rank}, replay {k}");
            for (i, name) in names.iter().enumerate() {
                same(
                    format_args!("{at}: {name}, replay vs eager"),
                    &step.replayed[i],
                    &step.eager[i],
                );
            }
            assert_eq!(step.generator, step.twin, "{at}: generator vs its twin");
            assert!(step.generator.1 > offset, "{at}: the offset did not move");
            offset = step.generator.1;
            let first = &seen[0].3[k];
            assert_eq!(
                step.generator, first.generator,
                "{at}: generator vs rank 0's"
            );
            same(
                format_args!("{at}: noise vs rank 0's"),
                &step.replayed[1],
                &first.replayed[1],
            );
            if k > 0 {
                let before = &steps[k - 1].replayed[1];
                assert!(
                    first_mismatch(&step.replayed[1], before).is_some(),
                    "{at}: the same noise as the replay before"
                );
            }
            let partials: Vec<Vec<f32>> = seen.iter().map(|r| r.3[k].replayed[2].clone()).collect();
            let y: Vec<f32> = rank_sum(&partials).iter().map(|v| v + 1.0).collect();
            same(
                format_args!("{at}: y vs the partials summed + 1"),
                &step.replayed[3],
                &y,
            );
        }
    }
    Ok(())
}

// --- G17: a second thread on a rank's runtime -----------------------------------------------

/// `y = 2x + 1`: the graph a second thread captures and replays on a rank's runtime.
#[cuda_graph(warmup = 1)]
fn doubled_plus_one(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    affine(rt, x, y, 2.0, 1.0)
}

/// A second thread's work on a rank's runtime: captures `doubled_plus_one`, lets the rank go
/// on (drops `captured`), then replays the graph with each of `inputs`, each time beside an
/// eager call; returns both results per input.
fn on_another_thread(
    rt: &Runtime,
    inputs: &[Vec<f32>],
    captured: Sender<()>,
) -> Result<Vec<[Vec<f32>; 2]>, GraphError> {
    let s = rt.stream();
    let graph = DoubledPlusOneGraph::capture(rt, &inputs[0], N);
    drop(captured);
    let mut graph = graph?;
    let mut y = s.alloc_zeros::<f32>(N)?;
    let mut seen = Vec::new();
    for x in inputs {
        let replayed = s.clone_dtoh(graph.replay(x)?.y)?;
        doubled_plus_one(rt, &s.clone_htod(x)?, &mut y)?;
        seen.push([replayed, s.clone_dtoh(&y)?]);
    }
    Ok(seen)
}

/// Pairs: nccl × rt-shared.
/// A second thread sharing a rank's runtime captures a graph of its own, then replays it 20
/// times (each beside an eager call) while the rank replays a graph with a sum (one-shot
/// kernel) and a gather (NCCL) and calls it eagerly: every collective replay equals the eager
/// call and the exact host values, and every replay of the other thread its eager call and
/// `2x + 1`.
#[gpu_test(gpus = 2)]
fn another_thread_replays_its_graph_on_a_ranks_runtime_while_collectives_replay(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng =
        fresh_rng("another_thread_replays_its_graph_on_a_ranks_runtime_while_collectives_replay");
    let world = group.world_size();
    let plan = int_plan(&mut rng, REPLAYS + 1, world, N);
    let theirs: Vec<Vec<Vec<f32>>> = (0..world)
        .map(|_| (0..4 * REPLAYS).map(|_| ints(&mut rng, N)).collect())
        .collect();
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let x0 = s.clone_htod(&plan[0][rank])?;
        let mut graph = comm.capture(|| SumAndGatherGraph::capture(rt, &x0, comm, N, world * N))?;
        let (mut sum, mut g) = (s.alloc_zeros::<f32>(N)?, s.alloc_zeros::<f32>(world * N)?);
        std::thread::scope(|scope| {
            let shared = rt.clone();
            let mine = &theirs[rank];
            let (captured, capturing) = channel();
            let other = scope.spawn(move || on_another_thread(&shared, mine, captured));
            // Its capture first (the sender dropped, also if the thread stops): from here on,
            // its replays and eager calls run beside the rank's.
            let _ = capturing.recv();
            let mut seen = Vec::new();
            for step in &plan[1..] {
                together(comm)?;
                let out = graph.replay(&step[rank])?;
                let replayed = [s.clone_dtoh(out.sum)?, s.clone_dtoh(out.gathered)?];
                sum_and_gather(rt, &s.clone_htod(&step[rank])?, comm, &mut sum, &mut g)?;
                seen.push((replayed, [s.clone_dtoh(&sum)?, s.clone_dtoh(&g)?]));
            }
            let others = other.join().map_err(|_| panicked("the other thread"))??;
            Ok((seen, others))
        })
    })?;
    for (rank, (steps, others)) in seen.iter().enumerate() {
        for (k, ((replayed, eager), inputs)) in steps.iter().zip(&plan[1..]).enumerate() {
            let want = [rank_sum(inputs), inputs.concat()];
            for (i, name) in ["sum", "gathered"].iter().enumerate() {
                let at = format!("rank {rank}, replay {k}: {name}");
                same(
                    format_args!("{at}, replay vs eager"),
                    &replayed[i],
                    &eager[i],
                );
                same(format_args!("{at}, replay vs host"), &replayed[i], &want[i]);
            }
        }
        assert_eq!(
            others.len(),
            theirs[rank].len(),
            "rank {rank}: the other thread's replays"
        );
        for (k, ([replayed, eager], x)) in others.iter().zip(&theirs[rank]).enumerate() {
            let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
            let at = format!("rank {rank}, the other thread's replay {k}");
            same(format_args!("{at}, replay vs eager"), replayed, eager);
            same(format_args!("{at}, replay vs host"), replayed, &want);
        }
    }
    Ok(())
}

// --- G17: the determinism check and verify failing on one rank ------------------------------

thread_local! {
    /// How often `host_scale` ran on this thread where planted.
    static SCALE_CALLS: Cell<u32> = const { Cell::new(0) };
    /// The serving step this thread is at, as a host schedule would see it.
    static HOST_STEP: Cell<usize> = const { Cell::new(0) };
}

/// 1, or where `planted` a new number on every call: a host counter inside the body that the
/// compile-time checks cannot see into (the planted bug), so two captures record different
/// work.
fn host_scale(planted: bool) -> f32 {
    if !planted {
        return 1.0;
    }
    SCALE_CALLS.with(|c| {
        c.set(c.get() + 1);
        c.get() as f32
    })
}

/// `y = a · Σ x` over the ranks, `a` from `host_scale`; every capture recorded twice and
/// compared.
#[cuda_graph(warmup = 1, check_determinism = true)]
fn checked_sum(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
    #[constant] planted: bool,
) -> Result<(), GraphError> {
    comm.all_reduce(x, &mut *y, ReduceOp::Sum)?;
    scale_inplace(rt, y, host_scale(planted))
}

/// Pairs: nccl × debugchecks.
/// The determinism check (`check_determinism = true`, in every build) finding a difference on
/// one rank only (a host counter planted in its body): that rank gets
/// `NondeterministicCapture`, every other rank `PeerFailed` naming it at the comparison before
/// instantiation, and no rank keeps a graph or waits; then the same body without the plant
/// captures on every rank, with the check, and replays with new inputs exactly.
#[gpu_test(gpus = 2)]
fn a_determinism_check_failing_on_one_rank_stops_every_rank(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_determinism_check_failing_on_one_rank_stops_every_rank");
    let world = group.world_size();
    let plan = int_plan(&mut rng, REPLAYS + 1, world, N);
    let last = world - 1;
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let x0 = s.clone_htod(&plan[0][rank])?;
        let planted = rank == last;
        let refused = comm
            .capture(|| CheckedSumGraph::capture(rt, &x0, comm, N, planted))
            .err();
        let mut graph = comm.capture(|| CheckedSumGraph::capture(rt, &x0, comm, N, false))?;
        let checked = graph.info().checks_time > Duration::ZERO;
        let mut sums = Vec::new();
        for step in &plan[1..] {
            together(comm)?;
            sums.push(s.clone_dtoh(graph.replay(&step[rank])?.y)?);
        }
        Ok((refused, checked, sums))
    })?;
    for (rank, (refused, checked, sums)) in seen.iter().enumerate() {
        let e = refused
            .as_ref()
            .unwrap_or_else(|| panic!("rank {rank}: the planted capture succeeded"));
        if rank == last {
            assert!(
                matches!(
                    e,
                    GraphError::NondeterministicCapture {
                        graph: "checked_sum",
                        ..
                    }
                ),
                "rank {rank} (planted): {e:?}"
            );
            assert!(e.to_string().contains("scale_inplace"), "rank {rank}: {e}");
        } else {
            let Some(CollectiveError::PeerFailed {
                peer, at, reason, ..
            }) = e.collective()
            else {
                panic!("rank {rank}: expected PeerFailed, got {e:?}");
            };
            assert_eq!(*peer, last, "rank {rank}: the rank named");
            assert!(at.contains("checked_sum"), "rank {rank}: {at}");
            assert!(
                reason.contains("twice recorded different work"),
                "rank {rank}: {reason}"
            );
        }
        assert!(
            checked,
            "rank {rank}: the determinism check ran on the unplanted capture"
        );
        for (k, (got, inputs)) in sums.iter().zip(&plan[1..]).enumerate() {
            same(
                format_args!("rank {rank}, replay {k}: sum"),
                got,
                &rank_sum(inputs),
            );
        }
    }
    Ok(())
}

/// A rate read from this thread's host schedule (0.5, then 0.25 from step 2) through a helper
/// the compile-time checks cannot see into: its value at capture is frozen into the graph
/// (the planted bug).
fn host_rate() -> f32 {
    if HOST_STEP.with(Cell::get) >= 2 {
        0.25
    } else {
        0.5
    }
}

/// `y = rate · Σ x` over the ranks; every replay verifies itself against an eager run.
#[cuda_graph(warmup = 1, verify = "every")]
fn rated_sum(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, &mut *y, ReduceOp::Sum)?;
    scale_inplace(rt, y, host_rate())
}

/// Pairs: nccl × verify.
/// `verify = "every"` with a host value frozen at capture, whose schedule moves on one rank
/// only: each rank verifies its own replays. From the step its schedule moves, that rank's
/// replays are `VerifyMismatch` naming the replay while the others' pass, and every rank's
/// replay ran (its output holds the graph's result, the exact sum at the captured rate), so
/// the ranks go on together and none waits for another.
#[gpu_test(gpus = 2)]
fn a_verify_mismatch_on_one_rank_is_that_ranks_error_alone(
    group: CommGroup,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_verify_mismatch_on_one_rank_is_that_ranks_error_alone");
    let world = group.world_size();
    let plan = int_plan(&mut rng, REPLAYS + 1, world, N);
    let last = world - 1;
    let seen = with_timeout(&group).run(&devices(&group), |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        HOST_STEP.with(|h| h.set(0));
        let x0 = s.clone_htod(&plan[0][rank])?;
        let mut graph = comm.capture(|| RatedSumGraph::capture(rt, &x0, comm, N))?;
        let mut seen = Vec::new();
        for (k, step) in plan[1..].iter().enumerate() {
            if rank == last {
                HOST_STEP.with(|h| h.set(k));
            }
            together(comm)?;
            let verdict = graph.replay(&step[rank]).map(drop).err();
            seen.push((verdict, s.clone_dtoh(graph.outputs().y)?));
        }
        HOST_STEP.with(|h| h.set(0));
        Ok(seen)
    })?;
    for (rank, steps) in seen.iter().enumerate() {
        for (k, ((verdict, y), inputs)) in steps.iter().zip(&plan[1..]).enumerate() {
            let at = format!("rank {rank}, replay {k}");
            let want: Vec<f32> = rank_sum(inputs).iter().map(|v| 0.5 * v).collect();
            same(format_args!("{at}: the replay's output"), y, &want);
            match verdict {
                None => assert!(rank != last || k < 2, "{at}: verified clean"),
                Some(GraphError::VerifyMismatch { graph, report }) => {
                    assert!(rank == last && k >= 2, "{at}: {report}");
                    assert_eq!(*graph, "rated_sum", "{at}");
                    assert_eq!(report.replay, Some(k as u64 + 1), "{at}: {report}");
                }
                Some(e) => panic!("{at}: {e:?}"),
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    workloads::testing::run_tests()
}
