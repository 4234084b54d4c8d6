//! Pairs of features in whole programs (issue 31; groups G1, G2, G5, G16, G18, G19, G23 and G25
//! of the composition audit), each against eager execution of the same function on fresh
//! random inputs over several replays, with a twin generator of the same seed and separate
//! copies of every `&mut` state on the eager side:
//!
//! * bucket families, captured up front and `lazy`, with `&mut` state and a graph-safe
//!   generator: rows, state and generator offsets after every replay, also for buckets
//!   evicted and captured again on a later replay;
//! * bucket families whose body forks and runs `graph_while`, `graph_if` and
//!   `graph_while_unrolled`;
//! * a lazy family with an eager island between two cuBLAS GEMMs, every replay verified
//!   (`verify = "every"`) and every bucket checked for determinism;
//! * `verify = "every"` with `check_determinism = true` on a graph that draws random numbers
//!   in two segments around an island with `#[island]` state and updates `&mut` state, and on
//!   a graph that calls two `#[cuda_graph]` functions holding an early launch, a loop, a
//!   branch, a fork and an unrolled loop;
//! * the debug checks asserted: the determinism check ran (`GraphInfo::checks_time`), and in
//!   debug builds the default verify schedule catches a host value frozen at capture in a
//!   graph that forks, draws and updates `&mut` state, and in a lazy family;
//! * forks from threads, two sharing one runtime and two with a runtime each at the same time,
//!   graphs dropped in any order; a capture that forks while another thread holds a fork of
//!   the shared runtime;
//! * a seeded torture test: programs of threads, some sharing one runtime and some with their
//!   own at once, each capturing, replaying against eager and dropping in random order bucket
//!   families (both kinds), the verified graph of loops, branches, forks, early launches and
//!   nested calls, and a fork graph; the device's free memory back where it was at the end.
//!   `CUDA_GRAPH_PAIRS_PROGRAMS` (default 6) and `CUDA_GRAPH_PAIRS_SEED` steer it; the seed is
//!   printed first and named in every failure.
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{
    cuda_graph, is_capturing, Compare, Condition, ForkedStream, Generator, GraphError, GraphInfo,
    Runtime, SideMut, SideRef,
};
use workloads::kernels::ELEMENTWISE;
use workloads::ops::blas::{matmul, MatMul};
use workloads::ops::linear::linear_bias_gelu;
use workloads::reference::gelu;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

const MIB: usize = 1 << 20;

const K: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
extern "C" __global__ void add_inplace(float *y, const float *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[i];
}
extern "C" __global__ void mul_into(const float *a, const float *b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i];
}
extern "C" __global__ void scale_inplace(float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= a;
}
extern "C" __global__ void shift_inplace(float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a;
}
// acc[i] += y[r * row + i] for r = 0 .. rows, in order.
extern "C" __global__ void accumulate_rows(float *acc, const float *y, int row, int rows) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < row) {
        float s = acc[i];
        for (int r = 0; r < rows; ++r) s += y[r * row + i];
        acc[i] = s;
    }
}
extern "C" __global__ void count_call(unsigned int *calls) {
    if (blockIdx.x == 0 && threadIdx.x == 0) calls[0] += 1u;
}
// y *= 0.5 in a step of graph_while_unrolled, nothing once an earlier step cleared `go`.
extern "C" __global__ void halve_guarded(float *y, int n, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= 0.5f;
}
"#
);

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n.max(1) as u32)
}

/// One thread (`LaunchConfig::for_num_elems(1)` would be a block of 1024).
fn one() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `y += b` on the runtime's stream.
fn add_inplace(rt: &Runtime, y: &mut CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<(), GraphError> {
    assert_eq!(y.len(), b.len(), "add_inplace: lengths");
    let n = y.len() as i32;
    let f = rt.function(K, "add_inplace")?;
    // SAFETY: reads and writes `n` floats of `y`, reads `n` of `b`; both hold `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *y)
            .arg(b)
            .arg(&n)
            .launch(grid(n as usize))?;
    }
    Ok(())
}

/// `y = a · b` (elementwise) on the runtime's stream.
fn mul_into(
    rt: &Runtime,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    assert!(
        a.len() == y.len() && b.len() == y.len(),
        "mul_into: lengths"
    );
    let n = y.len() as i32;
    let f = rt.function(K, "mul_into")?;
    // SAFETY: reads `n` floats of `a` and `b`, writes `n` of `y`; all hold `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(a)
            .arg(b)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(n as usize))?;
    }
    Ok(())
}

/// `y *= a` (`shift`: `y += a`) on the runtime's stream.
fn scale_or_shift(
    rt: &Runtime,
    y: &mut CudaSlice<f32>,
    a: f32,
    shift: bool,
) -> Result<(), GraphError> {
    let n = y.len() as i32;
    let f = rt.function(
        K,
        if shift {
            "shift_inplace"
        } else {
            "scale_inplace"
        },
    )?;
    // SAFETY: reads and writes `n` floats of `y`, which holds `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *y)
            .arg(&a)
            .arg(&n)
            .launch(grid(n as usize))?;
    }
    Ok(())
}

/// `acc += Σ rows of y` (`y` holds whole rows of `acc.len()` floats), row by row in order.
fn accumulate_rows(
    rt: &Runtime,
    acc: &mut CudaSlice<f32>,
    y: &CudaSlice<f32>,
) -> Result<(), GraphError> {
    let row = acc.len();
    assert!(
        row > 0 && y.len().is_multiple_of(row),
        "accumulate_rows: {} floats are not rows of {row}",
        y.len()
    );
    let (r, rows) = (row as i32, (y.len() / row) as i32);
    let f = rt.function(K, "accumulate_rows")?;
    // SAFETY: reads and writes `row` floats of `acc` and reads `rows · row` of `y`, which
    // hold as many.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *acc)
            .arg(y)
            .arg(&r)
            .arg(&rows)
            .launch(grid(row))?;
    }
    Ok(())
}

/// `calls[0] += 1` on the runtime's stream.
fn count_call(rt: &Runtime, calls: &mut CudaSlice<u32>) -> Result<(), GraphError> {
    let f = rt.function(K, "count_call")?;
    // SAFETY: one thread updates the first word of `calls`, which holds at least one.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *calls)
            .launch(one())?;
    }
    Ok(())
}

/// `y *= 0.5` in a step of `graph_while_unrolled` testing `go` (nothing after the step that
/// cleared it).
fn halve_guarded(rt: &Runtime, y: &mut CudaSlice<f32>, go: &Condition) -> Result<(), GraphError> {
    let n = y.len() as i32;
    let arg = go.kernel_arg(rt);
    let f = rt.function(K, "halve_guarded")?;
    // SAFETY: reads and writes `n` floats of `y`, which holds `n`, and reads the condition.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *y)
            .arg(&n)
            .arg(&arg)
            .launch(grid(n as usize))?;
    }
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

// ---- Shared checks ----

/// A failure in words, as a test's error.
fn fail(what: String) -> GraphError {
    GraphError::User(what.into())
}

/// Words of an error of the library, for the threads' `String` errors.
fn words(e: GraphError) -> String {
    e.to_string()
}

/// `got` equals `want` bit for bit, or a message naming `what` and the first difference.
fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements in the graph, {} eagerly",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: the graph differs from eager at element {i}: {:?} vs {:?}",
            got[i], want[i]
        )),
    }
}

/// The generator a graph draws from is where its eager twin is (same seed, same offset).
fn same_generator(rt: &Runtime, what: &str, g: &Generator, twin: &Generator) -> Result<(), String> {
    let (got, want) = (
        g.seed_and_offset(rt).map_err(words)?,
        twin.seed_and_offset(rt).map_err(words)?,
    );
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{what}: the graph's generator is at (seed, offset) {got:?}, its eager twin's at {want:?}"
        ))
    }
}

/// Longer than a capture's checks take when they are off (the time between two clock reads),
/// far shorter than a second recording of any body here: `checks_time` above it means the
/// determinism check ran.
const CHECKED: Duration = Duration::from_micros(2);

/// The determinism check ran for the graph `info` describes.
fn assert_checked(info: &GraphInfo, what: &str) {
    assert!(
        info.checks_time >= CHECKED,
        "{what}: `check_determinism = true`, yet the capture's checks took {:?}: the check did not run",
        info.checks_time
    );
}

/// The smallest of `buckets` that holds `batch` rows.
fn bucket_for(buckets: &[usize], batch: usize) -> usize {
    *buckets
        .iter()
        .find(|&&b| b >= batch)
        .expect("a batch within the buckets")
}

/// `x`'s rows, then zero rows up to `rows` rows of `row` floats: what a bucket runs on.
fn padded(x: &[f32], rows: usize, row: usize) -> Vec<f32> {
    let mut p = x.to_vec();
    p.resize(rows * row, 0.0);
    p
}

// ---- G1: bucket families with `&mut` state and random numbers ----

/// Floats per row of the families.
const ROW: usize = 64;

/// One step of the `noisy_rows` families on a bucket's rows: `y = x + uniform(-1, 1)` drawn
/// from `g`, `acc += Σ rows of y`, `calls += 1`.
fn noisy_rows_body(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    g: &Generator,
    calls: &mut CudaSlice<u32>,
    acc: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    g.uniform(rt, &mut *y, -1.0, 1.0)?;
    add_inplace(rt, &mut *y, x)?;
    accumulate_rows(rt, acc, y)?;
    count_call(rt, calls)
}

/// Every bucket captured up front.
#[cuda_graph(warmup = 2, buckets(batch = [1, 2, 4]))]
fn noisy_rows(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] g: &Generator,
    #[state] calls: &mut CudaSlice<u32>,
    #[state] acc: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    noisy_rows_body(rt, x, g, calls, acc, y)
}

/// Each bucket captured on the first replay that needs it, at most two live: three buckets
/// cycling through two graphs are evicted and captured again.
#[cuda_graph(warmup = 2, buckets(batch = [1, 2, 4], lazy = 2))]
fn noisy_rows_lazy(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] g: &Generator,
    #[state] calls: &mut CudaSlice<u32>,
    #[state] acc: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    noisy_rows_body(rt, x, g, calls, acc, y)
}

