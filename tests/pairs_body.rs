//! Pairs of body features (issue 31, the pairwise composition table): each test writes several
//! features into one `#[cuda_graph]` body the way a user combines them and replays it against
//! eager calls of the same function (a separate copy of every `&mut` state, a twin generator
//! of the same seed) on fresh random inputs, inputs changed between replays, comparing every
//! output bitwise, `state_mut()` after each replay and the generators' `seed_and_offset`:
//!
//! * graph-safe random draws and cuBLAS GEMMs on both sides of an eager island (the warmup's
//!   draws undone across the segments);
//! * `#[state]` buffers, read-only and written, inside `graph_while`, `graph_while_unrolled`
//!   and `graph_if` bodies, and random draws inside a `graph_if` (the generator advances only
//!   when the branch runs);
//! * cuBLAS GEMMs inside `graph_while`, `graph_while_unrolled` and `graph_if` bodies;
//! * early launches (`linear_bias_gelu`, launched early) next to a fork, a GEMM, a draw, an
//!   island, inside loops and a branch and in a called graph function, against the same graph
//!   launched in order;
//! * a body calling other `#[cuda_graph]` functions (two levels deep) that draw, loop, branch,
//!   unroll, fork, multiply with cuBLAS and write state;
//! * a training-like step: GEMMs, dropout inside a fork whose side branch reads and writes
//!   state, a weight update;
//! * `graph_while_unrolled` inside a `graph_while`, with a `graph_if` in every step;
//!
//! and the refusals, each with the runtime usable afterwards: an island of a called graph
//! function inside a `graph_if`, an unrolled loop or a fork (`IslandMisuse`; islands written
//! there are compile errors, `ui-tests/tests/fail/island-in-*.rs`); a `graph_if` or an
//! unrolled loop inside a fork (`ConditionMisuse`, eagerly too); a fork inside a `graph_if` or
//! an unrolled step (documented as not allowed in a conditional body); one branch condition for
//! every step of an unrolled loop (`ConditionMisuse` at capture).
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead. The tests whose names start with `refused_`
//! check error paths.

use std::time::Duration;

use graph_runtime::cudarc::driver::sys::CUstreamCaptureStatus;
use graph_runtime::cudarc::driver::{
    CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use graph_runtime::rng::reference_uniform_in;
use graph_runtime::{
    cuda_graph, phase, Compare, Condition, ForkedStream, Generator, GraphError, Phase, Runtime,
    SideMut, SideRef,
};
use rand::rngs::SmallRng;
use rand::Rng;
use workloads::ops::blas::{matmul, MatMul};
use workloads::ops::linear::linear_bias_gelu;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

/// The test's kernels, on the conditional device API. Kernels that take a `GraphCondition` and
/// return when it is not active change nothing in a step of `graph_while_unrolled` after the
/// one that stopped the loop.
const K: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
// y = a x + b.
extern "C" __global__ void affine(const float *x, float a, float b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

// y += b.
extern "C" __global__ void add_inplace(float *y, const float *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[i];
}

// y += a x.
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

// acc += b x.
extern "C" __global__ void fma_inplace(float *acc, const float *b, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += b[i] * x[i];
}

// y = a x (launched on a fork's side stream).
extern "C" __global__ void scale(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

// y = -y.
extern "C" __global__ void negate(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = -y[i];
}

// c = a - b.
extern "C" __global__ void sub_into(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] - b[i];
}

// w -= lr g.
extern "C" __global__ void sgd(float *w, const float *g, float lr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) w[i] -= lr * g[i];
}

// On a fork's side stream: ema = (ema + target * scale[column]) / 2, out = ema.
extern "C" __global__ void ema_side(const float *target, const float *scale, float *ema, float *out,
                                    int n, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float e = 0.5f * ema[i] + 0.5f * target[i] * scale[i % cols];
        ema[i] = e;
        out[i] = e;
    }
}

// One step of a decay loop: y *= decay, acc += y, iters += 1.
extern "C" __global__ void decay_step(float *y, const float *decay, float *acc, unsigned int *iters,
                                      int n, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = y[i] * decay[i];
        y[i] = v;
        acc[i] += v;
    }
    if (i == 0) iters[0] += 1u;
}

// One step of a contraction loop: y = t (the GEMM's result), iters += 1.
extern "C" __global__ void take_step(const float *t, float *y, unsigned int *iters, int n,
                                     GraphCondition go) {
    if (!graph_condition_active(go)) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = t[i];
    if (i == 0) iters[0] += 1u;
}

// y *= 0.5, iters += 1.
extern "C" __global__ void halve_count(float *y, int n, unsigned int *iters, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= 0.5f;
    if (i == 0) iters[0] += 1u;
}

// acc += u.
extern "C" __global__ void accumulate_guarded(float *acc, const float *u, int n, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += u[i];
}

// count += 1; go on while count < stop.
extern "C" __global__ void count_until(unsigned int *count, const unsigned int *stop, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    unsigned int c = *count + 1u;
    *count = c;
    graph_condition_set(go, c < *stop);
}

// A step of the inner (unrolled) loop of row i = ij[0]: j = ij[1] + 1, acc[i] += j, and the
// branch `odd` taken when j is odd; in a step after the loop stopped, nothing changes and the
// branch is not taken.
extern "C" __global__ void add_j(unsigned int *ij, float *acc, GraphCondition inner, GraphCondition odd) {
    bool live = graph_condition_active(inner);
    unsigned int j = ij[1] + 1u;
    if (live) {
        acc[ij[0]] += (float)j;
        ij[1] = j;
    }
    graph_condition_set(odd, live && (j & 1u) == 1u);
}

// The branch: acc[i] = -acc[i].
extern "C" __global__ void negate_row(const unsigned int *ij, float *acc) { acc[ij[0]] = -acc[ij[0]]; }

// The inner loop goes on while j < i + 1 (the last kernel of its step).
extern "C" __global__ void inner_next(const unsigned int *ij, GraphCondition inner) {
    graph_condition_set(inner, ij[1] < ij[0] + 1u);
}

// Outer loop step: i += 1; j = 0; again while i < rows.
extern "C" __global__ void outer_step(unsigned int *ij, const unsigned int *rows, GraphCondition outer) {
    unsigned int i = ij[0] + 1u;
    ij[0] = i;
    ij[1] = 0u;
    graph_condition_set(outer, i < *rows);
}
"#
);

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// One thread (`LaunchConfig::for_num_elems(1)` would be a block of 1024).
fn one() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `y = a · x + b` on the runtime's stream.
fn affine(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: f32,
    b: f32,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    assert!(y.len() >= x.len(), "affine: y is shorter than x");
    let n = x.len() as i32;
    let f = rt.function(K, "affine")?;
    // SAFETY: `affine` reads `n` floats of `x` and writes `n` of `y`, which holds at least `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&a)
            .arg(&b)
            .arg(y)
            .arg(&n)
            .launch(grid(x.len()))
    }?;
    Ok(())
}

/// `y += b`.
fn add_inplace(rt: &Runtime, y: &mut CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<(), GraphError> {
    assert_eq!(y.len(), b.len(), "add_inplace: lengths");
    let len = y.len();
    let n = len as i32;
    let f = rt.function(K, "add_inplace")?;
    // SAFETY: `add_inplace` reads and writes `n` floats of `y` and reads `n` of `b`; both hold `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(y)
            .arg(b)
            .arg(&n)
            .launch(grid(len))
    }?;
    Ok(())
}

/// `y += a · x`.
fn axpy(
    rt: &Runtime,
    y: &mut CudaSlice<f32>,
    x: &CudaSlice<f32>,
    a: f32,
) -> Result<(), GraphError> {
    assert_eq!(y.len(), x.len(), "axpy: lengths");
    let len = y.len();
    let n = len as i32;
    let f = rt.function(K, "axpy")?;
    // SAFETY: `axpy` reads and writes `n` floats of `y` and reads `n` of `x`; both hold `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(y)
            .arg(x)
            .arg(&a)
            .arg(&n)
            .launch(grid(len))
    }?;
    Ok(())
}

/// `y = -y`.
fn negate(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let len = y.len();
    let n = len as i32;
    let f = rt.function(K, "negate")?;
    // SAFETY: `negate` reads and writes `n` floats of `y`, which holds `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(y)
            .arg(&n)
            .launch(grid(len))
    }?;
    Ok(())
}

/// `y = a · x` on a fork's side stream.
fn scale_side<'f>(
    branch: &ForkedStream<'f, '_>,
    rt: &Runtime,
    x: SideRef<'f, f32>,
    y: SideMut<'f, f32>,
    a: f32,
) -> Result<(), GraphError> {
    assert!(y.len() >= x.len(), "scale_side: y is shorter than x");
    let n = x.len() as i32;
    let f = rt.function(K, "scale")?;
    // SAFETY: `scale` reads `n` floats of `x` and writes `n` of `y`; both hold at least `n`.
    unsafe {
        branch
            .launch_builder(&f)
            .buf(x)
            .buf_mut(y)
            .arg(a)
            .arg(n)
            .launch(grid(x.len()))
    }?;
    Ok(())
}