/// The plain function of a `noisy_rows` family.
type RowsFn = fn(
    &Runtime,
    &CudaSlice<f32>,
    &Generator,
    &mut CudaSlice<u32>,
    &mut CudaSlice<f32>,
    &mut CudaSlice<f32>,
    usize,
) -> Result<(), GraphError>;

/// The eager side of a `noisy_rows` family: a generator of the family's seed and copies of
/// its `&mut` state.
struct EagerRows {
    f: RowsFn,
    buckets: &'static [usize],
    twin: Generator,
    calls: CudaSlice<u32>,
    acc: CudaSlice<f32>,
}

/// What one replay of a `noisy_rows` family left: the valid rows of `y`, then the state.
type RowsSeen = (Vec<f32>, Vec<u32>, Vec<f32>);

impl EagerRows {
    /// The eager side of a family about to draw from `g` (at offset 0), with `calls` and
    /// `acc` as the family's state holds them now.
    fn new(
        rt: &Runtime,
        f: RowsFn,
        buckets: &'static [usize],
        g: &Generator,
        calls: &CudaSlice<u32>,
        acc: &CudaSlice<f32>,
    ) -> Result<Self, GraphError> {
        let s = rt.stream();
        let (seed, offset) = g.seed_and_offset(rt)?;
        assert_eq!(offset, 0, "a family's generator is taken before any draw");
        Ok(EagerRows {
            f,
            buckets,
            twin: rt.generator(seed)?,
            calls: s.clone_htod(&s.clone_dtoh(calls)?)?,
            acc: s.clone_htod(&s.clone_dtoh(acc)?)?,
        })
    }

    /// The function run eagerly on the rows of `x`'s bucket (`x`'s rows, then zeros), then
    /// compared with what the family's replay left (`seen`) and its generator `g`.
    fn check(
        &mut self,
        rt: &Runtime,
        g: &Generator,
        x: &[f32],
        seen: RowsSeen,
        at: &str,
    ) -> Result<(), String> {
        let s = rt.stream();
        let batch = x.len() / ROW;
        let bucket = bucket_for(self.buckets, batch);
        let xd = s
            .clone_htod(&padded(x, bucket, ROW))
            .map_err(|e| e.to_string())?;
        let mut y = s
            .alloc_zeros::<f32>(bucket * ROW)
            .map_err(|e| e.to_string())?;
        (self.f)(
            rt,
            &xd,
            &self.twin,
            &mut self.calls,
            &mut self.acc,
            &mut y,
            bucket,
        )
        .map_err(words)?;
        let mut want = s.clone_dtoh(&y).map_err(|e| e.to_string())?;
        want.truncate(batch * ROW);
        let at = format!("{at} (batch {batch}, bucket {bucket})");
        same(&format!("{at}: rows of output `y`"), &seen.0, &want)?;
        let calls = s.clone_dtoh(&self.calls).map_err(|e| e.to_string())?;
        same(&format!("{at}: state `calls`"), &seen.1, &calls)?;
        let acc = s.clone_dtoh(&self.acc).map_err(|e| e.to_string())?;
        same(&format!("{at}: state `acc`"), &seen.2, &acc)?;
        same_generator(rt, &at, g, &self.twin)
    }
}

/// What a replay of a `noisy_rows` family of either kind left: its rows and its state.
macro_rules! replay_rows {
    ($rt:expr, $family:expr, $x:expr) => {
        (|| -> Result<RowsSeen, GraphError> {
            let s = $rt.stream();
            let y = s.clone_dtoh(&$family.replay($x)?.y)?;
            let st = $family.state_mut();
            Ok((y, s.clone_dtoh(&st.calls)?, s.clone_dtoh(&st.acc)?))
        })()
    };
}

/// Pairs: family-eager × rng, family-eager × devstate-rw, family-lazy × rng, family-lazy × devstate-rw.
/// A family captured up front and a lazy one (two live graphs for three buckets, so buckets
/// are evicted and captured again on later replays) draw from a generator and update a counter
/// and an accumulator: after every replay the valid rows, the state and the generator's offset
/// equal the eager function's on the bucket's rows, with a twin generator and its own state.
#[gpu_test]
fn bucket_families_draw_and_update_state_like_eager(rt: Runtime) -> Result<(), GraphError> {
    let test = "bucket_families_draw_and_update_state_like_eager";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let batches = [3usize, 1, 4, 2, 3, 1, 4, 2, 1];
    for lazy in [false, true] {
        let kind = if lazy { "lazy family" } else { "family" };
        let seed: u64 = rng.random();
        let g = rt.generator(seed)?;
        let acc0 = random_vec(&mut rng, ROW);
        let (mut calls, mut acc) = (s.clone_htod(&[3u32])?, s.clone_htod(&acc0)?);
        let xs: Vec<Vec<f32>> = batches
            .iter()
            .map(|&b| random_vec(&mut rng, b * ROW))
            .collect();
        if lazy {
            let mut eager = EagerRows::new(
                &rt,
                noisy_rows_lazy,
                NoisyRowsLazyBuckets::BUCKETS,
                &g,
                &calls,
                &acc,
            )?;
            let mut family =
                NoisyRowsLazyBuckets::capture(&rt, ROW, &g, &mut calls, &mut acc, ROW)?;
            assert_eq!(family.buckets().graphs().count(), 0, "nothing captured yet");
            for (step, x) in xs.iter().enumerate() {
                let seen = replay_rows!(rt, family, x.as_slice())?;
                eager
                    .check(&rt, &g, x, seen, &format!("{kind}, step {step}"))
                    .map_err(fail)?;
            }
            let stats = family.buckets().stats();
            assert!(
                stats.captures() > 3 && stats.buckets.iter().any(|b| b.evictions > 0),
                "buckets were evicted and captured again on later replays:\n{stats}"
            );
        } else {
            let mut eager =
                EagerRows::new(&rt, noisy_rows, NoisyRowsBuckets::BUCKETS, &g, &calls, &acc)?;
            let mut family = NoisyRowsBuckets::capture(&rt, ROW, &g, &mut calls, &mut acc, ROW)?;
            // Three buckets warmed up twice each: all of it undone.
            {
                let st = family.state_mut();
                assert_eq!(
                    s.clone_dtoh(&st.calls)?,
                    vec![3],
                    "{kind}: warmup undone: calls"
                );
                assert_eq!(s.clone_dtoh(&st.acc)?, acc0, "{kind}: warmup undone: acc");
            }
            assert_eq!(
                g.seed_and_offset(&rt)?,
                (seed, 0),
                "{kind}: warmup draws undone"
            );
            for (step, x) in xs.iter().enumerate() {
                let seen = replay_rows!(rt, family, x.as_slice())?;
                eager
                    .check(&rt, &g, x, seen, &format!("{kind}, step {step}"))
                    .map_err(fail)?;
            }
        }
    }
    Ok(())
}

// ---- G19: bucket families with loops, branches and forks ----

/// On a bucket's rows: `z = x + 1` on a fork's side stream while `y = x` on the runtime's
/// stream; `y` halved while `y[0] > 1` (`graph_while`); `z += y` when `x[0] > 2`
/// (`graph_if`); `z` halved while `z[0] > 0.5`, three steps per iteration
/// (`graph_while_unrolled`).
fn looping_rows_body(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|side| {
        add_scalar_side(side, rt, side.read(x), side.write(&mut *z), 1.0)?;
        rt.stream().memcpy_dtod(x, &mut *y)?;
        Ok(())
    })?;
    let big = rt.condition(false)?;
    big.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while(&big, Some(64), |rt| {
        scale_or_shift(rt, &mut *y, 0.5, false)?;
        big.set_from(rt, &*y, Compare::Gt, 1.0)
    })?;
    let positive = rt.condition(false)?;
    positive.set_from(rt, x, Compare::Gt, 2.0)?;
    rt.graph_if(&positive, |rt| add_inplace(rt, &mut *z, &*y))?;
    let again = rt.condition(false)?;
    again.set_from(rt, &*z, Compare::Gt, 0.5)?;
    rt.graph_while_unrolled(&again, Some(64), 3, |rt| {
        halve_guarded(rt, &mut *z, &again)?;
        again.set_from(rt, &*z, Compare::Gt, 0.5)
    })
}

#[cuda_graph(warmup = 2, buckets(batch = [1, 2, 4]), check_determinism = true)]
fn looping_rows(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    looping_rows_body(rt, x, y, z)
}

#[cuda_graph(
    warmup = 2,
    buckets(batch = [1, 2, 4], lazy = 2),
    check_determinism = true
)]
fn looping_rows_lazy(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    looping_rows_body(rt, x, y, z)
}

/// The plain function of a `looping_rows` family.
type LoopingFn = fn(
    &Runtime,
    &CudaSlice<f32>,
    &mut CudaSlice<f32>,
    &mut CudaSlice<f32>,
    usize,
) -> Result<(), GraphError>;

/// `looping_rows` run eagerly on `x`'s bucket's rows: the valid rows of `y` and `z`.
fn looping_rows_eagerly(
    rt: &Runtime,
    f: LoopingFn,
    buckets: &[usize],
    x: &[f32],
) -> Result<(Vec<f32>, Vec<f32>), GraphError> {
    let s = rt.stream();
    let batch = x.len() / ROW;
    let bucket = bucket_for(buckets, batch);
    let xd = s.clone_htod(&padded(x, bucket, ROW))?;
    let (mut y, mut z) = (
        s.alloc_zeros::<f32>(bucket * ROW)?,
        s.alloc_zeros::<f32>(bucket * ROW)?,
    );
    f(rt, &xd, &mut y, &mut z, bucket)?;
    let (mut y, mut z) = (s.clone_dtoh(&y)?, s.clone_dtoh(&z)?);
    y.truncate(batch * ROW);
    z.truncate(batch * ROW);
    Ok((y, z))
}

/// How many halvings take `v` to 1 or below: the trip count of the `graph_while` above.
fn halvings(mut v: f32) -> u32 {
    let mut n = 0;
    while v > 1.0 {
        v *= 0.5;
        n += 1;
    }
    n
}

/// Pairs: family-eager × while, family-eager × if, family-eager × unrolled, family-eager × fork, family-lazy × while, family-lazy × if, family-lazy × unrolled, family-lazy × fork.
/// Bucket families (up front and lazy) whose body forks, loops with `graph_while`, branches
/// with `graph_if` and loops with `graph_while_unrolled` on the bucket's rows: the valid rows
/// of both outputs equal the eager function's on the bucket's rows, bitwise, with trip counts
/// and branches that change from replay to replay.
#[gpu_test]
fn bucket_families_fork_loop_and_branch_like_eager(rt: Runtime) -> Result<(), GraphError> {
    let test = "bucket_families_fork_loop_and_branch_like_eager";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let batches = [3usize, 1, 4, 2, 3, 2, 1, 4];
    for lazy in [false, true] {
        let kind = if lazy { "lazy family" } else { "family" };
        let (mut trips, mut taken) = (Vec::new(), [0usize; 2]);
        let (mut eager_fam, mut lazy_fam) = if lazy {
            let fam = LoopingRowsLazyBuckets::capture(&rt, ROW, ROW, ROW)?;
            (None, Some(fam))
        } else {
            (Some(LoopingRowsBuckets::capture(&rt, ROW, ROW, ROW)?), None)
        };
        let (f, buckets): (LoopingFn, &[usize]) = if lazy {
            (looping_rows_lazy, LoopingRowsLazyBuckets::BUCKETS)
        } else {
            (looping_rows, LoopingRowsBuckets::BUCKETS)
        };
        if let Some(fam) = &eager_fam {
            for g in fam.buckets().graphs() {
                assert!(
                    g.info().kinds.conditionals >= 3,
                    "{kind}: a WHILE, an IF and an unrolled WHILE node in every bucket: {:?}",
                    g.info()
                );
                assert_checked(g.info(), kind);
            }
        }
        for (step, &batch) in batches.iter().enumerate() {
            let mut x = random_vec(&mut rng, batch * ROW);
            // Both ways of the branch, and loops of 0 to 11 trips.
            x[0] = match step {
                0 => 0.5,
                1 => 100.0,
                _ => rng.random_range(-1.0f32..8.0).exp(),
            };
            trips.push(halvings(x[0]));
            taken[usize::from(x[0] > 2.0)] += 1;
            let (gy, gz) = match (&mut eager_fam, &mut lazy_fam) {
                (Some(fam), _) => {
                    let out = fam.replay(&x)?;
                    (s.clone_dtoh(&out.y)?, s.clone_dtoh(&out.z)?)
                }
                (_, Some(fam)) => {
                    let out = fam.replay(&x)?;
                    (s.clone_dtoh(&out.y)?, s.clone_dtoh(&out.z)?)
                }
                _ => unreachable!("one family per round"),
            };
            let (ey, ez) = looping_rows_eagerly(&rt, f, buckets, &x)?;
            let at = format!("{kind}, step {step} (batch {batch}, x[0] = {})", x[0]);
            same(&format!("{at}: rows of output `y`"), &gy, &ey).map_err(fail)?;
            same(&format!("{at}: rows of output `z`"), &gz, &ez).map_err(fail)?;
        }
        if let Some(fam) = &lazy_fam {
            let stats = fam.buckets().stats();
            assert!(
                stats.buckets.iter().any(|b| b.evictions > 0),
                "{kind}: buckets captured again: {stats}"
            );
            for g in fam.buckets().graphs() {
                assert_checked(g.info(), kind);
            }
        }
        trips.sort_unstable();
        trips.dedup();
        assert!(
            trips.len() >= 3 && taken[0] > 0 && taken[1] > 0,
            "{kind}: trip counts {trips:?} and branches taken {taken:?} varied"
        );
    }
    Ok(())
}

// ---- Bucket families that launch early and call a graph function ----

/// `h = gelu(x · wᵀ + b)` on every row of `x` (`FLOW_IN` floats each), launched early: a
/// graph function of its own, called by the families below.
#[cuda_graph(warmup = 1)]
fn early_rows_layer(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    h: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    linear_bias_gelu(rt, true, x, w, b, h, x.len() / FLOW_IN, FLOW_OUT, FLOW_IN)
}

/// On a bucket's rows: the called graph function's layer, then the same layer on its output,
/// launched early in the family's own body.
fn two_early_layers(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    h: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    early_rows_layer(rt, x, w, b, &mut *h)?;
    linear_bias_gelu(rt, true, &*h, w, b, y, batch, FLOW_OUT, FLOW_OUT)
}

#[cuda_graph(warmup = 2, buckets(batch = [1, 2, 4]), check_determinism = true)]
fn early_nested_rows(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    h: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    two_early_layers(rt, x, w, b, h, y, batch)
}

#[cuda_graph(
    warmup = 2,
    buckets(batch = [1, 2, 4], lazy = 2),
    check_determinism = true
)]
fn early_nested_rows_lazy(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    h: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    two_early_layers(rt, x, w, b, h, y, batch)
}

/// The plain function of an `early_nested_rows` family.
type EarlyRowsFn = fn(
    &Runtime,
    &CudaSlice<f32>,
    &CudaSlice<f32>,
    &CudaSlice<f32>,
    &mut CudaSlice<f32>,
    &mut CudaSlice<f32>,
    usize,
) -> Result<(), GraphError>;

/// Pairs: family-eager × early, family-lazy × early, family-eager × nested, family-lazy × nested.
/// Bucket families (up front, and lazy with two live graphs for three buckets) whose body
/// calls a `#[cuda_graph]` function that launches early and then launches early itself: every
/// bucket's graph has its programmatic edges, and the valid rows of both outputs equal the
/// eager function's on the bucket's rows, bitwise, over batches that change every replay.
#[gpu_test]
fn bucket_families_launch_early_and_call_graph_functions_like_eager(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("bucket_families_launch_early_and_call_graph_functions_like_eager");
    let s = rt.stream().clone();
    let weights = FlowWeights::new(&rt, &mut rng)?;
    let (w, b) = (&weights.w, &weights.b);
    let batches = [3usize, 1, 4, 2, 3, 1, 4, 2];
    for lazy in [false, true] {
        let kind = if lazy { "lazy family" } else { "family" };
        let (f, buckets): (EarlyRowsFn, &[usize]) = if lazy {
            (early_nested_rows_lazy, EarlyNestedRowsLazyBuckets::BUCKETS)
        } else {
            (early_nested_rows, EarlyNestedRowsBuckets::BUCKETS)
        };
        let mut up_front = (!lazy)
            .then(|| EarlyNestedRowsBuckets::capture(&rt, FLOW_IN, w, b, FLOW_OUT, FLOW_OUT))
            .transpose()?;
        let mut on_use = lazy
            .then(|| EarlyNestedRowsLazyBuckets::capture(&rt, FLOW_IN, w, b, FLOW_OUT, FLOW_OUT))
            .transpose()?;
        for (step, &batch) in batches.iter().enumerate() {
            let x = random_vec(&mut rng, batch * FLOW_IN);
            let (gh, gy, edges) = match (&mut up_front, &mut on_use) {
                (Some(fam), _) => {
                    let out = fam.replay(&x)?;
                    let (gh, gy) = (s.clone_dtoh(&out.h)?, s.clone_dtoh(&out.y)?);
                    let edges: Vec<usize> = fam
                        .buckets()
                        .graphs()
                        .map(|g| g.info().early_edges)
                        .collect();
                    (gh, gy, edges)
                }
                (_, Some(fam)) => {
                    let out = fam.replay(&x)?;
                    let (gh, gy) = (s.clone_dtoh(&out.h)?, s.clone_dtoh(&out.y)?);
                    let edges: Vec<usize> = fam
                        .buckets()
                        .graphs()
                        .map(|g| g.info().early_edges)
                        .collect();
                    (gh, gy, edges)
                }
                _ => unreachable!("one family per round"),
            };
            assert!(
                !edges.is_empty() && edges.iter().all(|&e| e >= 1),
                "{kind}, step {step}: programmatic edges per bucket graph {edges:?}"
            );
            let bucket = bucket_for(buckets, batch);
            let xd = s.clone_htod(&padded(&x, bucket, FLOW_IN))?;
            let mut eh = s.alloc_zeros::<f32>(bucket * FLOW_OUT)?;
            let mut ey = s.alloc_zeros::<f32>(bucket * FLOW_OUT)?;
            f(&rt, &xd, w, b, &mut eh, &mut ey, bucket)?;
            let valid = batch * FLOW_OUT;
            let at = format!("{kind}, step {step} (batch {batch}, bucket {bucket})");
            same(
                &format!("{at}: rows of `h`"),
                &gh,
                &s.clone_dtoh(&eh)?[..valid],
            )
            .map_err(fail)?;
            same(
                &format!("{at}: rows of `y`"),
                &gy,
                &s.clone_dtoh(&ey)?[..valid],
            )
            .map_err(fail)?;
        }
    }
    Ok(())
}

// ---- G18 and G5: an island between cuBLAS GEMMs in a lazy family, every replay verified ----

/// Features per row of `clamped_mlp_rows`.
const WIDE: usize = 128;