/// `count += 1`, and `go` is set to `count < stop[0]` (nothing in a step after the loop
/// stopped).
fn count_until(
    rt: &Runtime,
    count: &mut CudaSlice<u32>,
    stop: &CudaSlice<u32>,
    go: &Condition,
) -> Result<(), GraphError> {
    let f = rt.function(K, "count_until")?;
    let arg = go.kernel_arg(rt);
    // SAFETY: `count_until` updates one word of `count`, reads one of `stop` and sets `go`;
    // one thread.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(count)
            .arg(stop)
            .arg(&arg)
            .launch(one())
    }?;
    Ok(())
}

/// `acc += u` (nothing in a step after the loop stopped).
fn accumulate_guarded(
    rt: &Runtime,
    acc: &mut CudaSlice<f32>,
    u: &CudaSlice<f32>,
    go: &Condition,
) -> Result<(), GraphError> {
    assert_eq!(acc.len(), u.len(), "accumulate_guarded: lengths");
    let len = acc.len();
    let n = len as i32;
    let f = rt.function(K, "accumulate_guarded")?;
    let arg = go.kernel_arg(rt);
    // SAFETY: reads and writes `n` floats of `acc`, reads `n` of `u` (both hold `n`), reads `go`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(acc)
            .arg(u)
            .arg(&n)
            .arg(&arg)
            .launch(grid(len))
    }?;
    Ok(())
}

/// `len` values of `rng` uniform in `[-scale, scale)`.
fn scaled(rng: &mut SmallRng, len: usize, scale: f32) -> Vec<f32> {
    random_vec(rng, len)
        .into_iter()
        .map(|v| v * scale)
        .collect()
}

/// `len` positive values `1.5 + u` for `u` uniform in `[-1, 1)`, the first `first` of them
/// multiplied by one `exp(t)` for `t` uniform in `range` (so that loops halving or contracting
/// them until the first is at most 1 run a number of times that varies).
fn positive(rng: &mut SmallRng, len: usize, first: usize, range: std::ops::Range<f32>) -> Vec<f32> {
    let big = rng.random_range(range).exp();
    random_vec(rng, len)
        .into_iter()
        .enumerate()
        .map(|(i, v)| if i < first { (1.5 + v) * big } else { 1.5 + v })
        .collect()
}

/// The innermost error of a warmup, body or conditional-body error.
fn innermost(mut e: &GraphError) -> &GraphError {
    loop {
        match e {
            GraphError::Warmup { source, .. }
            | GraphError::Body { source, .. }
            | GraphError::ConditionalBody { source, .. } => e = &**source,
            other => return other,
        }
    }
}

/// `y = x + 1`: the graph that shows the runtime usable after a refusal.
#[cuda_graph(warmup = 1)]
fn plus_one(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    affine(rt, x, 1.0, 1.0, y)
}

/// After a refused capture: the stream is not left capturing, the thread is eager, and a new
/// graph captures and replays like the host on fresh inputs.
fn runtime_still_works(rt: &Runtime, rng: &mut SmallRng, after: &str) -> Result<(), GraphError> {
    assert_eq!(
        rt.stream().capture_status()?,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        "after {after}: the stream was left capturing"
    );
    assert_eq!(
        phase(),
        Phase::Eager,
        "after {after}: the thread still believes it captures"
    );
    let n = 300;
    let mut graph = PlusOneGraph::capture(rt, &random_vec(rng, n), n)?;
    for replay in 0..3 {
        let x = random_vec(rng, n);
        let got = rt.stream().clone_dtoh(graph.replay(&x)?.y)?;
        let want: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
        assert_eq!(got, want, "after {after}: replay {replay} of a new graph");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 1. Random draws and cuBLAS GEMMs on both sides of an eager island.

const IB: usize = 8;
const IK: usize = 64;
const IH: usize = 128;
const IO: usize = 32;

/// Segment 1: `noise` uniform, `h = x · w1 + noise` (cuBLAS); the island clamps `h` to
/// `[-1, 1]` on the host; segment 2: `noise` normal (a second draw), `h += noise`,
/// `y = h · w2` (cuBLAS).
#[allow(clippy::too_many_arguments)]
#[cuda_graph(warmup = 2)]
fn noisy_mlp_clamped_on_the_host(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w1: &CudaSlice<f32>,
    #[state] w2: &CudaSlice<f32>,
    #[state] g: &Generator,
    h: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    g.uniform(rt, &mut *noise, -0.5, 0.5)?;
    matmul(rt, x, w1, &mut *h, MatMul::nn(IB, IH, IK))?;
    add_inplace(rt, &mut *h, &*noise)?;
    rt.eager(|| {
        let s = rt.stream();
        let clamped: Vec<f32> = s
            .clone_dtoh(&h)?
            .into_iter()
            .map(|v| v.clamp(-1.0, 1.0))
            .collect();
        s.memcpy_htod(&clamped, &mut h)?;
        Ok(())
    })?;
    g.normal(rt, &mut *noise, 0.0, 0.1)?;
    add_inplace(rt, &mut *h, &*noise)?;
    matmul(rt, &*h, w2, &mut *y, MatMul::nn(IB, IO, IH))
}

/// Pairs: island × rng, island × cublas.
/// A generator drawn from in the segments on both sides of an island, and GEMMs before and
/// after it: six replays equal eager calls drawing from a twin generator, bitwise, with the
/// generators at the same offset after the capture (the warmup's draws undone across the
/// island) and after every replay, and the island's clamp changing values.
#[gpu_test]
fn random_draws_and_gemms_around_an_island_match_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("random_draws_and_gemms_around_an_island_match_eager");
    let s = rt.stream().clone();
    let w1_host = scaled(&mut rng, IK * IH, 0.3);
    let (w1, w2) = (
        s.clone_htod(&w1_host)?,
        s.clone_htod(&scaled(&mut rng, IH * IO, 0.2))?,
    );
    let (gg, ge) = (rt.generator(0x15_1a4d)?, rt.generator(0x15_1a4d)?);
    let mut graph = NoisyMlpClampedOnTheHostGraph::capture(
        &rt,
        &random_vec(&mut rng, IB * IK),
        &w1,
        &w2,
        &gg,
        IB * IH,
        IB * IH,
        IB * IO,
    )?;
    assert_eq!(graph.islands().len(), 1, "one island");
    assert_eq!(graph.segments().count(), 2, "two segments");
    assert_eq!(
        gg.seed_and_offset(&rt)?,
        ge.seed_and_offset(&rt)?,
        "after the capture: the warmup's draws in both segments were undone"
    );
    let (mut eh, mut en, mut ey) = (
        s.alloc_zeros::<f32>(IB * IH)?,
        s.alloc_zeros::<f32>(IB * IH)?,
        s.alloc_zeros::<f32>(IB * IO)?,
    );
    let mut clamped = 0usize;
    for replay in 0..6 {
        let x = random_vec(&mut rng, IB * IK);
        let (seed, offset) = gg.seed_and_offset(&rt)?;
        let out = graph.replay(&x)?;
        let (gh, gn, gy) = (
            s.clone_dtoh(out.h)?,
            s.clone_dtoh(out.noise)?,
            s.clone_dtoh(out.y)?,
        );
        noisy_mlp_clamped_on_the_host(
            &rt,
            &s.clone_htod(&x)?,
            &w1,
            &w2,
            &ge,
            &mut eh,
            &mut en,
            &mut ey,
        )?;
        assert_eq!(gh, s.clone_dtoh(&eh)?, "replay {replay}: h, graph vs eager");
        assert_eq!(
            gn,
            s.clone_dtoh(&en)?,
            "replay {replay}: the draw after the island, graph vs eager"
        );
        assert_eq!(gy, s.clone_dtoh(&ey)?, "replay {replay}: y, graph vs eager");
        assert_eq!(
            gg.seed_and_offset(&rt)?,
            ge.seed_and_offset(&rt)?,
            "replay {replay}: generator offsets, graph vs eager"
        );
        // What the island saw, on the host: x · w1 plus the replay's uniform draw.
        for r in 0..IB {
            for c in 0..IH {
                let dot: f64 = (0..IK)
                    .map(|k| x[r * IK + k] as f64 * w1_host[k * IH + c] as f64)
                    .sum();
                let u: f32 = reference_uniform_in(seed, offset, (r * IH + c) as u64, -0.5, 0.5);
                if (dot + u as f64).abs() > 1.01 {
                    clamped += 1;
                    assert!(
                        (gh[r * IH + c] - gn[r * IH + c]).abs() <= 1.0 + 1e-5,
                        "replay {replay}, h[{r}, {c}]: the island's clamp did not run"
                    );
                }
            }
        }
    }
    assert!(
        clamped > 0,
        "the host clamp changed no value in six replays"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 2. An island of a called graph function inside a branch, an unrolled loop or a fork.

/// `y = 3x + 1`, an island, then `y += x`.
#[cuda_graph(warmup = 1)]
fn with_island(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    affine(rt, x, 3.0, 1.0, y)?;
    rt.eager(|| Ok(()))?;
    add_inplace(rt, y, x)
}

/// Calls `with_island` inside a `graph_if`.
#[cuda_graph(warmup = 1)]
fn island_in_a_branch(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_if(&go, |rt| with_island(rt, x, &mut *y))
}

/// Calls `with_island` in the steps of a `graph_while_unrolled` (two steps, the bound ends it).
#[cuda_graph(warmup = 1)]
fn island_in_an_unrolled_loop(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_while_unrolled(&go, Some(2), 2, |rt| {
        with_island(rt, x, &mut *y)?;
        go.set(rt, true)
    })
}

/// Calls `with_island` on the main branch of a fork.
#[cuda_graph(warmup = 1)]
fn island_in_a_fork(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|_branch| with_island(rt, x, &mut *y))
}

/// What `IslandMisuse` says of an island inside a conditional body or a fork.
const NOT_IN_A_BODY: &str = "cannot be inside a `graph_while` / `graph_if` body or a fork";

/// Pairs: island × if, island × unrolled, island × fork.
/// A body calling a `#[cuda_graph]` function that has an island, from inside a `graph_if`, the
/// steps of a `graph_while_unrolled` and a fork's closure: each runs eagerly, and its capture
/// is refused with `IslandMisuse` (inside the conditional body's error for the two
/// conditionals); the island function still works as a graph of its own and the runtime
/// captures new graphs. Islands written inside those closures are compile errors
/// (`ui-tests/tests/fail/island-in-graph-if.rs`, `island-in-unrolled-loop.rs`,
/// `island-in-fork.rs`).
#[gpu_test]
fn refused_island_of_a_called_graph_function_in_a_branch_an_unrolled_loop_or_a_fork(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng(
        "refused_island_of_a_called_graph_function_in_a_branch_an_unrolled_loop_or_a_fork",
    );
    let n = 513;
    let s = rt.stream().clone();
    let x = random_vec(&mut rng, n);
    let dx = s.clone_htod(&x)?;
    let (mut want, mut ey) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    with_island(&rt, &dx, &mut want)?;
    let want = s.clone_dtoh(&want)?;

    // Eagerly each one runs the island function (the unrolled loop twice, which is the same).
    island_in_a_branch(&rt, &dx, &mut ey)?;
    assert_eq!(s.clone_dtoh(&ey)?, want, "eager: in a branch");
    island_in_an_unrolled_loop(&rt, &dx, &mut ey)?;
    assert_eq!(s.clone_dtoh(&ey)?, want, "eager: in an unrolled loop");
    island_in_a_fork(&rt, &dx, &mut ey)?;
    assert_eq!(s.clone_dtoh(&ey)?, want, "eager: in a fork");

    for inside in ["graph_if", "graph_while_unrolled", "fork"] {
        let captured = match inside {
            "graph_if" => IslandInABranchGraph::capture(&rt, &x, n).map(drop),
            "graph_while_unrolled" => IslandInAnUnrolledLoopGraph::capture(&rt, &x, n).map(drop),
            _ => IslandInAForkGraph::capture(&rt, &x, n).map(drop),
        };
        let err = captured.expect_err(inside);
        match (inside, &err) {
            // The conditionals check their closure in a scratch recording first: the refusal
            // comes back as the loop's or branch's body error.
            ("graph_if", GraphError::ConditionalBody { construct, .. }) => {
                assert_eq!(*construct, "graph_if", "{err}")
            }
            ("graph_while_unrolled", GraphError::ConditionalBody { construct, .. }) => {
                assert_eq!(*construct, "graph_while", "{err}")
            }
            ("fork", GraphError::IslandMisuse { graph, .. }) => {
                assert_eq!(*graph, "island_in_a_fork", "{err}")
            }
            _ => panic!("an island inside a {inside}: unexpected error {err:?}: {err}"),
        }
        assert!(
            matches!(innermost(&err), GraphError::IslandMisuse { .. })
                && err.to_string().contains(NOT_IN_A_BODY),
            "an island inside a {inside}: {err:?}"
        );
        runtime_still_works(&rt, &mut rng, &format!("an island inside a {inside}"))?;
    }

    // The island function itself captures and replays like eager.
    let mut graph = WithIslandGraph::capture(&rt, &x, n)?;
    for replay in 0..4 {
        let x = random_vec(&mut rng, n);
        let got = s.clone_dtoh(graph.replay(&x)?.y)?;
        with_island(&rt, &s.clone_htod(&x)?, &mut ey)?;
        assert_eq!(
            got,
            s.clone_dtoh(&ey)?,
            "replay {replay}: the island function as a graph"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 3. Forks and conditionals nested either way.

/// A `graph_if` inside a fork's closure.
#[cuda_graph(warmup = 1)]
fn branch_in_a_fork(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.fork(|_branch| rt.graph_if(&go, |rt| Ok(rt.stream().memset_zeros(&mut *y)?)))
}

/// A `graph_while_unrolled` inside a fork's closure.
#[cuda_graph(warmup = 1)]
fn unrolled_loop_in_a_fork(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.fork(|_branch| {
        rt.graph_while_unrolled(&go, Some(4), 2, |rt| {
            rt.stream().memset_zeros(&mut *y)?;
            go.set(rt, false)
        })
    })
}

/// What `ConditionMisuse` says of a conditional inside a fork.
const INSIDE_A_FORK: &str = "inside the closure of `fork`";

/// Pairs: if × fork, unrolled × fork.
/// A `graph_if` and a `graph_while_unrolled` inside a fork's closure: refused with
/// `ConditionMisuse` eagerly, and so by the capture's warmup; the runtime captures new graphs
/// afterwards.
#[gpu_test]
fn refused_branch_or_unrolled_loop_inside_a_fork(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("refused_branch_or_unrolled_loop_inside_a_fork");
    let s = rt.stream().clone();
    let n = 64;
    let mut y = s.alloc_zeros::<f32>(n)?;
    // Eagerly the unrolled loop is `graph_while`'s host loop, and is refused as that.
    let eager = [
        ("graph_if", "graph_if", branch_in_a_fork(&rt, &mut y)),
        (
            "graph_while_unrolled",
            "graph_while",
            unrolled_loop_in_a_fork(&rt, &mut y),
        ),
    ];
    for (inside, named, ran) in eager {
        let err = ran.expect_err(inside);
        assert!(
            matches!(err, GraphError::ConditionMisuse { construct, .. } if construct == named)
                && err.to_string().contains(INSIDE_A_FORK),
            "eager {inside} inside a fork: {err:?}"
        );
    }
    for inside in ["graph_if", "graph_while_unrolled"] {
        let captured = match inside {
            "graph_if" => BranchInAForkGraph::capture(&rt, n).map(drop),
            _ => UnrolledLoopInAForkGraph::capture(&rt, n).map(drop),
        };
        let err = captured.expect_err(inside);
        assert!(
            matches!(err, GraphError::Warmup { .. })
                && matches!(innermost(&err), GraphError::ConditionMisuse { .. })
                && err.to_string().contains(INSIDE_A_FORK),
            "capture of a {inside} inside a fork: {err:?}"
        );
        runtime_still_works(&rt, &mut rng, &format!("a {inside} inside a fork"))?;
    }
    Ok(())
}

/// A fork inside a `graph_if`'s closure: `a = 2x` on the side branch, `b = x + 1` on the main.
#[cuda_graph(warmup = 1)]
fn fork_in_a_branch(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    b: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_if(&go, |rt| {
        rt.fork(|branch| {
            scale_side(branch, rt, branch.read(x), branch.write(&mut *a), 2.0)?;
            affine(rt, x, 1.0, 1.0, &mut *b)
        })
    })
}

/// The same fork in the steps of a `graph_while_unrolled` (the bound ends it after 3 steps;
/// the fork's kernels change nothing when run again).
#[cuda_graph(warmup = 1)]
fn fork_in_an_unrolled_loop(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    b: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_while_unrolled(&go, Some(3), 2, |rt| {
        rt.fork(|branch| {
            scale_side(branch, rt, branch.read(x), branch.write(&mut *a), 2.0)?;
            affine(rt, x, 1.0, 1.0, &mut *b)
        })?;
        go.set(rt, true)
    })
}

/// Pairs: if × fork, unrolled × fork.
/// A fork inside a `graph_if` and inside the steps of a `graph_while_unrolled`: the
/// conditional module's docs list "no fork" among what a conditional body may not record, and
/// promise a typed error for what a body must not record, so the capture must be refused
/// (`ConditionMisuse`, `ForbiddenInConditional` or `ConditionalBody`, possibly inside the
/// warmup's error) and the runtime stay usable.
#[gpu_test]
fn refused_fork_inside_a_branch_or_an_unrolled_step(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("refused_fork_inside_a_branch_or_an_unrolled_step");
    let n = 256;
    let x = random_vec(&mut rng, n);
    for inside in ["graph_if", "graph_while_unrolled"] {
        let captured = match inside {
            "graph_if" => ForkInABranchGraph::capture(&rt, &x, n, n).map(drop),
            _ => ForkInAnUnrolledLoopGraph::capture(&rt, &x, n, n).map(drop),
        };
        match captured {
            Ok(()) => panic!(
                "a fork inside a {inside} was captured: graph_runtime::conditional documents \"no fork\" \
                 in a conditional body and a typed error for what a body must not record"
            ),
            Err(err) => assert!(
                matches!(
                    innermost(&err),
                    GraphError::ConditionMisuse { .. }
                        | GraphError::ForbiddenInConditional { .. }
                ) || matches!(err, GraphError::ConditionalBody { .. }),
                "a fork inside a {inside}: {err:?}"
            ),
        }
        runtime_still_works(&rt, &mut rng, &format!("a fork inside a {inside}"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 4. State and random draws inside loops and a branch.

const SB: usize = 4;
const SN: usize = 256;

/// `y = x`; while `y[0] > 1` (`unroll` steps per loop node): `y *= decay`, `acc += y`,
/// counted in `iters`; then, when `flip[0] > 0`, `noise` is a normal draw and
/// `acc += bias · noise`. `decay` and `bias` are read-only state, `acc` written state.
#[allow(clippy::too_many_arguments)]
#[cuda_graph(warmup = 2, check_determinism = true)]
fn decay_then_maybe_noise(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    flip: &CudaSlice<f32>,
    #[state] decay: &CudaSlice<f32>,
    #[state] bias: &CudaSlice<f32>,
    #[state] g: &Generator,
    #[state] acc: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
    #[constant] unroll: u32,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let (step, fma) = (
        rt.function(K, "decay_step")?,
        rt.function(K, "fma_inplace")?,
    );
    let n = y.len() as i32;
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    s.memset_zeros(&mut *noise)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    let positive = rt.condition(false)?;
    positive.set_from(rt, flip, Compare::Gt, 0.0)?;
    rt.graph_while_unrolled(&go, Some(100), unroll, |rt| {
        let arg = go.kernel_arg(rt);
        // SAFETY: `decay_step` reads and writes `n` floats of `y` and `acc`, reads `n` of
        // `decay` (all hold `n`), updates one word of `iters` and reads `go`.
        unsafe {
            rt.stream()
                .launch_builder(&step)
                .arg(&mut *y)
                .arg(decay)
                .arg(&mut *acc)
                .arg(&mut *iters)
                .arg(&n)
                .arg(&arg)
                .launch(grid(n as usize))
        }?;
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })?;
    rt.graph_if(&positive, |rt| {
        g.normal(rt, &mut *noise, 0.0, 1.0)?;
        // SAFETY: `fma_inplace` reads and writes `n` floats of `acc` and reads `n` of `bias`
        // and `noise`; all hold `n`.
        unsafe {
            rt.stream()
                .launch_builder(&fma)
                .arg(&mut *acc)
                .arg(bias)
                .arg(&*noise)
                .arg(&n)
                .launch(grid(n as usize))
        }?;
        Ok(())
    })
}

/// Pairs: while × devstate-ro, while × devstate-rw, unrolled × devstate-ro, unrolled × devstate-rw, if × devstate-ro, if × devstate-rw, if × rng.
/// A loop (plain, and unrolled by 3) that reads read-only `#[state]` and accumulates into
/// `&mut` state, then a branch that draws from a generator and writes the state: eight
/// replays per loop form, trip counts and branch both ways varying with the inputs, equal
/// eager calls on a copy of the state and a twin generator bitwise, the state compared
/// through `state_mut()` and the generators' offsets after every replay (they move only when
/// the branch runs).
#[gpu_test]
fn state_in_loops_and_draws_in_a_branch_match_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("state_in_loops_and_draws_in_a_branch_match_eager");
    let s = rt.stream().clone();
    let n = SB * SN;
    let decay: Vec<f32> = (0..n).map(|_| rng.random_range(0.5f32..0.8)).collect();
    let decay = s.clone_htod(&decay)?;
    let bias = s.clone_htod(&random_vec(&mut rng, n))?;
    let input = |rng: &mut SmallRng| -> (Vec<f32>, f32) {
        (
            positive(rng, n, 1, -1.0..7.0),
            rng.random_range(-1.0f32..1.0),
        )
    };
    let (mut ey, mut en, mut ei) = (
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<u32>(1)?,
    );
    for unroll in [1u32, 3] {
        let acc0 = random_vec(&mut rng, n);
        let (mut g_acc, mut e_acc) = (s.clone_htod(&acc0)?, s.clone_htod(&acc0)?);
        let (gg, ge) = (rt.generator(0xdeca7)?, rt.generator(0xdeca7)?);
        let (x0, f0) = input(&mut rng);
        let mut graph = DecayThenMaybeNoiseGraph::capture(
            &rt,
            &x0,
            [f0].as_slice(),
            &decay,
            &bias,
            &gg,
            &mut g_acc,
            n,
            n,
            1,
            unroll,
        )?;
        assert_eq!(
            s.clone_dtoh(&graph.state_mut().acc)?,
            acc0,
            "unroll {unroll}: the warmup's updates of the state were undone"
        );
        let (mut trips, mut taken) = (Vec::new(), [0usize; 2]);
        for replay in 0..8 {
            let (x, mut flip) = input(&mut rng);
            if replay < 2 {
                flip = if replay == 0 { 0.5 } else { -0.5 }; // both ways at least once
            }
            let before = gg.seed_and_offset(&rt)?;
            let out = graph.replay(&x, [flip].as_slice())?;
            let (gy, gn, gi) = (
                s.clone_dtoh(out.y)?,
                s.clone_dtoh(out.noise)?,
                s.clone_dtoh(out.iters)?[0],
            );
            decay_then_maybe_noise(
                &rt,
                &s.clone_htod(&x)?,
                &s.clone_htod(&[flip])?,
                &decay,
                &bias,
                &ge,
                &mut e_acc,
                &mut ey,
                &mut en,
                &mut ei,
                unroll,
            )?;
            let at = format!("unroll {unroll}, replay {replay}, flip {flip}, {gi} iterations");
            assert_eq!(
                gi,
                s.clone_dtoh(&ei)?[0],
                "{at}: iterations, graph vs eager"
            );
            assert_eq!(gy, s.clone_dtoh(&ey)?, "{at}: y, graph vs eager");
            assert_eq!(
                gn,
                s.clone_dtoh(&en)?,
                "{at}: the branch's draw, graph vs eager"
            );
            assert_eq!(
                s.clone_dtoh(&graph.state_mut().acc)?,
                s.clone_dtoh(&e_acc)?,
                "{at}: the `&mut` state, graph vs eager"
            );
            let after = gg.seed_and_offset(&rt)?;
            assert_eq!(
                after,
                ge.seed_and_offset(&rt)?,
                "{at}: generator offsets, graph vs eager"
            );
            assert_eq!(
                after != before,
                flip > 0.0,
                "{at}: the generator moves exactly when the branch runs"
            );
            trips.push(gi);
            taken[usize::from(flip > 0.0)] += 1;
        }
        trips.sort_unstable();
        trips.dedup();
        assert!(
            trips.len() >= 3,
            "unroll {unroll}: the trip counts varied: {trips:?}"
        );
        assert!(
            taken[0] > 0 && taken[1] > 0,
            "unroll {unroll}: both ways: {taken:?}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 5. cuBLAS inside loops and a branch.

/// `y = x`; while `y[0] > 1` (`unroll` steps per loop node): `t = y · a` (cuBLAS), `y = t`,
/// counted in `iters`; then, when `flip[0] > 0`, `z = y · a` (cuBLAS). `a` is a positive
/// contraction (read-only state). In a step of the unrolled loop after the one that stopped
/// it, the GEMM runs again into the temporary `t`, which nothing reads then.
#[allow(clippy::too_many_arguments)]
#[cuda_graph(warmup = 2, check_determinism = true)]
fn contract_with_gemms(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    flip: &CudaSlice<f32>,
    #[state] a: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
    #[constant] unroll: u32,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let take = rt.function(K, "take_step")?;
    let n = y.len();
    let ni = n as i32;
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    s.memset_zeros(&mut *z)?;
    let mut t = s.alloc_zeros::<f32>(n)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    let positive = rt.condition(false)?;
    positive.set_from(rt, flip, Compare::Gt, 0.0)?;
    rt.graph_while_unrolled(&go, Some(64), unroll, |rt| {
        matmul(rt, &*y, a, &mut t, MatMul::nn(SB, SN, SN))?;
        let arg = go.kernel_arg(rt);
        // SAFETY: `take_step` reads `n` floats of `t`, writes `n` of `y` (both hold `n`),
        // updates one word of `iters` and reads `go`.
        unsafe {
            rt.stream()
                .launch_builder(&take)
                .arg(&t)
                .arg(&mut *y)
                .arg(&mut *iters)
                .arg(&ni)
                .arg(&arg)
                .launch(grid(n))
        }?;
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })?;
    rt.graph_if(&positive, |rt| {
        matmul(rt, &*y, a, &mut *z, MatMul::nn(SB, SN, SN))
    })
}

/// Pairs: while × cublas, unrolled × cublas, if × cublas, while × devstate-ro, unrolled × devstate-ro, if × devstate-ro.
/// GEMMs (`rt.blas()`, workspace set before the capture) inside a `graph_while`, the steps of
/// a `graph_while_unrolled` and a `graph_if`, reading a `#[state]` matrix: a conditional body
/// may record kernels and memsets, which is what a GEMM is, so each captures and six replays
/// per loop form equal eager calls bitwise, trip counts and branch varying with the inputs.
#[gpu_test]
fn cublas_gemms_inside_loops_and_a_branch_match_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("cublas_gemms_inside_loops_and_a_branch_match_eager");
    let s = rt.stream().clone();
    let n = SB * SN;
    // Positive entries summing to about 0.5 per column: y shrinks about twofold per step.
    let a: Vec<f32> = (0..SN * SN)
        .map(|_| rng.random_range(0.5f32..1.5) * 0.5 / SN as f32)
        .collect();
    let a = s.clone_htod(&a)?;
    let input = |rng: &mut SmallRng| -> (Vec<f32>, f32) {
        (
            positive(rng, n, SN, -1.0..9.0),
            rng.random_range(-1.0f32..1.0),
        )
    };
    let (mut ey, mut ez, mut ei) = (
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<u32>(1)?,
    );
    for unroll in [1u32, 3] {
        let (x0, f0) = input(&mut rng);
        let mut graph =
            ContractWithGemmsGraph::capture(&rt, &x0, [f0].as_slice(), &a, n, n, 1, unroll)?;
        let mut trips = Vec::new();
        for replay in 0..6 {
            let (x, mut flip) = input(&mut rng);
            if replay < 2 {
                flip = if replay == 0 { 0.5 } else { -0.5 };
            }
            let out = graph.replay(&x, [flip].as_slice())?;
            let (gy, gz, gi) = (
                s.clone_dtoh(out.y)?,
                s.clone_dtoh(out.z)?,
                s.clone_dtoh(out.iters)?[0],
            );
            contract_with_gemms(
                &rt,
                &s.clone_htod(&x)?,
                &s.clone_htod(&[flip])?,
                &a,
                &mut ey,
                &mut ez,
                &mut ei,
                unroll,
            )?;
            let at = format!("unroll {unroll}, replay {replay}, flip {flip}, {gi} iterations");
            assert_eq!(
                gi,
                s.clone_dtoh(&ei)?[0],
                "{at}: iterations, graph vs eager"
            );
            assert_eq!(
                gy,
                s.clone_dtoh(&ey)?,
                "{at}: the loop's GEMMs, graph vs eager"
            );
            assert_eq!(
                gz,
                s.clone_dtoh(&ez)?,
                "{at}: the branch's GEMM, graph vs eager"
            );
            assert!(
                gy[0] <= 1.0,
                "{at}: the loop ran until y[0] <= 1: {}",
                gy[0]
            );
            assert_eq!(
                gz.iter().any(|v| *v != 0.0),
                flip > 0.0,
                "{at}: the branch ran exactly when flip > 0"
            );
            trips.push(gi);
        }
        trips.sort_unstable();
        trips.dedup();
        assert!(
            trips.len() >= 3,
            "unroll {unroll}: the trip counts varied: {trips:?}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 6. Early launches next to every body feature.

/// Width of every early-launched layer.
const ED: usize = 64;
/// Rows.
const ER: usize = 8;
/// Layers in the weights: 0-3 before the island, 4-8 after it, 9-10 in `two_layers`.
const EL: usize = 11;

/// Layer `l`: `y = gelu(x · W_lᵀ + b_l)`, launched early when `early`.
fn el<X, Y>(
    rt: &Runtime,
    early: bool,
    l: usize,
    x: &X,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    y: &mut Y,
) -> Result<(), GraphError>
where
    X: DevicePtr<f32>,
    Y: DevicePtrMut<f32>,
{
    let wl = w.slice(l * ED * ED..(l + 1) * ED * ED);
    let bl = b.slice(l * ED..(l + 1) * ED);
    linear_bias_gelu(rt, early, x, &wl, &bl, y, ER, ED, ED)
}

/// Two layers (9 and 10), a graph function of its own that another body calls.
#[cuda_graph(warmup = 2)]
fn two_layers(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] early: bool,
) -> Result<(), GraphError> {
    let mut t = rt.stream().alloc_zeros::<f32>(ER * ED)?;
    el(rt, early, 9, x, w, b, &mut t)?;
    el(rt, early, 10, &t, w, b, y)
}

/// The segment before the island: layer 0; a fork with `side = 2x` on the side branch and
/// layer 1 on the main one; a GEMM; layer 2; a uniform draw; layer 3 into `a`; `a += noise`.
#[allow(clippy::too_many_arguments)]
fn early_front(
    rt: &Runtime,
    early: bool,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    wm: &CudaSlice<f32>,
    g: &Generator,
    a: &mut CudaSlice<f32>,
    side: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let n = ER * ED;
    let (mut h0, mut h1, mut h2, mut h3, mut noise) = (
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
    );
    el(rt, early, 0, x, w, b, &mut h0)?;
    rt.fork(|branch| {
        scale_side(branch, rt, branch.read(x), branch.write(side), 2.0)?;
        el(rt, early, 1, &h0, w, b, &mut h1)
    })?;
    matmul(rt, &h1, wm, &mut h2, MatMul::nn(ER, ED, ED))?;
    el(rt, early, 2, &h2, w, b, &mut h3)?;
    g.uniform(rt, &mut noise, -0.1, 0.1)?;
    el(rt, early, 3, &h3, w, b, &mut *a)?;
    add_inplace(rt, a, &noise)
}

/// The loops and the branch after the island: `c` = layer 4 of `a`; `trips[0]` times
/// `c = L6(L5(c))` in a `graph_while`; `c = L7(c)` when `flip[0] > 0`; then `trips[0]` steps
/// of a `graph_while_unrolled` (2 per loop node) adding `L8(c)` to `u` (the layer runs again
/// in a step after the loop stopped, on the same `c`: only the guarded sum and count change).
#[allow(clippy::too_many_arguments)]
fn early_loops(
    rt: &Runtime,
    early: bool,
    flip: &CudaSlice<f32>,
    trips: &CudaSlice<u32>,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    a: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
    u: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let n = ER * ED;
    let (mut t, mut v) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    let (mut count, mut steps) = (s.alloc_zeros::<u32>(1)?, s.alloc_zeros::<u32>(1)?);
    s.memset_zeros(&mut *u)?;
    el(rt, early, 4, a, w, b, &mut *c)?;
    let go = rt.condition(true)?;
    let positive = rt.condition(false)?;
    positive.set_from(rt, flip, Compare::Gt, 0.0)?;
    let again = rt.condition(true)?;
    rt.graph_while(&go, Some(8), |rt| {
        el(rt, early, 5, &*c, w, b, &mut t)?;
        el(rt, early, 6, &t, w, b, &mut *c)?;
        count_until(rt, &mut count, trips, &go)
    })?;
    rt.graph_if(&positive, |rt| {
        el(rt, early, 7, &*c, w, b, &mut t)?;
        Ok(rt.stream().memcpy_dtod(&t, &mut *c)?)
    })?;
    rt.graph_while_unrolled(&again, Some(8), 2, |rt| {
        el(rt, early, 8, &*c, w, b, &mut v)?;
        accumulate_guarded(rt, &mut *u, &v, &again)?;
        count_until(rt, &mut steps, trips, &again)
    })
}

/// Early-launched layers next to a fork, a GEMM and a draw (`early_front`), an island that
/// clamps `a` on the host, loops and a branch (`early_loops`), and a called graph function
/// (`two_layers`) into `y`; with `early = false` the same body launches every layer in order.
#[allow(clippy::too_many_arguments)]
#[cuda_graph(warmup = 2, check_determinism = true)]
fn early_everywhere(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    flip: &CudaSlice<f32>,
    trips: &CudaSlice<u32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    #[state] wm: &CudaSlice<f32>,
    #[state] g: &Generator,
    a: &mut CudaSlice<f32>,
    side: &mut CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
    u: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] early: bool,
) -> Result<(), GraphError> {
    early_front(rt, early, x, w, b, wm, g, a, side)?;
    rt.eager(|| {
        let s = rt.stream();
        let clamped: Vec<f32> = s
            .clone_dtoh(&a)?
            .into_iter()
            .map(|v| v.clamp(-0.25, 0.25))
            .collect();
        s.memcpy_htod(&clamped, &mut a)?;
        Ok(())
    })?;
    early_loops(rt, early, flip, trips, w, b, a, c, u)?;
    two_layers(rt, u, w, b, y, early)
}

/// Pairs: island × early, while × early, if × early, unrolled × early, fork × early, rng × early, early × cublas, early × nested, early × debugchecks.
/// Layers launched early next to every body feature, with `check_determinism = true` (the
/// check runs in every build: `checks_time` is not zero): the early graph has more
/// programmatic edges than the in-order one, and over five replays with fresh inputs (loop
/// trips 1-4, the branch both ways) every output of the early graph equals the in-order
/// graph's, the eager early call's and the eager in-order call's bitwise, each drawing from
/// its own generator of one seed, all four at the same offset after every replay.
#[gpu_test]
fn early_launches_next_to_every_body_feature_match_in_order_and_eager(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("early_launches_next_to_every_body_feature_match_in_order_and_eager");
    let s = rt.stream().clone();
    let n = ER * ED;
    let w = s.clone_htod(&scaled(&mut rng, EL * ED * ED, 0.25))?;
    let b = s.clone_htod(&scaled(&mut rng, EL * ED, 0.1))?;
    let wm = s.clone_htod(&scaled(&mut rng, ED * ED, 0.25))?;
    let gens = [
        rt.generator(0xea41)?,
        rt.generator(0xea41)?,
        rt.generator(0xea41)?,
        rt.generator(0xea41)?,
    ];
    let x0 = random_vec(&mut rng, n);
    let mut graphs = [
        EarlyEverywhereGraph::capture(
            &rt,
            &x0,
            [1.0f32].as_slice(),
            [2u32].as_slice(),
            &w,
            &b,
            &wm,
            &gens[0],
            n,
            n,
            n,
            n,
            n,
            true,
        )?,
        EarlyEverywhereGraph::capture(
            &rt,
            &x0,
            [1.0f32].as_slice(),
            [2u32].as_slice(),
            &w,
            &b,
            &wm,
            &gens[1],
            n,
            n,
            n,
            n,
            n,
            false,
        )?,
    ];
    let (early_edges, in_order_edges) =
        (graphs[0].info().early_edges, graphs[1].info().early_edges);
    assert!(
        early_edges > in_order_edges,
        "programmatic edges: {early_edges} early, {in_order_edges} in order (the draw's own)"
    );
    for g in &graphs {
        assert!(
            g.info().checks_time > Duration::ZERO,
            "the determinism check ran: {:?}",
            g.info()
        );
        assert_eq!(g.islands().len(), 1, "one island");
    }
    let names = ["a", "side", "c", "u", "y"];
    let mut eager: Vec<Vec<CudaSlice<f32>>> = (0..2)
        .map(|_| (0..names.len()).map(|_| s.alloc_zeros::<f32>(n)).collect())
        .collect::<Result<_, _>>()?;
    for replay in 0..5 {
        let x = random_vec(&mut rng, n);
        let flip: f32 = match replay {
            0 => 0.5,
            1 => -0.5,
            _ => rng.random_range(-1.0..1.0),
        };
        let trips: u32 = rng.random_range(1..=4);
        let at = format!("replay {replay}, flip {flip}, {trips} trips");
        let mut replayed = Vec::new();
        for g in graphs.iter_mut() {
            let out = g.replay(&x, [flip].as_slice(), [trips].as_slice())?;
            replayed.push([
                s.clone_dtoh(out.a)?,
                s.clone_dtoh(out.side)?,
                s.clone_dtoh(out.c)?,
                s.clone_dtoh(out.u)?,
                s.clone_dtoh(out.y)?,
            ]);
        }
        let (dx, dflip, dtrips) = (
            s.clone_htod(&x)?,
            s.clone_htod(&[flip])?,
            s.clone_htod(&[trips])?,
        );
        let mut called = Vec::new();
        for (k, early) in [true, false].into_iter().enumerate() {
            let [ea, es, ec, eu, ey] = &mut eager[k][..] else {
                unreachable!("five outputs")
            };
            early_everywhere(
                &rt,
                &dx,
                &dflip,
                &dtrips,
                &w,
                &b,
                &wm,
                &gens[2 + k],
                ea,
                es,
                ec,
                eu,
                ey,
                early,
            )?;
            let mut host = Vec::new();
            for buf in eager[k].iter() {
                host.push(s.clone_dtoh(buf)?);
            }
            called.push(host);
        }
        for (i, name) in names.iter().enumerate() {
            assert_eq!(
                replayed[0][i], called[0][i],
                "{at}: `{name}`, early graph vs eager early call"
            );
            assert_eq!(
                replayed[0][i], replayed[1][i],
                "{at}: `{name}`, early graph vs in-order graph"
            );
            assert_eq!(
                called[0][i], called[1][i],
                "{at}: `{name}`, eager early vs eager in order"
            );
        }
        let offsets: Vec<(u64, u64)> = gens
            .iter()
            .map(|g| g.seed_and_offset(&rt))
            .collect::<Result<_, _>>()?;
        assert!(
            offsets.iter().all(|o| *o == offsets[0]),
            "{at}: generator offsets (early graph, in-order graph, eager early, eager in order): {offsets:?}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 7. A body calling other `#[cuda_graph]` functions.

/// Rows of the nested pipeline.
const NR: usize = 4;
/// Columns.
const NC: usize = 128;

/// `y = x · a` (cuBLAS).
#[cuda_graph(warmup = 2)]
fn project(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] a: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    matmul(rt, x, a, y, MatMul::nn(x.len() / NC, NC, NC))
}

/// `noise` normal, `y += 0.01 · noise`.
#[cuda_graph(warmup = 2)]
fn jitter(
    rt: &Runtime,
    #[state] g: &Generator,
    y: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    g.normal(rt, &mut *noise, 0.0, 1.0)?;
    axpy(rt, y, noise, 0.01)
}

/// `project`, then `jitter`: a graph function calling two others.
#[cuda_graph(warmup = 2)]
fn front(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] a: &CudaSlice<f32>,
    #[state] g: &Generator,
    y: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    project(rt, x, a, &mut *y)?;
    jitter(rt, g, y, noise)
}

/// Halves `y` while `y[0] > 1` (`unroll` steps per loop node), counting in `iters`.
#[cuda_graph(warmup = 2)]
fn halve_loop(
    rt: &Runtime,
    y: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
    #[constant] unroll: u32,
) -> Result<(), GraphError> {
    let halve = rt.function(K, "halve_count")?;
    let n = y.len() as i32;
    rt.stream().memset_zeros(&mut *iters)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while_unrolled(&go, Some(200), unroll, |rt| {
        let arg = go.kernel_arg(rt);
        // SAFETY: `halve_count` reads and writes `n` floats of `y` (which holds `n`), updates
        // one word of `iters` and reads `go`.
        unsafe {
            rt.stream()
                .launch_builder(&halve)
                .arg(&mut *y)
                .arg(&n)
                .arg(&mut *iters)
                .arg(&arg)
                .launch(grid(n as usize))
        }?;
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })
}

/// `side = 3y` on a fork's side branch while `z = y + 1` on the main one.
#[cuda_graph(warmup = 2)]
fn forked(
    rt: &Runtime,
    y: &CudaSlice<f32>,
    side: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|branch| {
        scale_side(branch, rt, branch.read(y), branch.write(side), 3.0)?;
        affine(rt, y, 1.0, 1.0, z)
    })
}

/// `z = -z` when `flip[0] > 0`.
#[cuda_graph(warmup = 2)]
fn flip_sign(
    rt: &Runtime,
    flip: &CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let positive = rt.condition(false)?;
    positive.set_from(rt, flip, Compare::Gt, 0.0)?;
    rt.graph_if(&positive, |rt| negate(rt, &mut *z))
}

/// `acc += z` (written state).
#[cuda_graph(warmup = 2)]
fn accumulate(
    rt: &Runtime,
    z: &CudaSlice<f32>,
    #[state] acc: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    add_inplace(rt, acc, z)
}

/// Every step a call of another graph function: `front` (GEMM, draw), `forked` (fork), two
/// `halve_loop`s (a `graph_while` on `y`, an unrolled one on `side`), `flip_sign`
/// (`graph_if`), `accumulate` (`&mut` state).
#[allow(clippy::too_many_arguments)]
#[cuda_graph(warmup = 2, check_determinism = true)]
fn pipeline(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    flip: &CudaSlice<f32>,
    #[state] a: &CudaSlice<f32>,
    #[state] g: &Generator,
    #[state] acc: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    side: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
    iters_while: &mut CudaSlice<u32>,
    iters_unrolled: &mut CudaSlice<u32>,
) -> Result<(), GraphError> {
    front(rt, x, a, g, &mut *y, noise)?;
    forked(rt, y, &mut *side, &mut *z)?;
    halve_loop(rt, &mut *y, iters_while, 1)?;
    halve_loop(rt, side, iters_unrolled, 3)?;
    flip_sign(rt, flip, &mut *z)?;
    accumulate(rt, z, acc)
}

/// Pairs: plain × nested, rng × nested, while × nested, if × nested, unrolled × nested, fork × nested, nested × cublas, devstate-ro × nested, devstate-rw × nested, debugchecks × nested.
/// A graph whose body only calls other `#[cuda_graph]` functions (one of which calls two
/// more), under `check_determinism = true` (`checks_time` not zero): six replays with fresh
/// inputs equal eager calls of the same function bitwise, on a copy of the `&mut` state
/// (compared through `state_mut()`) and a twin generator (same offsets after every replay),
/// the loops' trip counts and the branch varying.
#[gpu_test]
fn graph_functions_called_from_a_body_replay_like_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("graph_functions_called_from_a_body_replay_like_eager");
    let s = rt.stream().clone();
    let n = NR * NC;
    let a: Vec<f32> = (0..NC * NC)
        .map(|_| rng.random_range(0.5f32..1.5) / NC as f32)
        .collect();
    let a = s.clone_htod(&a)?;
    let acc0 = random_vec(&mut rng, n);
    let (mut g_acc, mut e_acc) = (s.clone_htod(&acc0)?, s.clone_htod(&acc0)?);
    let (gg, ge) = (rt.generator(0x9e57)?, rt.generator(0x9e57)?);
    let input = |rng: &mut SmallRng| -> (Vec<f32>, f32) {
        (
            positive(rng, n, NC, -1.0..8.0),
            rng.random_range(-1.0f32..1.0),
        )
    };
    let (x0, f0) = input(&mut rng);
    let mut graph = PipelineGraph::capture(
        &rt,
        &x0,
        [f0].as_slice(),
        &a,
        &gg,
        &mut g_acc,
        n,
        n,
        n,
        n,
        1,
        1,
    )?;
    assert!(
        graph.info().checks_time > Duration::ZERO,
        "the determinism check ran: {:?}",
        graph.info()
    );
    assert_eq!(
        graph.info().kinds.conditionals,
        3,
        "two loops and a branch: {:?}",
        graph.info()
    );
    assert_eq!(
        s.clone_dtoh(&graph.state_mut().acc)?,
        acc0,
        "the warmup's updates of the state were undone"
    );
    assert_eq!(
        gg.seed_and_offset(&rt)?,
        ge.seed_and_offset(&rt)?,
        "after the capture"
    );
    let mut e: Vec<CudaSlice<f32>> = (0..4)
        .map(|_| s.alloc_zeros::<f32>(n))
        .collect::<Result<_, _>>()?;
    let (mut ew, mut eu) = (s.alloc_zeros::<u32>(1)?, s.alloc_zeros::<u32>(1)?);
    let mut trips = Vec::new();
    for replay in 0..6 {
        let (x, mut flip) = input(&mut rng);
        if replay < 2 {
            flip = if replay == 0 { 0.5 } else { -0.5 };
        }
        let out = graph.replay(&x, [flip].as_slice())?;
        let got = [
            s.clone_dtoh(out.y)?,
            s.clone_dtoh(out.noise)?,
            s.clone_dtoh(out.side)?,
            s.clone_dtoh(out.z)?,
        ];
        let (gw, gu) = (
            s.clone_dtoh(out.iters_while)?[0],
            s.clone_dtoh(out.iters_unrolled)?[0],
        );
        let [ey, en, es, ez] = &mut e[..] else {
            unreachable!("four outputs")
        };
        pipeline(
            &rt,
            &s.clone_htod(&x)?,
            &s.clone_htod(&[flip])?,
            &a,
            &ge,
            &mut e_acc,
            ey,
            en,
            es,
            ez,
            &mut ew,
            &mut eu,
        )?;
        let at = format!("replay {replay}, flip {flip}, {gw} + {gu} iterations");
        assert_eq!(
            gw,
            s.clone_dtoh(&ew)?[0],
            "{at}: graph_while trips, graph vs eager"
        );
        assert_eq!(
            gu,
            s.clone_dtoh(&eu)?[0],
            "{at}: unrolled trips, graph vs eager"
        );
        for (name, (gv, ev)) in ["y", "noise", "side", "z"].iter().zip(got.iter().zip(&e)) {
            assert_eq!(*gv, s.clone_dtoh(ev)?, "{at}: `{name}`, graph vs eager");
        }
        assert_eq!(
            s.clone_dtoh(&graph.state_mut().acc)?,
            s.clone_dtoh(&e_acc)?,
            "{at}: the `&mut` state, graph vs eager"
        );
        assert_eq!(
            gg.seed_and_offset(&rt)?,
            ge.seed_and_offset(&rt)?,
            "{at}: generator offsets"
        );
        trips.push((gw, gu));
    }
    trips.sort_unstable();
    trips.dedup();
    assert!(trips.len() >= 3, "the trip counts varied: {trips:?}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 8. A training-like step: GEMMs, a fork with dropout and written state, a weight update.

const TB: usize = 16;
const TI: usize = 64;
const TO: usize = 32;

/// In a fork: on the side branch `ema = (ema + target · scale) / 2` (read-only and written
/// state) and `side = ema`; on the main one `pre = x · w` (cuBLAS) and dropout of `pre` into
/// `y` and `mask`. After the join: `d = y - side`, `grad = xᵀ · d` (cuBLAS), `w -= lr · grad`.
#[allow(clippy::too_many_arguments)]
#[cuda_graph(warmup = 2)]
fn train_step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    target: &CudaSlice<f32>,
    #[state] w: &mut CudaSlice<f32>,
    #[state] scale: &CudaSlice<f32>,
    #[state] g: &Generator,
    #[state] ema: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    mask: &mut CudaSlice<u8>,
    side: &mut CudaSlice<f32>,
    grad: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let n = TB * TO;
    let (ema_side, sub, sgd) = (
        rt.function(K, "ema_side")?,
        rt.function(K, "sub_into")?,
        rt.function(K, "sgd")?,
    );
    let (mut pre, mut d) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    rt.fork(|branch| {
        // SAFETY: `ema_side` reads `n` floats of `target` and `ema`, `TO` of `scale` (index
        // i % TO), and writes `n` of `ema` and `side`; all hold what they are read or
        // written for.
        unsafe {
            branch
                .launch_builder(&ema_side)
                .buf(branch.read(target))
                .buf(branch.read(scale))
                .buf_mut(branch.write(ema))
                .buf_mut(branch.write(side))
                .arg(n as i32)
                .arg(TO as i32)
                .launch(grid(n))
        }?;
        matmul(rt, x, &*w, &mut pre, MatMul::nn(TB, TO, TI))?;
        g.dropout(rt, &pre, &mut *y, mask, 0.25)
    })?;
    let (ni, nw) = (n as i32, (TI * TO) as i32);
    // SAFETY: `sub_into` reads `n` floats of `y` and `side` and writes `n` of `d`; all hold `n`.
    unsafe {
        s.launch_builder(&sub)
            .arg(&*y)
            .arg(&*side)
            .arg(&mut d)
            .arg(&ni)
            .launch(grid(n))
    }?;
    matmul(rt, x, &d, &mut *grad, MatMul::tn(TI, TO, TB))?;
    let lr = 0.01f32;
    // SAFETY: `sgd` reads and writes `TI · TO` floats of `w` and reads as many of `grad`;
    // both hold that many.
    unsafe {
        s.launch_builder(&sgd)
            .arg(w)
            .arg(&*grad)
            .arg(&lr)
            .arg(&nw)
            .launch(grid(TI * TO))
    }?;
    Ok(())
}

/// Pairs: devstate-rw × cublas, rng × cublas, fork × cublas, fork × rng, fork × devstate-ro, fork × devstate-rw.
/// A training-like step whose weights (`&mut` state) feed a GEMM and are updated from another,
/// with dropout of the GEMM's output on a fork's main branch while the side branch reads
/// read-only state and writes `&mut` state: five replays with fresh inputs equal eager calls
/// on copies of the state and a twin generator bitwise, both states compared through
/// `state_mut()` and the generators' offsets after every replay.
#[gpu_test]
fn a_training_step_with_gemms_a_forked_dropout_and_state_matches_eager(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_training_step_with_gemms_a_forked_dropout_and_state_matches_eager");
    let s = rt.stream().clone();
    let (n, nw) = (TB * TO, TI * TO);
    let w0 = scaled(&mut rng, nw, 0.2);
    let ema0 = random_vec(&mut rng, n);
    let scale = s.clone_htod(&scaled(&mut rng, TO, 2.0))?;
    let (mut gw, mut ew) = (s.clone_htod(&w0)?, s.clone_htod(&w0)?);
    let (mut g_ema, mut e_ema) = (s.clone_htod(&ema0)?, s.clone_htod(&ema0)?);
    let (gg, ge) = (rt.generator(0x7a1e)?, rt.generator(0x7a1e)?);
    let mut graph = TrainStepGraph::capture(
        &rt,
        &random_vec(&mut rng, TB * TI),
        &random_vec(&mut rng, n),
        &mut gw,
        &scale,
        &gg,
        &mut g_ema,
        n,
        n,
        n,
        nw,
    )?;
    {
        let st = graph.state_mut();
        assert_eq!(
            s.clone_dtoh(&st.w)?,
            w0,
            "the warmup's weight updates were undone"
        );
        assert_eq!(
            s.clone_dtoh(&st.ema)?,
            ema0,
            "the warmup's averages were undone"
        );
    }
    let (mut ey, mut em, mut es, mut eg) = (
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<u8>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(nw)?,
    );
    for replay in 0..5 {
        let (x, target) = (random_vec(&mut rng, TB * TI), random_vec(&mut rng, n));
        let out = graph.replay(&x, &target)?;
        let (gy, gm, gs, gr) = (
            s.clone_dtoh(out.y)?,
            s.clone_dtoh(out.mask)?,
            s.clone_dtoh(out.side)?,
            s.clone_dtoh(out.grad)?,
        );
        train_step(
            &rt,
            &s.clone_htod(&x)?,
            &s.clone_htod(&target)?,
            &mut ew,
            &scale,
            &ge,
            &mut e_ema,
            &mut ey,
            &mut em,
            &mut es,
            &mut eg,
        )?;
        let at = format!("replay {replay}");
        assert_eq!(gm, s.clone_dtoh(&em)?, "{at}: dropout mask, graph vs eager");
        assert!(
            gm.contains(&0) && gm.contains(&1),
            "{at}: the mask keeps some and drops some"
        );
        assert_eq!(
            gy,
            s.clone_dtoh(&ey)?,
            "{at}: y (GEMM, dropout), graph vs eager"
        );
        assert_eq!(
            gs,
            s.clone_dtoh(&es)?,
            "{at}: the side branch, graph vs eager"
        );
        assert_eq!(
            gr,
            s.clone_dtoh(&eg)?,
            "{at}: the gradient GEMM, graph vs eager"
        );
        let st = graph.state_mut();
        assert_eq!(
            s.clone_dtoh(&st.w)?,
            s.clone_dtoh(&ew)?,
            "{at}: the weights (`&mut` state), graph vs eager"
        );
        assert_eq!(
            s.clone_dtoh(&st.ema)?,
            s.clone_dtoh(&e_ema)?,
            "{at}: the side branch's `&mut` state, graph vs eager"
        );
        assert_eq!(
            gg.seed_and_offset(&rt)?,
            ge.seed_and_offset(&rt)?,
            "{at}: generator offsets"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 9. Unrolled loops inside a loop, with a branch in every step.

/// Rows of the nested-loop test.
const TROWS: usize = 12;

/// For each row `i < rows[0]` (a `graph_while`), an inner loop over `j = 1 ..= i + 1`
/// (`graph_while_unrolled`, `unroll` steps per loop node): `acc[i] += j`, then, in a
/// `graph_if`, `acc[i] = -acc[i]` when `j` is odd. With `per_step`, each of the `unroll`
/// copies of the step tests a condition of its own (a condition is tested by one conditional
/// node); without, one condition serves every step.
#[cuda_graph(warmup = 1, check_determinism = true)]
fn rows_unrolled(
    rt: &Runtime,
    rows: &CudaSlice<u32>,
    acc: &mut CudaSlice<f32>,
    #[constant] unroll: u32,
    #[constant] per_step: bool,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let (add_j, negate_row, inner_next, outer_step) = (
        rt.function(K, "add_j")?,
        rt.function(K, "negate_row")?,
        rt.function(K, "inner_next")?,
        rt.function(K, "outer_step")?,
    );
    s.memset_zeros(&mut *acc)?;
    let mut ij = s.alloc_zeros::<u32>(2)?;
    let outer = rt.condition(true)?;
    let inner = rt.condition(true)?;
    let branches = if per_step { unroll } else { 1 };
    let odd: Vec<Condition> = (0..branches)
        .map(|_| rt.condition(false))
        .collect::<Result<_, _>>()?;
    let mut step = 0usize;
    rt.graph_while(&outer, Some(TROWS as u32), |rt| {
        inner.set(rt, true)?;
        rt.graph_while_unrolled(&inner, Some(TROWS as u32 + 1), unroll, |rt| {
            let odd = &odd[step % odd.len()];
            step += 1;
            let (c_inner, c_odd) = (inner.kernel_arg(rt), odd.kernel_arg(rt));
            // SAFETY: `add_j` reads and writes the two words of `ij` and `acc[ij[0]]`
            // (ij[0] < TROWS: the outer loop is bounded by it), reads `inner`, sets `odd`.
            unsafe {
                rt.stream()
                    .launch_builder(&add_j)
                    .arg(&mut ij)
                    .arg(&mut *acc)
                    .arg(&c_inner)
                    .arg(&c_odd)
                    .launch(one())
            }?;
            rt.graph_if(odd, |rt| {
                // SAFETY: `negate_row` reads `ij[0]` (< TROWS) and updates `acc[ij[0]]`.
                unsafe {
                    rt.stream()
                        .launch_builder(&negate_row)
                        .arg(&ij)
                        .arg(&mut *acc)
                        .launch(one())
                }?;
                Ok(())
            })?;
            let c_inner = inner.kernel_arg(rt);
            // SAFETY: `inner_next` reads the two words of `ij` and sets `inner`.
            unsafe {
                rt.stream()
                    .launch_builder(&inner_next)
                    .arg(&ij)
                    .arg(&c_inner)
                    .launch(one())
            }?;
            Ok(())
        })?;
        let c_outer = outer.kernel_arg(rt);
        // SAFETY: `outer_step` updates the two words of `ij`, reads one of `rows`, sets `outer`.
        unsafe {
            rt.stream()
                .launch_builder(&outer_step)
                .arg(&mut ij)
                .arg(rows)
                .arg(&c_outer)
                .launch(one())
        }?;
        Ok(())
    })
}

/// What `rows_unrolled` computes, on the host (small integers: exact).
fn rows_on_host(rows: u32) -> Vec<f32> {
    let mut acc = vec![0.0f32; TROWS];
    let rows = (rows.max(1) as usize).min(TROWS);
    for (i, a) in acc.iter_mut().enumerate().take(rows) {
        for j in 1..=i + 1 {
            *a += j as f32;
            if j % 2 == 1 {
                *a = -*a;
            }
        }
    }
    acc
}

/// Pairs: while × unrolled, if × unrolled.
/// A `graph_while_unrolled` nested in a `graph_while`, with a `graph_if` in every step (one
/// condition per copy of the step), unrolled by 1 (a plain loop), 2 and 3: six replays each
/// with random row counts (inner trip counts 1 to 12, most not multiples of the unroll) equal
/// eager calls and the host bitwise.
#[gpu_test]
fn unrolled_loops_with_a_branch_per_step_inside_a_loop_match_eager_and_the_host(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng =
        fresh_rng("unrolled_loops_with_a_branch_per_step_inside_a_loop_match_eager_and_the_host");
    let s = rt.stream().clone();
    let mut eager = s.alloc_zeros::<f32>(TROWS)?;
    for unroll in [1u32, 2, 3] {
        let mut graph = RowsUnrolledGraph::capture(&rt, [4u32].as_slice(), TROWS, unroll, true)?;
        // The outer loop, the inner one and a branch in each of the `unroll` copies of the step.
        assert_eq!(
            graph.info().kinds.conditionals,
            2 + unroll as usize,
            "unroll {unroll}: conditional nodes: {:?}",
            graph.info()
        );
        for replay in 0..6 {
            let rows: u32 = if replay == 0 {
                TROWS as u32
            } else {
                rng.random_range(1..=TROWS as u32)
            };
            let got = s.clone_dtoh(graph.replay([rows].as_slice())?.acc)?;
            rows_unrolled(&rt, &s.clone_htod(&[rows])?, &mut eager, unroll, true)?;
            let want = rows_on_host(rows);
            let at = format!("unroll {unroll}, replay {replay}, {rows} rows");
            assert_eq!(got, want, "{at}: graph vs host");
            assert_eq!(s.clone_dtoh(&eager)?, want, "{at}: eager vs host");
        }
    }
    Ok(())
}

/// Pairs: if × unrolled.
/// One condition for the `graph_if` of every step of a `graph_while_unrolled` (unrolled by 3,
/// inside a `graph_while`): eagerly the step runs once per host iteration and the result is
/// the host's, but a capture records the step three times, so three conditional nodes would
/// test one condition: refused with `ConditionMisuse` in the scratch check of the loops' bodies
/// (never inside a node's own body), and the runtime captures new graphs afterwards.
#[gpu_test]
fn refused_one_branch_condition_for_every_copy_of_an_unrolled_step(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("refused_one_branch_condition_for_every_copy_of_an_unrolled_step");
    let s = rt.stream().clone();
    let mut eager = s.alloc_zeros::<f32>(TROWS)?;
    let rows = 7u32;
    rows_unrolled(&rt, &s.clone_htod(&[rows])?, &mut eager, 3, false)?;
    assert_eq!(s.clone_dtoh(&eager)?, rows_on_host(rows), "eager vs host");
    let err = RowsUnrolledGraph::capture(&rt, [rows].as_slice(), TROWS, 3, false)
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(err, GraphError::ConditionalBody { .. })
            && matches!(
                innermost(&err),
                GraphError::ConditionMisuse {
                    construct: "graph_if",
                    ..
                }
            )
            && err.to_string().contains("more than one recorded copy"),
        "{err:?}"
    );
    runtime_still_works(&rt, &mut rng, "one branch condition for three steps")
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