/// `h = x · w1` (cuBLAS), clamped to ±0.5 plus `row / 8` on the host in an eager island,
/// then `y = h · w2` (cuBLAS); every replay verified against the function run eagerly on the
/// bucket's rows, every bucket captured twice and compared.
#[cuda_graph(
    warmup = 2,
    buckets(batch = [2, 4, 8], lazy = 2),
    verify = "every",
    check_determinism = true
)]
fn clamped_mlp_rows(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w1: &CudaSlice<f32>,
    #[state] w2: &CudaSlice<f32>,
    h: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    matmul(rt, x, w1, &mut *h, MatMul::nn(batch, WIDE, WIDE))?;
    rt.eager(|| {
        let mut host = rt.stream().clone_dtoh(&h)?;
        for (i, v) in host.iter_mut().enumerate() {
            *v = v.clamp(-0.5, 0.5) + (i / WIDE) as f32 * 0.125;
        }
        rt.stream().memcpy_htod(&host, &mut h)?;
        Ok(())
    })?;
    matmul(rt, &*h, w2, y, MatMul::nn(batch, WIDE, WIDE))
}

/// Pairs: island × family-lazy, island × cublas, family-lazy × verify, family-lazy × debugchecks, verify × cublas, island × verify, verify × debugchecks.
/// A lazy family (two live graphs for three buckets) of two cuBLAS GEMMs around an eager island,
/// with `verify = "every"` and `check_determinism = true`: every replay verifies itself (a
/// mismatch is an error), both outputs' valid rows equal the eager function's on the bucket's
/// rows bitwise, every bucket captured (again) ran the determinism check, and each bucket's
/// graph has its two segments.
#[gpu_test]
fn a_lazy_family_with_an_island_between_gemms_verifies_every_replay(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "a_lazy_family_with_an_island_between_gemms_verifies_every_replay";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let scale = 1.0 / (WIDE as f32).sqrt();
    let mut weights = || -> Result<CudaSlice<f32>, GraphError> {
        let w: Vec<f32> = random_vec(&mut rng, WIDE * WIDE)
            .iter()
            .map(|v| v * scale)
            .collect();
        Ok(s.clone_htod(&w)?)
    };
    let (w1, w2) = (weights()?, weights()?);
    let mut family = ClampedMlpRowsBuckets::capture(&rt, WIDE, &w1, &w2, WIDE, WIDE)?;
    for (step, batch) in [3usize, 8, 1, 5, 2, 6, 3].into_iter().enumerate() {
        let x = random_vec(&mut rng, batch * WIDE);
        let out = family.replay(&x)?;
        let (gh, gy) = (s.clone_dtoh(&out.h)?, s.clone_dtoh(&out.y)?);
        let bucket = bucket_for(ClampedMlpRowsBuckets::BUCKETS, batch);
        let xd = s.clone_htod(&padded(&x, bucket, WIDE))?;
        let (mut eh, mut ey) = (
            s.alloc_zeros::<f32>(bucket * WIDE)?,
            s.alloc_zeros::<f32>(bucket * WIDE)?,
        );
        clamped_mlp_rows(&rt, &xd, &w1, &w2, &mut eh, &mut ey, bucket)?;
        let at = format!("step {step} (batch {batch}, bucket {bucket})");
        let valid = batch * WIDE;
        same(
            &format!("{at}: rows of output `h`"),
            &gh,
            &s.clone_dtoh(&eh)?[..valid],
        )
        .map_err(fail)?;
        same(
            &format!("{at}: rows of output `y`"),
            &gy,
            &s.clone_dtoh(&ey)?[..valid],
        )
        .map_err(fail)?;
        for g in family.buckets().graphs() {
            assert_checked(g.info(), &at);
        }
    }
    let stats = family.buckets().stats();
    assert!(
        stats.captures() > 3 && stats.buckets.iter().any(|b| b.evictions > 0),
        "buckets were evicted and captured again:\n{stats}"
    );
    let summary = family.to_string();
    assert!(
        summary.contains("segment 2 of 2") && summary.contains("island 1 at"),
        "{summary}"
    );
    Ok(())
}

// ---- G5: verify modes on graphs with generators, `&mut` state and islands ----

/// A host random generator kept between replays as `#[island]` state.
#[derive(Clone, Debug, PartialEq)]
struct HostRng(u64);

impl HostRng {
    /// A number below `n` (xorshift).
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Segment 1: `noise = uniform(-1, 1)` from `g`, `y = x · w + noise`, `acc += y`; an island
/// sorts `y` on the host and zeroes an element picked by `#[island]` state; segment 2:
/// `noise = normal(0, 1)` from `g`, `y += noise`, `acc += y`. Every replay verified, the
/// capture checked for determinism.
#[allow(clippy::too_many_arguments)]
#[cuda_graph(warmup = 2, verify = "every", check_determinism = true)]
fn noisy_island_step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] g: &Generator,
    #[state] w: &CudaSlice<f32>,
    #[state] acc: &mut CudaSlice<f32>,
    #[island] pick: &mut HostRng,
    noise: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    g.uniform(rt, &mut *noise, -1.0, 1.0)?;
    mul_into(rt, x, w, &mut *y)?;
    add_inplace(rt, &mut *y, &*noise)?;
    accumulate_rows(rt, &mut *acc, &*y)?;
    rt.eager(|| {
        let mut host = rt.stream().clone_dtoh(&y)?;
        host.sort_by(f32::total_cmp);
        let k = pick.below(host.len());
        host[k] = 0.0;
        rt.stream().memcpy_htod(&host, &mut y)?;
        Ok(())
    })?;
    g.normal(rt, &mut *noise, 0.0, 1.0)?;
    add_inplace(rt, &mut *y, &*noise)?;
    accumulate_rows(rt, &mut *acc, &*y)
}

/// Pairs: rng × verify, devstate-rw × verify, devstate-ro × verify, island × verify, rng × devstate-rw, verify × debugchecks, rng × debugchecks, devstate-rw × debugchecks, island × rng.
/// `verify = "every"` and `check_determinism = true` on a graph that draws from a generator in
/// both segments around an island with `#[island]` state, reads `#[state]` weights and updates
/// a `&mut` accumulator: the determinism check ran, the warmup was undone, and over 6 replays
/// with fresh inputs (each verified by the graph itself) the outputs, the accumulator, the
/// island state and the generator's offset equal the eager function's with a twin generator
/// and its own state.
#[gpu_test]
fn verify_every_undoes_draws_mut_state_and_island_state(rt: Runtime) -> Result<(), GraphError> {
    let test = "verify_every_undoes_draws_mut_state_and_island_state";
    let mut rng = fresh_rng(test);
    let n = 1000;
    let s = rt.stream().clone();
    let seed: u64 = rng.random();
    let (g, twin) = (rt.generator(seed)?, rt.generator(seed)?);
    let w = s.clone_htod(&random_vec(&mut rng, n))?;
    let acc0 = random_vec(&mut rng, n);
    let mut acc = s.clone_htod(&acc0)?;
    let pick0 = HostRng(rng.random::<u64>() | 1);
    let (mut e_acc, mut e_pick) = (s.clone_htod(&acc0)?, pick0.clone());
    let mut graph = NoisyIslandStepGraph::capture(
        &rt,
        &random_vec(&mut rng, n),
        &g,
        &w,
        &mut acc,
        pick0.clone(),
        n,
        n,
    )?;
    assert_checked(graph.info(), test);
    assert_eq!(graph.islands().len(), 1, "{graph}");
    assert_eq!(g.seed_and_offset(&rt)?, (seed, 0), "warmup draws undone");
    {
        let st = graph.state_mut();
        assert_eq!(s.clone_dtoh(&st.acc)?, acc0, "warmup undone: acc");
        assert_eq!(*st.pick, pick0, "warmup undone: island state");
    }
    let (mut e_noise, mut e_y) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    for replay in 1..=6 {
        let x = random_vec(&mut rng, n);
        let out = graph.replay(&x)?;
        let (gy, gnoise) = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.noise)?);
        noisy_island_step(
            &rt,
            &s.clone_htod(&x)?,
            &twin,
            &w,
            &mut e_acc,
            &mut e_pick,
            &mut e_noise,
            &mut e_y,
        )?;
        let at = format!("replay {replay}");
        same(&format!("{at}: output `y`"), &gy, &s.clone_dtoh(&e_y)?).map_err(fail)?;
        same(
            &format!("{at}: output `noise`"),
            &gnoise,
            &s.clone_dtoh(&e_noise)?,
        )
        .map_err(fail)?;
        let st = graph.state_mut();
        same(
            &format!("{at}: state `acc`"),
            &s.clone_dtoh(&st.acc)?,
            &s.clone_dtoh(&e_acc)?,
        )
        .map_err(fail)?;
        assert_eq!(*st.pick, e_pick, "{at}: island state `pick`");
        same_generator(&rt, &at, &g, &twin).map_err(fail)?;
    }
    Ok(())
}

// ---- G5: verify modes through loops, branches, forks, early launch and nested calls ----

/// Rows, inputs and outputs of the early-launched layer of `early_loop_branch`.
const FLOW_ROWS: usize = 4;
const FLOW_IN: usize = 64;
const FLOW_OUT: usize = 64;

/// `h = gelu(x · wᵀ + b)` launched early; `h` halved while `h[0] > 1` (`graph_while`), then
/// `h += 1` when `h[0] > 0.25` (`graph_if`). Called by `flow_step`, and a graph of its own.
#[cuda_graph(warmup = 1)]
fn early_loop_branch(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    h: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    linear_bias_gelu(rt, true, x, w, b, &mut *h, FLOW_ROWS, FLOW_OUT, FLOW_IN)?;
    let big = rt.condition(false)?;
    big.set_from(rt, &*h, Compare::Gt, 1.0)?;
    rt.graph_while(&big, Some(64), |rt| {
        scale_or_shift(rt, &mut *h, 0.5, false)?;
        big.set_from(rt, &*h, Compare::Gt, 1.0)
    })?;
    let positive = rt.condition(false)?;
    positive.set_from(rt, &*h, Compare::Gt, 0.25)?;
    rt.graph_if(&positive, |rt| scale_or_shift(rt, &mut *h, 1.0, true))
}

/// `z = h + 1` on a fork's side stream while `y = h` on the runtime's stream; `y += z`; `y`
/// halved while `y[0] > 0.25`, four steps per iteration (`graph_while_unrolled`). Called by
/// `flow_step`, and a graph of its own.
#[cuda_graph(warmup = 1)]
fn forked_unrolled(
    rt: &Runtime,
    h: &CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|side| {
        add_scalar_side(side, rt, side.read(h), side.write(&mut *z), 1.0)?;
        rt.stream().memcpy_dtod(h, &mut *y)?;
        Ok(())
    })?;
    add_inplace(rt, &mut *y, &*z)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 0.25)?;
    rt.graph_while_unrolled(&go, Some(64), 4, |rt| {
        halve_guarded(rt, &mut *y, &go)?;
        go.set_from(rt, &*y, Compare::Gt, 0.25)
    })
}

/// Both graph functions above, one after the other; every replay verified, the capture
/// checked for determinism.
#[cuda_graph(warmup = 2, verify = "every", check_determinism = true)]
fn flow_step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    h: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    early_loop_branch(rt, x, w, b, &mut *h)?;
    forked_unrolled(rt, &*h, &mut *z, &mut *y)
}

/// The weights of the early-launched layer (`w` as `[FLOW_OUT, FLOW_IN]`), scaled so that
/// the loop's trip count depends on the input.
struct FlowWeights {
    w: CudaSlice<f32>,
    b: CudaSlice<f32>,
    host_w: Vec<f32>,
    host_b: Vec<f32>,
}

impl FlowWeights {
    fn new(rt: &Runtime, rng: &mut SmallRng) -> Result<Self, GraphError> {
        let host_w: Vec<f32> = random_vec(rng, FLOW_OUT * FLOW_IN)
            .iter()
            .map(|v| v * 0.1)
            .collect();
        let host_b = random_vec(rng, FLOW_OUT);
        Ok(FlowWeights {
            w: rt.stream().clone_htod(&host_w)?,
            b: rt.stream().clone_htod(&host_b)?,
            host_w,
            host_b,
        })
    }

    /// `h[0]` before the loop of `early_loop_branch` (row 0, output 0), on the host in f64:
    /// what its trip count depends on.
    fn first_before_loop(&self, x: &[f32]) -> f32 {
        let dot: f64 = (0..FLOW_IN)
            .map(|i| f64::from(x[i]) * f64::from(self.host_w[i]))
            .sum();
        gelu(dot + f64::from(self.host_b[0])) as f32
    }
}

/// An input of `flow_step`: uniform values scaled by `e^0` to `e^4`, so that `h[0]` and the
/// loops' trip counts change from input to input.
fn flow_input(rng: &mut SmallRng) -> Vec<f32> {
    let scale = rng.random_range(0.0f32..4.0).exp();
    random_vec(rng, FLOW_ROWS * FLOW_IN)
        .iter()
        .map(|v| v * scale)
        .collect()
}

/// The eager side of a `flow_step` graph: its outputs `h`, `z`, `y`.
struct EagerFlow([CudaSlice<f32>; 3]);

impl EagerFlow {
    fn new(rt: &Runtime) -> Result<Self, GraphError> {
        let s = rt.stream();
        let n = FLOW_ROWS * FLOW_OUT;
        Ok(EagerFlow([
            s.alloc_zeros(n)?,
            s.alloc_zeros(n)?,
            s.alloc_zeros(n)?,
        ]))
    }

    /// Replays `graph` on `x` and compares its outputs with `flow_step` run eagerly.
    fn check(
        &mut self,
        rt: &Runtime,
        graph: &mut FlowStepGraph<'_>,
        weights: &FlowWeights,
        x: &[f32],
        at: &str,
    ) -> Result<(), String> {
        let s = rt.stream();
        let out = graph.replay(x).map_err(words)?;
        let got = [out.h, out.z, out.y].map(|o| s.clone_dtoh(o).map_err(|e| e.to_string()));
        let xd = s.clone_htod(x).map_err(|e| e.to_string())?;
        let [h, z, y] = &mut self.0;
        flow_step(rt, &xd, &weights.w, &weights.b, h, z, y).map_err(words)?;
        for ((name, got), want) in ["h", "z", "y"].iter().zip(got).zip(&self.0) {
            let want = s.clone_dtoh(want).map_err(|e| e.to_string())?;
            same(&format!("{at}: output `{name}`"), &got?, &want)?;
        }
        Ok(())
    }
}

/// Pairs: while × verify, if × verify, unrolled × verify, fork × verify, early × verify, verify × nested, verify × debugchecks, fork × debugchecks, early × debugchecks, debugchecks × nested, plain × nested, devstate-ro × nested, while × nested, if × nested, unrolled × nested, fork × nested, early × nested.
/// A graph with `verify = "every"` and `check_determinism = true` whose body calls two
/// `#[cuda_graph]` functions: one with an early-launched layer, a `graph_while` and a
/// `graph_if`, one with a fork and a `graph_while_unrolled`. The determinism check ran, the
/// capture kept the early launch's programmatic edge (sm_90+), and over 6 replays with fresh
/// inputs (each verified by the graph itself, trip counts changing) every output equals the
/// eager function's bitwise; each called function also replays like eager as a graph of its
/// own.
#[gpu_test]
fn verify_every_through_nested_loops_branches_forks_and_early_launch(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "verify_every_through_nested_loops_branches_forks_and_early_launch";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let weights = FlowWeights::new(&rt, &mut rng)?;
    let n = FLOW_ROWS * FLOW_OUT;
    let mut graph =
        FlowStepGraph::capture(&rt, &flow_input(&mut rng), &weights.w, &weights.b, n, n, n)?;
    assert_checked(graph.info(), test);
    assert!(
        graph.info().kinds.conditionals >= 3,
        "a WHILE, an IF and an unrolled WHILE node: {:?}",
        graph.info()
    );
    if rt.compute_capability() >= (9, 0) {
        assert!(
            graph.info().early_edges >= 1,
            "the early launch is a programmatic edge: {:?}",
            graph.info()
        );
    }
    let mut eager = EagerFlow::new(&rt)?;
    let mut trips = Vec::new();
    for replay in 1..=6 {
        // Inputs that loop and inputs that do not, in turn (drawn until one does).
        let looping = replay % 2 == 0;
        let x = (0..1000)
            .map(|_| flow_input(&mut rng))
            .find(|x| (halvings(weights.first_before_loop(x)) > 0) == looping)
            .unwrap_or_else(|| flow_input(&mut rng));
        eager
            .check(&rt, &mut graph, &weights, &x, &format!("replay {replay}"))
            .map_err(fail)?;
        trips.push(halvings(weights.first_before_loop(&x)));
    }
    trips.sort_unstable();
    trips.dedup();
    assert!(
        trips.len() >= 2,
        "the first loop's trip counts varied: {trips:?}"
    );
    // Each called function is a graph of its own too, and replays like eager.
    let mut first =
        EarlyLoopBranchGraph::capture(&rt, &flow_input(&mut rng), &weights.w, &weights.b, n)?;
    let mut second = ForkedUnrolledGraph::capture(&rt, &random_vec(&mut rng, n), n, n)?;
    let (mut eh, mut ez, mut ey) = (
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
    );
    for replay in 1..=4 {
        let x = flow_input(&mut rng);
        let gh = s.clone_dtoh(first.replay(&x)?.h)?;
        early_loop_branch(&rt, &s.clone_htod(&x)?, &weights.w, &weights.b, &mut eh)?;
        let eh_host = s.clone_dtoh(&eh)?;
        same(
            &format!("early_loop_branch, replay {replay}: output `h`"),
            &gh,
            &eh_host,
        )
        .map_err(fail)?;
        let out = second.replay(&eh_host)?;
        let (gz, gy) = (s.clone_dtoh(out.z)?, s.clone_dtoh(out.y)?);
        forked_unrolled(&rt, &eh, &mut ez, &mut ey)?;
        same(
            &format!("forked_unrolled, replay {replay}: output `z`"),
            &gz,
            &s.clone_dtoh(&ez)?,
        )
        .map_err(fail)?;
        same(
            &format!("forked_unrolled, replay {replay}: output `y`"),
            &gy,
            &s.clone_dtoh(&ey)?,
        )
        .map_err(fail)?;
    }
    Ok(())
}

// ---- G23: the debug checks asserted ----

/// The planted bugs below: host values the bodies read through helpers the compile-time
/// checks cannot see into, frozen into each graph at capture. One per test.
static FORK_RATE: AtomicU32 = AtomicU32::new(0);
static ROWS_RATE: AtomicU32 = AtomicU32::new(0);

/// 0.5 while `step` is 0, 0.25 after.
fn rate(step: &AtomicU32) -> f32 {
    if step.load(Ordering::Relaxed) == 0 {
        0.5
    } else {
        0.25
    }
}

fn fork_rate() -> f32 {
    rate(&FORK_RATE)
}

fn rows_rate() -> f32 {
    rate(&ROWS_RATE)
}

/// `noise = uniform(-1, 1)` from `g`; `y = x + 0.5` on a fork's side stream while
/// `acc += noise` on the runtime's stream; `y = (y + noise) · rate`, the rate read from the
/// host (the planted bug). The default verify schedule; the determinism check in every build.
#[cuda_graph(warmup = 2, check_determinism = true)]
fn planted_fork_noise(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] g: &Generator,
    #[state] acc: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    g.uniform(rt, &mut *noise, -1.0, 1.0)?;
    rt.fork(|side| {
        add_scalar_side(side, rt, side.read(x), side.write(&mut *y), 0.5)?;
        accumulate_rows(rt, &mut *acc, &*noise)
    })?;
    add_inplace(rt, &mut *y, &*noise)?;
    scale_or_shift(rt, &mut *y, fork_rate(), false)
}

/// `noisy_rows` scaled by a rate read from the host (the planted bug), as a lazy family with
/// the default verify schedule and the determinism check in every build.
#[cuda_graph(
    warmup = 2,
    buckets(batch = [1, 2, 4], lazy = 2),
    check_determinism = true
)]
fn planted_rows_lazy(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] g: &Generator,
    #[state] calls: &mut CudaSlice<u32>,
    #[state] acc: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    noisy_rows_body(rt, x, g, calls, acc, y)?;
    scale_or_shift(rt, y, rows_rate(), false)
}

/// A replay that ran with the rate frozen at 0.5 while eager ran with 0.25: in a debug build
/// the default schedule verified it and reports output `y` at `replay` (of `bucket`), in a
/// release build nothing was verified and `y` is twice eager's, bit for bit.
fn assert_frozen_rate(
    replayed: Result<Vec<f32>, GraphError>,
    eager_y: &[f32],
    graph: &str,
    replay: u64,
    bucket: Option<usize>,
) {
    if cfg!(debug_assertions) {
        let err = replayed.expect_err("a debug build verifies this replay and catches the rate");
        let text = err.to_string();
        let GraphError::VerifyMismatch { graph: g, report } = &err else {
            panic!("{graph}: a verify mismatch at replay {replay}, got {err:?}");
        };
        assert_eq!(*g, graph, "{text}");
        assert_eq!(report.replay, Some(replay), "{text}");
        assert_eq!(report.bucket, bucket, "{text}");
        assert!(text.contains("output `y`"), "{text}");
    } else {
        let got = replayed.expect("a release build verifies nothing unless asked");
        let doubled: Vec<f32> = eager_y.iter().map(|v| 2.0 * v).collect();
        assert_eq!(
            got, doubled,
            "{graph}: the frozen rate, unnoticed in release"
        );
    }
}

/// Pairs: fork × debugchecks, rng × debugchecks, devstate-rw × debugchecks, family-lazy × debugchecks.
/// The debug checks asserted, not implied: a graph that forks, draws and updates `&mut` state
/// and a lazy family that draws and updates `&mut` state, both with `check_determinism = true`
/// (the check ran, for every bucket captured) and the default verify schedule, each with a
/// host value frozen at capture. Replays with fresh inputs equal eager (rows, state,
/// generator); once the host value changes, a debug build's default schedule reports the next
/// verified replay (replay 4 of the graph, of bucket 4), and a release build replays the stale
/// value unnoticed; the state and the generator stay equal to eager's through it.
#[gpu_test]
fn debug_checks_run_on_forks_generators_mut_state_and_lazy_families(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "debug_checks_run_on_forks_generators_mut_state_and_lazy_families";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();

    // A single graph: fork, generator, `&mut` state.
    let n = 777;
    FORK_RATE.store(0, Ordering::Relaxed);
    let seed: u64 = rng.random();
    let (g, twin) = (rt.generator(seed)?, rt.generator(seed)?);
    let acc0 = random_vec(&mut rng, n);
    let (mut acc, mut e_acc) = (s.clone_htod(&acc0)?, s.clone_htod(&acc0)?);
    let mut graph =
        PlantedForkNoiseGraph::capture(&rt, &random_vec(&mut rng, n), &g, &mut acc, n, n)?;
    assert_checked(graph.info(), "planted_fork_noise");
    let (mut e_noise, mut e_y) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    for replay in 1..=6u64 {
        if replay == 4 {
            FORK_RATE.store(1, Ordering::Relaxed);
        }
        let x = random_vec(&mut rng, n);
        let replayed = graph.replay(&x).and_then(|out| Ok(s.clone_dtoh(out.y)?));
        planted_fork_noise(
            &rt,
            &s.clone_htod(&x)?,
            &twin,
            &mut e_acc,
            &mut e_noise,
            &mut e_y,
        )?;
        let at = format!("planted_fork_noise, replay {replay}");
        let eager_y = s.clone_dtoh(&e_y)?;
        if replay == 4 {
            assert_frozen_rate(replayed, &eager_y, "planted_fork_noise", 4, None);
            FORK_RATE.store(0, Ordering::Relaxed);
        } else {
            same(&format!("{at}: output `y`"), &replayed?, &eager_y).map_err(fail)?;
            same(
                &format!("{at}: output `noise`"),
                &s.clone_dtoh(graph.outputs().noise)?,
                &s.clone_dtoh(&e_noise)?,
            )
            .map_err(fail)?;
        }
        same(
            &format!("{at}: state `acc`"),
            &s.clone_dtoh(&graph.state_mut().acc)?,
            &s.clone_dtoh(&e_acc)?,
        )
        .map_err(fail)?;
        same_generator(&rt, &at, &g, &twin).map_err(fail)?;
    }

    // A lazy family: generator, `&mut` state, buckets captured on replays.
    ROWS_RATE.store(0, Ordering::Relaxed);
    let seed: u64 = rng.random();
    let rows_g = rt.generator(seed)?;
    let acc0 = random_vec(&mut rng, ROW);
    let (mut calls, mut acc) = (s.clone_htod(&[0u32])?, s.clone_htod(&acc0)?);
    let mut eager = EagerRows::new(
        &rt,
        planted_rows_lazy,
        PlantedRowsLazyBuckets::BUCKETS,
        &rows_g,
        &calls,
        &acc,
    )?;
    let mut family = PlantedRowsLazyBuckets::capture(&rt, ROW, &rows_g, &mut calls, &mut acc, ROW)?;
    // Bucket 4 replays at steps 0, 2, 4 and 5 (its 4th replay, verified in debug builds);
    // steps 6 and 7 capture buckets 1 and 2 again (evicted at steps 3 and 6).
    for (step, batch) in [3usize, 1, 4, 2, 3, 4, 1, 2].into_iter().enumerate() {
        let x = random_vec(&mut rng, batch * ROW);
        let at = format!("planted_rows_lazy, step {step}");
        if step == 5 {
            ROWS_RATE.store(1, Ordering::Relaxed);
            let replayed = family.replay(&x).and_then(|out| Ok(s.clone_dtoh(&out.y)?));
            // The eager side keeps in step (the rate changes `y` alone); the family's state and
            // generator are where one replay leaves them.
            let bucket = bucket_for(PlantedRowsLazyBuckets::BUCKETS, batch);
            let xd = s.clone_htod(&padded(&x, bucket, ROW))?;
            let mut y = s.alloc_zeros::<f32>(bucket * ROW)?;
            planted_rows_lazy(
                &rt,
                &xd,
                &eager.twin,
                &mut eager.calls,
                &mut eager.acc,
                &mut y,
                bucket,
            )?;
            let eager_y = s.clone_dtoh(&y)?[..batch * ROW].to_vec();
            assert_frozen_rate(replayed, &eager_y, "planted_rows_lazy", 4, Some(4));
            ROWS_RATE.store(0, Ordering::Relaxed);
            let st = family.state_mut();
            same(
                &format!("{at}: state `calls`"),
                &s.clone_dtoh(&st.calls)?,
                &s.clone_dtoh(&eager.calls)?,
            )
            .map_err(fail)?;
            same(
                &format!("{at}: state `acc`"),
                &s.clone_dtoh(&st.acc)?,
                &s.clone_dtoh(&eager.acc)?,
            )
            .map_err(fail)?;
            same_generator(&rt, &at, &rows_g, &eager.twin).map_err(fail)?;
        } else {
            let seen = replay_rows!(rt, family, x.as_slice())?;
            eager.check(&rt, &rows_g, &x, seen, &at).map_err(fail)?;
        }
        for g in family.buckets().graphs() {
            assert_checked(g.info(), &at);
        }
    }
    let stats = family.buckets().stats();
    assert!(
        stats
            .buckets
            .iter()
            .all(|b| b.captures >= 2 || b.bucket == 4),
        "buckets 1 and 2 captured again:\n{stats}"
    );
    Ok(())
}

// ---- G2 and G25: forks from threads, shared and own runtimes at once ----

/// `a = x + 1` on a fork's side stream while `b = x · x` on the runtime's stream; then
/// `c = a · b`.
#[cuda_graph(warmup = 2)]
fn forked_pair(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    b: &mut CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    forked_pair_body(rt, x, a, b, c)
}

fn forked_pair_body(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    b: &mut CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|side| {
        add_scalar_side(side, rt, side.read(x), side.write(&mut *a), 1.0)?;
        mul_into(rt, x, x, &mut *b)
    })?;
    mul_into(rt, a, b, c)
}

/// A `forked_pair` graph with its eager side.
struct ForkedPair<'a> {
    graph: ForkedPairGraph<'a>,
    n: usize,
    eager: [CudaSlice<f32>; 3],
}

impl ForkedPair<'_> {
    fn capture(rt: &Runtime, rng: &mut SmallRng, n: usize) -> Result<Self, GraphError> {
        let s = rt.stream();
        Ok(ForkedPair {
            graph: ForkedPairGraph::capture(rt, &random_vec(rng, n), n, n, n)?,
            n,
            eager: [s.alloc_zeros(n)?, s.alloc_zeros(n)?, s.alloc_zeros(n)?],
        })
    }

    /// One replay on fresh inputs against `forked_pair` run eagerly, every output bitwise.
    fn check(&mut self, rt: &Runtime, rng: &mut SmallRng, at: &str) -> Result<(), String> {
        let s = rt.stream();
        let x = random_vec(rng, self.n);
        let out = self.graph.replay(&x).map_err(words)?;
        let got = [out.a, out.b, out.c].map(|o| s.clone_dtoh(o).map_err(|e| e.to_string()));
        let xd = s.clone_htod(&x).map_err(|e| e.to_string())?;
        let [a, b, c] = &mut self.eager;
        forked_pair(rt, &xd, a, b, c).map_err(words)?;
        for ((name, got), want) in ["a", "b", "c"].iter().zip(got).zip(&self.eager) {
            let want = s.clone_dtoh(want).map_err(|e| e.to_string())?;
            same(
                &format!("{at} (n {}): output `{name}`", self.n),
                &got?,
                &want,
            )?;
        }
        Ok(())
    }
}

/// One thread of the fork test: two fork graphs captured at once with the other threads,
/// replayed in random order against eager, one dropped and another captured halfway, the
/// rest dropped in random order. Returns the replays checked.
fn forks_on_one_thread(rt: &Runtime, seed: u64, start: &Barrier) -> Result<usize, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    start.wait();
    let mut graphs = Vec::new();
    for _ in 0..2 {
        let n = rng.random_range(256..4096);
        graphs.push(ForkedPair::capture(rt, &mut rng, n).map_err(words)?);
    }
    let mut replays = 0;
    for step in 0..16 {
        if step == 8 {
            let k = rng.random_range(0..graphs.len());
            drop(graphs.swap_remove(k));
            let n = rng.random_range(256..4096);
            graphs.push(ForkedPair::capture(rt, &mut rng, n).map_err(words)?);
        }
        let k = rng.random_range(0..graphs.len());
        graphs[k].check(rt, &mut rng, &format!("step {step}, graph {k}"))?;
        replays += 1;
    }
    while !graphs.is_empty() {
        let k = rng.random_range(0..graphs.len());
        drop(graphs.swap_remove(k));
    }
    Ok(replays)
}

/// Pairs: fork × rt-shared, fork × rt-per-thread, fork × drops, rt-per-thread × rt-shared.
/// Four threads at once, two sharing the test's runtime and two with a runtime each: each
/// captures fork graphs while the others capture, replay and fork eagerly, replays them 16
/// times on fresh inputs against the eager function (all three outputs bitwise), drops one and
/// captures another halfway, and drops the rest in random order.
#[gpu_test]
fn forks_from_threads_sharing_a_runtime_and_with_their_own(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("forks_from_threads_sharing_a_runtime_and_with_their_own");
    let seeds: Vec<u64> = (0..4).map(|_| rng.random()).collect();
    let start = Barrier::new(4);
    let results: Vec<Result<usize, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = seeds
            .iter()
            .enumerate()
            .map(|(t, &seed)| {
                let (rt, start) = (&rt, &start);
                scope.spawn(move || {
                    let shared = t < 2;
                    let run = if shared {
                        forks_on_one_thread(rt, seed, start)
                    } else {
                        match Runtime::new(0) {
                            Ok(own) => forks_on_one_thread(&own, seed, start),
                            Err(e) => {
                                start.wait();
                                Err(e.to_string())
                            }
                        }
                    };
                    run.map_err(|e| {
                        format!("thread {t} (shared runtime: {shared}, seed {seed}): {e}")
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failures.is_empty(), "{failures:#?}");
    Ok(())
}

/// The handshake of the test below: the capturing thread says it records the body's first
/// capture (`recording`), then waits (at most 2 s) until the other thread is inside its fork
/// (`held`).
struct Handshake {
    recording: Sender<()>,
    held: Receiver<()>,
}

static HANDSHAKE: Mutex<Option<Handshake>> = Mutex::new(None);

/// Called by `forked_when_recorded` while it is recorded: the first time, the handshake.
fn when_first_recorded() {
    let handshake = HANDSHAKE.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(h) = handshake {
        let _ = h.recording.send(());
        let _ = h.held.recv_timeout(Duration::from_secs(2));
    }
}

/// `forked_pair`, which waits at its first recording for another thread to fork.
#[cuda_graph(warmup = 1)]
fn forked_when_recorded(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    b: &mut CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    if is_capturing() {
        when_first_recorded();
    }
    forked_pair_body(rt, x, a, b, c)
}

/// Pairs: fork × rt-shared.
/// The timing that threads sharing a runtime meet by chance, made certain: a capture whose
/// body forks records while another thread of the same runtime is inside an eager fork (which
/// took the side stream the capture's warmup made and gave back). Documented: forks from two
/// threads get different side streams, and a capture reuses the side streams its warmup made.
/// The capture must succeed, and the graph replay 4 fresh inputs like eager.
#[gpu_test]
fn a_capture_forks_while_another_thread_forks_on_the_shared_runtime(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_capture_forks_while_another_thread_forks_on_the_shared_runtime");
    let n = 2048;
    let (recording_tx, recording_rx) = channel();
    let (held_tx, held_rx) = channel();
    *HANDSHAKE.lock().unwrap_or_else(|p| p.into_inner()) = Some(Handshake {
        recording: recording_tx,
        held: held_rx,
    });
    let captured = AtomicBool::new(false);
    let x0 = random_vec(&mut rng, n);
    let (graph, other) = std::thread::scope(|scope| {
        let (shared, done) = (&rt, &captured);
        let other = scope.spawn(move || -> Result<(), GraphError> {
            recording_rx
                .recv_timeout(Duration::from_secs(10))
                .map_err(|e| fail(format!("the capture never began recording: {e}")))?;
            shared.fork(|_side| {
                let _ = held_tx.send(());
                let until = Instant::now() + Duration::from_secs(2);
                while !done.load(Ordering::Acquire) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            })
        });
        let graph = ForkedWhenRecordedGraph::capture(&rt, &x0, n, n, n);
        captured.store(true, Ordering::Release);
        // A capture that never recorded leaves the handshake: dropped, the other thread stops
        // waiting for it.
        HANDSHAKE.lock().unwrap_or_else(|p| p.into_inner()).take();
        (graph, other.join())
    });
    let mut graph = graph.map_err(|e| {
        fail(format!(
            "a capture that forks while another thread forks on the shared runtime: {e}"
        ))
    })?;
    other.map_err(|_| fail("the forking thread panicked".into()))??;
    let s = rt.stream().clone();
    let mut eager = [
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
    ];
    for replay in 1..=4 {
        let x = random_vec(&mut rng, n);
        let out = graph.replay(&x)?;
        let got = [
            s.clone_dtoh(out.a)?,
            s.clone_dtoh(out.b)?,
            s.clone_dtoh(out.c)?,
        ];
        let [a, b, c] = &mut eager;
        forked_pair(&rt, &s.clone_htod(&x)?, a, b, c)?;
        for ((name, got), want) in ["a", "b", "c"].iter().zip(&got).zip(&eager) {
            same(
                &format!("replay {replay}: output `{name}`"),
                got,
                &s.clone_dtoh(want)?,
            )
            .map_err(fail)?;
        }
    }
    Ok(())
}

// ---- G16 and G25: seeded programs of threads, shared and own runtimes at once ----

/// One captured graph of a program, with its eager side.
trait Piece {
    /// Which piece, in failures.
    fn name(&self) -> &'static str;
    /// Replays the graph on fresh inputs and compares it with its eager side.
    fn replay_and_check(
        &mut self,
        rt: &Runtime,
        rng: &mut SmallRng,
        at: &str,
    ) -> Result<(), String>;
}

/// A `noisy_rows` family of either kind.
enum RowsFamily<'a> {
    UpFront(NoisyRowsBuckets<'a>),
    Lazy(NoisyRowsLazyBuckets<'a>),
}

/// A `noisy_rows` family, its generator and its eager side.
struct FamilyPiece<'a> {
    family: RowsFamily<'a>,
    g: &'a Generator,
    eager: EagerRows,
}

impl Piece for FamilyPiece<'_> {
    fn name(&self) -> &'static str {
        match self.family {
            RowsFamily::UpFront(_) => "noisy_rows family",
            RowsFamily::Lazy(_) => "noisy_rows_lazy family",
        }
    }

    fn replay_and_check(
        &mut self,
        rt: &Runtime,
        rng: &mut SmallRng,
        at: &str,
    ) -> Result<(), String> {
        let batch = rng.random_range(1..=4);
        let x = random_vec(rng, batch * ROW);
        let seen = match &mut self.family {
            RowsFamily::UpFront(f) => replay_rows!(rt, f, x.as_slice()),
            RowsFamily::Lazy(f) => replay_rows!(rt, f, x.as_slice()),
        }
        .map_err(words)?;
        self.eager.check(rt, self.g, &x, seen, at)
    }
}

/// A `flow_step` graph (verified replays of early launch, loops, a branch, a fork and
/// nested calls) and its eager side.
struct FlowPiece<'a> {
    graph: FlowStepGraph<'a>,
    weights: &'a FlowWeights,
    eager: EagerFlow,
}

impl Piece for FlowPiece<'_> {
    fn name(&self) -> &'static str {
        "flow_step"
    }

    fn replay_and_check(
        &mut self,
        rt: &Runtime,
        rng: &mut SmallRng,
        at: &str,
    ) -> Result<(), String> {
        let x = flow_input(rng);
        self.eager.check(rt, &mut self.graph, self.weights, &x, at)
    }
}

impl Piece for ForkedPair<'_> {
    fn name(&self) -> &'static str {
        "forked_pair"
    }

    fn replay_and_check(
        &mut self,
        rt: &Runtime,
        rng: &mut SmallRng,
        at: &str,
    ) -> Result<(), String> {
        self.check(rt, rng, at)
    }
}

/// The state a family of a program borrows: a generator and two `&mut` buffers.
struct RowsState {
    g: Generator,
    calls: CudaSlice<u32>,
    acc: CudaSlice<f32>,
}

/// What one thread of a program owns for its pieces to borrow: three families' state and the
/// weights of its `flow_step` graphs.
struct Arena {
    rows: Vec<RowsState>,
    flow: FlowWeights,
}

impl Arena {
    fn new(rt: &Runtime, rng: &mut SmallRng) -> Result<Self, GraphError> {
        let s = rt.stream();
        let rows = (0..3)
            .map(|_| {
                Ok(RowsState {
                    g: rt.generator(rng.random())?,
                    calls: s.clone_htod(&[rng.random_range(0..100u32)])?,
                    acc: s.clone_htod(&random_vec(rng, ROW))?,
                })
            })
            .collect::<Result<Vec<_>, GraphError>>()?;
        Ok(Arena {
            rows,
            flow: FlowWeights::new(rt, rng)?,
        })
    }
}

/// The kinds of piece; every thread captures one of each first.
#[derive(Clone, Copy, Debug)]
enum Kind {
    FamilyUpFront,
    FamilyLazy,
    Flow,
    Fork,
}

const KINDS: [Kind; 4] = [
    Kind::FamilyUpFront,
    Kind::FamilyLazy,
    Kind::Flow,
    Kind::Fork,
];

/// Captures a piece of `kind`, a family borrowing the next state of `rows` (none when they
/// are all taken).
fn capture_piece<'a>(
    rt: &Runtime,
    rng: &mut SmallRng,
    kind: Kind,
    rows: &mut std::slice::IterMut<'a, RowsState>,
    flow: &'a FlowWeights,
) -> Result<Option<Box<dyn Piece + 'a>>, GraphError> {
    Ok(Some(match kind {
        Kind::FamilyUpFront | Kind::FamilyLazy => {
            let Some(RowsState { g, calls, acc }) = rows.next() else {
                return Ok(None);
            };
            let g: &'a Generator = g;
            let up_front = matches!(kind, Kind::FamilyUpFront);
            let (f, buckets): (RowsFn, &'static [usize]) = if up_front {
                (noisy_rows, NoisyRowsBuckets::BUCKETS)
            } else {
                (noisy_rows_lazy, NoisyRowsLazyBuckets::BUCKETS)
            };
            let eager = EagerRows::new(rt, f, buckets, g, calls, acc)?;
            let family = if up_front {
                RowsFamily::UpFront(NoisyRowsBuckets::capture(rt, ROW, g, calls, acc, ROW)?)
            } else {
                RowsFamily::Lazy(NoisyRowsLazyBuckets::capture(rt, ROW, g, calls, acc, ROW)?)
            };
            Box::new(FamilyPiece { family, g, eager })
        }
        Kind::Flow => {
            let n = FLOW_ROWS * FLOW_OUT;
            Box::new(FlowPiece {
                graph: FlowStepGraph::capture(rt, &flow_input(rng), &flow.w, &flow.b, n, n, n)?,
                weights: flow,
                eager: EagerFlow::new(rt)?,
            })
        }
        Kind::Fork => {
            let n = rng.random_range(256..4096);
            Box::new(ForkedPair::capture(rt, rng, n)?)
        }
    }))
}

/// Captures a piece of `kind` into `pieces` (nothing for a family once `rows` are all taken).
fn capture_into<'a>(
    rt: &Runtime,
    rng: &mut SmallRng,
    kind: Kind,
    rows: &mut std::slice::IterMut<'a, RowsState>,
    flow: &'a FlowWeights,
    pieces: &mut Vec<Box<dyn Piece + 'a>>,
    tally: &mut Tally,
) -> Result<(), String> {
    if let Some(p) = capture_piece(rt, rng, kind, rows, flow)
        .map_err(|e| format!("capturing a {kind:?} piece: {e}"))?
    {
        pieces.push(p);
        tally.captures += 1;
    }
    Ok(())
}

/// Counts of a program's thread.
#[derive(Default, Debug)]
struct Tally {
    captures: usize,
    replays: usize,
    drops: usize,
}

/// One thread of a program: an arena, one piece of every kind captured (once every thread of
/// the program is there) and replayed 4 times against eager, then `steps` random replays,
/// drops and captures, the rest dropped in random order.
fn program_thread(rt: &Runtime, seed: u64, steps: usize, start: &Barrier) -> Result<Tally, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let mut arena = Arena::new(rt, &mut rng).map_err(words);
    start.wait();
    let arena = arena.as_mut().map_err(|e| format!("arena: {e}"))?;
    let mut rows = arena.rows.iter_mut();
    let flow = &arena.flow;
    let mut pieces: Vec<Box<dyn Piece + '_>> = Vec::new();
    for kind in KINDS {
        capture_into(rt, &mut rng, kind, &mut rows, flow, &mut pieces, &mut tally)?;
    }
    // Every kind replayed 4 times on fresh inputs, whatever the random steps draw.
    for round in 0..4 {
        for (k, piece) in pieces.iter_mut().enumerate() {
            let at = format!("round {round}, piece {k}, {}", piece.name());
            piece.replay_and_check(rt, &mut rng, &at)?;
            tally.replays += 1;
        }
    }
    for step in 0..steps {
        match rng.random_range(0..16) {
            0 if !pieces.is_empty() => {
                let k = rng.random_range(0..pieces.len());
                drop(pieces.swap_remove(k));
                tally.drops += 1;
            }
            1 => {
                let kind = KINDS[rng.random_range(0..KINDS.len())];
                capture_into(rt, &mut rng, kind, &mut rows, flow, &mut pieces, &mut tally)?;
            }
            _ if !pieces.is_empty() => {
                let k = rng.random_range(0..pieces.len());
                let at = format!("step {step}, {}", pieces[k].name());
                pieces[k].replay_and_check(rt, &mut rng, &at)?;
                tally.replays += 1;
            }
            _ => {}
        }
    }
    while !pieces.is_empty() {
        let k = rng.random_range(0..pieces.len());
        drop(pieces.swap_remove(k));
        tally.drops += 1;
    }
    Ok(tally)
}

/// Runs one program: `shared[t]` says whether thread `t` uses `rt` or a runtime of its own.
fn run_program(
    rt: &Runtime,
    shared: &[bool],
    seeds: &[u64],
    steps: usize,
) -> Vec<Result<Tally, String>> {
    let start = Barrier::new(shared.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = shared
            .iter()
            .zip(seeds)
            .enumerate()
            .map(|(t, (&on_shared, &seed))| {
                let start = &start;
                scope.spawn(move || {
                    let run = if on_shared {
                        program_thread(rt, seed, steps, start)
                    } else {
                        match Runtime::new(0) {
                            Ok(own) => program_thread(&own, seed, steps, start),
                            Err(e) => {
                                start.wait();
                                Err(format!("its own runtime: {e}"))
                            }
                        }
                    };
                    run.map_err(|e| format!("thread {t} (shared runtime: {on_shared}): {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    })
}

/// Pairs: family-eager × rt-per-thread, family-eager × rt-shared, family-eager × drops, family-lazy × rt-per-thread, family-lazy × rt-shared, family-lazy × drops, while × rt-per-thread, while × rt-shared, while × drops, if × rt-per-thread, if × rt-shared, if × drops, verify × rt-per-thread, verify × rt-shared, verify × drops, early × rt-per-thread, early × rt-shared, early × drops, nested × rt-per-thread, nested × rt-shared, nested × drops, fork × rt-per-thread, fork × rt-shared, fork × drops, rt-per-thread × rt-shared.
/// Seeded random programs of two to four threads at once, at least one sharing the test's
/// runtime and one with a runtime of its own in every program (the first: two and two). Every
/// thread captures a family of each kind (generator and `&mut` state), a `flow_step` graph
/// (verified replays of an early launch, loops, a branch, a fork and nested calls) and a fork
/// graph, replays each 4 times, then random pieces, on fresh inputs against eager (rows, state,
/// generator offsets, every output bitwise), captures and drops more, and drops the rest in
/// random order. At the end the device's free memory is back where it was after a first, settling
/// program (within 16 MiB). `CUDA_GRAPH_PAIRS_PROGRAMS` (default 6) and
/// `CUDA_GRAPH_PAIRS_SEED` (default: the clock) steer it; the seed is printed first and named
/// in every failure.
#[gpu_test]
fn torture_programs_of_families_flows_and_forks_on_shared_and_own_runtimes(
    rt: Runtime,
) -> Result<(), GraphError> {
    let seed: u64 = std::env::var("CUDA_GRAPH_PAIRS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fresh_rng("pairs torture").random());
    let programs: usize = std::env::var("CUDA_GRAPH_PAIRS_PROGRAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    eprintln!(
        "pairs torture: seed {seed} (CUDA_GRAPH_PAIRS_SEED={seed} repeats this run), {programs} programs"
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    let fold = |results: Vec<Result<Tally, String>>,
                total: &mut Tally,
                at: &str|
     -> Result<(), GraphError> {
        for r in results {
            let t = r.map_err(|e| fail(format!("seed {seed}, {at}: {e}")))?;
            total.captures += t.captures;
            total.replays += t.replays;
            total.drops += t.drops;
        }
        Ok(())
    };
    // A first program settles what the process and the shared runtime keep (compiled and
    // loaded kernels, side streams).
    let mut total = Tally::default();
    let settle: Vec<u64> = (0..4).map(|k| seed ^ (0x5eed + k)).collect();
    fold(
        run_program(&rt, &[true, true, false, false], &settle, 12),
        &mut total,
        "settling program",
    )?;
    rt.synchronize()?;
    rt.trim_graph_memory()?;
    let (free_before, _) = rt.mem_info()?;
    let started = Instant::now();
    let mut total = Tally::default();
    for program in 0..programs {
        let shared: Vec<bool> = if program == 0 {
            vec![true, true, false, false]
        } else {
            let threads = rng.random_range(2..=4usize);
            let mut s: Vec<bool> = (0..threads).map(|_| rng.random_bool(0.5)).collect();
            // At least one thread of each kind, at once.
            s[0] = true;
            s[threads - 1] = false;
            s
        };
        let seeds: Vec<u64> = shared.iter().map(|_| rng.random()).collect();
        let steps = rng.random_range(16..40);
        let at = format!("program {program} (shared runtime per thread: {shared:?})");
        fold(run_program(&rt, &shared, &seeds, steps), &mut total, &at)?;
    }
    rt.synchronize()?;
    rt.trim_graph_memory()?;
    let (free_after, _) = rt.mem_info()?;
    eprintln!(
        "pairs torture: seed {seed}: {programs} programs, {} captures, {} replays equal to eager, {} drops in {:.1} s; free memory {} MiB before, {} MiB after",
        total.captures,
        total.replays,
        total.drops,
        started.elapsed().as_secs_f64(),
        free_before / MIB,
        free_after / MIB
    );
    assert!(
        free_after + 16 * MIB >= free_before,
        "seed {seed}: free memory {} MiB after the programs, {} MiB before",
        free_after / MIB,
        free_before / MIB
    );
    assert!(
        total.replays > 0 && total.captures >= 4 * programs,
        "seed {seed}: {total:?}"
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
