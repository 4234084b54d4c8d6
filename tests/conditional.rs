//! Loops and branches on the GPU (`graph_while`, `graph_if`, `graph_if_else`): replay against
//! eager execution on fresh random inputs, several replays, inputs changed between them;
//! conditions set by the library's kernels and by kernels of the test through the device
//! API; the iteration bound; nesting; random numbers drawn inside a loop; unrolled loops
//! (`graph_while_unrolled`) against eager and the plain loop, trip counts not multiples of
//! the unroll factor, the bound mid-iteration; a kernel with shared memory and barriers as a
//! plain node, a loop body and a branch; and the typed
//! errors for what a conditional body must not record, with the runtime usable afterwards.
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead. The tests whose names start with `refused_`
//! check error paths; run them apart with the filter `refused_` when hunting a crash.

use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::rng::reference_uniform_in;
use graph_runtime::{cuda_graph, Compare, GraphError, Runtime, Tolerance};
use rand::Rng;
use workloads::testing::{cpu_test, fresh_rng, gpu_test, random_vec};

/// The test's kernels, on the conditional device API.
const SRC: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
// y = 0.5 y (every element); iters[0] += 1.
extern "C" __global__ void halve_count(float *y, int n, unsigned int *iters) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] *= 0.5f;
    if (blockIdx.x == 0 && threadIdx.x == 0) iters[0] += 1u;
}

// count += 1; go on while count < stop.
extern "C" __global__ void count_until(unsigned int *count, const unsigned int *stop, GraphCondition go) {
    unsigned int c = *count + 1u;
    *count = c;
    graph_condition_set(go, c < *stop);
}

// count += 1, and nothing else: a loop whose condition never clears.
extern "C" __global__ void count_only(unsigned int *count) { *count += 1u; }

// The three above for graph_while_unrolled: nothing changes once an earlier step of the
// iteration cleared the condition.
extern "C" __global__ void halve_count_guarded(float *y, int n, unsigned int *iters, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] *= 0.5f;
    if (blockIdx.x == 0 && threadIdx.x == 0) iters[0] += 1u;
}

extern "C" __global__ void count_until_guarded(unsigned int *count, const unsigned int *stop, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    unsigned int c = *count + 1u;
    *count = c;
    graph_condition_set(go, c < *stop);
}

// count_until_guarded in the read-first form: the condition read before the kernel's own
// loads, tested before its stores, and set without a second read.
extern "C" __global__ void count_until_read_first(unsigned int *count, const unsigned int *stop, GraphCondition go) {
    bool active = graph_condition_active(go);
    unsigned int c = *count + 1u;
    unsigned int last = *stop;
    if (!active) return;
    *count = c;
    graph_condition_set_active(go, c < last);
}

extern "C" __global__ void count_only_guarded(unsigned int *count, GraphCondition go) {
    if (graph_condition_active(go)) *count += 1u;
}

// The ring form of an unrolled loop: dst = 0.5 src with no guard (a step after the last one
// writes scratch and a ring position the result is not at).
extern "C" __global__ void halve_into(const float *src, float *dst, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = 0.5f * src[i];
}

// After the ring loop: y = ring position iters[0] % k (0: y itself, p: ring[(p - 1) n ..]).
extern "C" __global__ void ring_take(float *y, const float *ring, const unsigned int *iters, int n, unsigned int k) {
    unsigned int p = iters[0] % k;
    if (p == 0u) return;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = ring[(p - 1u) * n + i];
}

// y = a x + b.
extern "C" __global__ void affine(const float *x, float *y, int n, float a, float b) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * x[i] + b;
}

// Inner loop step of the nested test: acc[i] += j + 1; j += 1; again while j < i + 1.
extern "C" __global__ void inner_step(unsigned int *ij, float *acc, GraphCondition inner) {
    unsigned int i = ij[0], j = ij[1];
    acc[i] += (float)(j + 1u);
    ij[1] = j + 1u;
    graph_condition_set(inner, j + 1u < i + 1u);
}

// odd = i is odd.
extern "C" __global__ void parity(const unsigned int *ij, GraphCondition odd) {
    graph_condition_set(odd, (ij[0] & 1u) == 1u);
}

// acc[i] = -acc[i].
extern "C" __global__ void negate_row(const unsigned int *ij, float *acc) { acc[ij[0]] = -acc[ij[0]]; }

// Outer loop step: i += 1; j = 0; again while i < rows.
extern "C" __global__ void outer_step(unsigned int *ij, const unsigned int *rows, GraphCondition outer) {
    unsigned int i = ij[0] + 1u;
    ij[0] = i;
    ij[1] = 0u;
    graph_condition_set(outer, i < *rows);
}

// out[row * n + i] = tmp[i] for row = *row.
extern "C" __global__ void store_row(const float *tmp, float *out, const unsigned int *row, int n) {
    unsigned int r = *row;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[r * n + i] = tmp[i];
}

// row += 1; go on while row < rows.
extern "C" __global__ void next_row(unsigned int *row, const unsigned int *rows, GraphCondition go) {
    unsigned int r = *row + 1u;
    *row = r;
    graph_condition_set(go, r < *rows);
}
// Per block of 256 threads: sums[block] = the block's sum of y, a tree in shared memory
// with a barrier per level; then y = 0.5 y. Launch with blocks of 256 over n = 256 k.
extern "C" __global__ void halve_with_block_sums(float *y, float *sums) {
    __shared__ float part[256];
    unsigned int i = blockIdx.x * 256u + threadIdx.x;
    float v = y[i];
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = 128u; s > 0u; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0u) sums[blockIdx.x] = part[0];
    y[i] = 0.5f * v;
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

// ---------------------------------------------------------------------------------------
// 1. A loop whose trip count depends on the input, with the library's comparison kernel.

/// `y = x`, then halves `y` while `y[0] > 1`, counting the iterations.
#[cuda_graph(warmup = 2, check_determinism)]
fn halve_until_small(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let halve = rt.function(SRC, "halve_count")?;
    let n = x.len() as i32;
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while(&go, Some(1000), |rt| {
        // SAFETY: `halve_count` reads and writes `n` floats of `y` and one word of `iters`.
        unsafe {
            rt.stream()
                .launch_builder(&halve)
                .arg(&mut *y)
                .arg(&n)
                .arg(&mut *iters)
                .launch(grid(n as usize))
        }?;
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })
}

/// What `halve_until_small` computes, on the host (halving is exact).
fn halve_on_host(x: &[f32]) -> (Vec<f32>, u32) {
    let mut y = x.to_vec();
    let mut iters = 0;
    while y[0] > 1.0 {
        y.iter_mut().for_each(|v| *v *= 0.5);
        iters += 1;
    }
    (y, iters)
}

#[gpu_test]
fn while_loop_replays_match_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("while_loop_replays_match_eager");
    let n = 1000;
    let s = rt.stream().clone();
    let input = |rng: &mut rand::rngs::SmallRng| {
        let mut x = random_vec(rng, n);
        // 0 to ~17 iterations: x[0] in (0.05, 1e5).
        x[0] = rng.random_range(-3.0f32..11.5).exp();
        x
    };
    let mut graph = HalveUntilSmallGraph::capture(&rt, &input(&mut rng), n, 1)?;
    let kinds = graph.info().kinds;
    assert_eq!(kinds.conditionals, 1, "{:?}", graph.info());
    let (mut ey, mut ei) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<u32>(1)?);
    let mut trips = Vec::new();
    for replay in 0..8 {
        let x = input(&mut rng);
        let out = graph.replay(&x)?;
        let (gy, gi) = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.iters)?[0]);
        halve_until_small(&rt, &s.clone_htod(&x)?, &mut ey, &mut ei)?;
        let (hy, hi) = halve_on_host(&x);
        assert_eq!(gi, hi, "replay {replay}: iterations, graph vs host");
        assert_eq!(
            s.clone_dtoh(&ei)?[0],
            hi,
            "replay {replay}: iterations, eager vs host"
        );
        assert_eq!(gy, hy, "replay {replay}: graph vs host, bitwise");
        assert_eq!(
            s.clone_dtoh(&ey)?,
            hy,
            "replay {replay}: eager vs host, bitwise"
        );
        trips.push(gi);
    }
    trips.sort_unstable();
    trips.dedup();
    assert!(trips.len() >= 3, "the trip counts varied: {trips:?}");
    // verify: the body eagerly on the same input, against a replay.
    let report = graph.verify(&input(&mut rng), Tolerance::BITWISE)?;
    assert!(report.is_ok(), "{report}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 2. A condition set by a kernel of the test, and the iteration bound.

/// `count = 0`; then `count += 1` while `count < stop[0]`, at most `BOUND` times.
#[cuda_graph(warmup = 2)]
fn count_to(
    rt: &Runtime,
    stop: &CudaSlice<u32>,
    count: &mut CudaSlice<u32>,
) -> Result<(), GraphError> {
    let f = rt.function(SRC, "count_until")?;
    rt.stream().memset_zeros(&mut *count)?;
    let go = rt.condition(true)?;
    rt.graph_while(&go, Some(BOUND), |rt| {
        let arg = go.kernel_arg(rt);
        // SAFETY: `count_until` reads one word of `stop`, updates one of `count`, sets `go`.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&mut *count)
                .arg(stop)
                .arg(&arg)
                .launch(one())
        }?;
        Ok(())
    })
}

const BOUND: u32 = 10;

/// The same without a bound.
#[cuda_graph(warmup = 1)]
fn count_to_unbounded(
    rt: &Runtime,
    stop: &CudaSlice<u32>,
    count: &mut CudaSlice<u32>,
) -> Result<(), GraphError> {
    let f = rt.function(SRC, "count_until")?;
    rt.stream().memset_zeros(&mut *count)?;
    let go = rt.condition(true)?;
    rt.graph_while(&go, None, |rt| {
        let arg = go.kernel_arg(rt);
        // SAFETY: as in `count_to`.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&mut *count)
                .arg(stop)
                .arg(&arg)
                .launch(one())
        }?;
        Ok(())
    })
}

#[gpu_test]
fn device_api_condition_and_iteration_bound(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("device_api_condition_and_iteration_bound");
    let s = rt.stream().clone();
    let mut bounded = CountToGraph::capture(&rt, [3u32].as_slice(), 1)?;
    let mut free = CountToUnboundedGraph::capture(&rt, [3u32].as_slice(), 1)?;
    let mut eager = s.alloc_zeros::<u32>(1)?;
    for replay in 0..10 {
        // The first iteration always runs (the condition starts true): at least 1.
        let stop: u32 = if replay == 0 {
            1_000_000
        } else {
            rng.random_range(1..=2 * BOUND)
        };
        let got = s.clone_dtoh(bounded.replay([stop].as_slice())?.count)?[0];
        count_to(&rt, &s.clone_htod(&[stop])?, &mut eager)?;
        let want = stop.clamp(1, BOUND);
        assert_eq!(got, want, "replay {replay}, stop {stop}: bounded graph");
        assert_eq!(s.clone_dtoh(&eager)?[0], want, "stop {stop}: bounded eager");
        if stop <= 2 * BOUND {
            let got = s.clone_dtoh(free.replay([stop].as_slice())?.count)?[0];
            assert_eq!(
                got,
                stop.max(1),
                "replay {replay}, stop {stop}: unbounded graph"
            );
        }
    }
    Ok(())
}

/// A loop whose condition nothing clears: the bound alone ends it.
#[cuda_graph(warmup = 1)]
fn never_clears(rt: &Runtime, count: &mut CudaSlice<u32>) -> Result<(), GraphError> {
    let f = rt.function(SRC, "count_only")?;
    rt.stream().memset_zeros(&mut *count)?;
    let go = rt.condition(true)?;
    rt.graph_while(&go, Some(7), |rt| {
        // SAFETY: `count_only` updates one word of `count`.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&mut *count)
                .launch(one())
        }?;
        Ok(())
    })
}

#[gpu_test]
fn the_bound_ends_a_loop_that_never_clears(rt: Runtime) -> Result<(), GraphError> {
    let s = rt.stream().clone();
    let mut eager = s.alloc_zeros::<u32>(1)?;
    never_clears(&rt, &mut eager)?;
    assert_eq!(s.clone_dtoh(&eager)?, vec![7], "eager");
    let mut graph = NeverClearsGraph::capture(&rt, 1)?;
    for replay in 0..3 {
        assert_eq!(
            s.clone_dtoh(graph.replay()?.count)?,
            vec![7],
            "replay {replay}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 3. Branches.

/// `y = 2x` when `x[0] > 0` (else `y` stays 0); `z = x + 1` when `x[0] > 0`, else `x - 1`.
#[cuda_graph(warmup = 2, check_determinism)]
fn branchy(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let f = rt.function(SRC, "affine")?;
    let n = x.len() as i32;
    rt.stream().memset_zeros(&mut *y)?;
    // One condition per construct: CUDA ties a conditional handle to one node.
    let positive = rt.condition(false)?;
    positive.set_from(rt, x, Compare::Gt, 0.0)?;
    let positive_too = rt.condition(false)?;
    positive_too.set_from(rt, x, Compare::Gt, 0.0)?;
    let affine = |rt: &Runtime, out: &mut CudaSlice<f32>, a: f32, b: f32| {
        // SAFETY: `affine` reads `n` floats of `x` and writes `n` of `out`.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(x)
                .arg(out)
                .arg(&n)
                .arg(&a)
                .arg(&b)
                .launch(grid(n as usize))
        }
        .map(drop)
        .map_err(GraphError::from)
    };
    rt.graph_if(&positive, |rt| affine(rt, &mut *y, 2.0, 0.0))?;
    rt.graph_if_else(&positive_too, |rt, positive| {
        let b = if positive { 1.0 } else { -1.0 };
        affine(rt, &mut *z, 1.0, b)
    })
}

#[gpu_test]
fn branches_follow_the_input(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("branches_follow_the_input");
    let n = 777;
    let s = rt.stream().clone();
    let mut graph = BranchyGraph::capture(&rt, &random_vec(&mut rng, n), n, n)?;
    assert_eq!(graph.info().kinds.conditionals, 2, "{:?}", graph.info());
    let (mut ey, mut ez) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    let mut taken = [0usize; 2];
    for replay in 0..10 {
        let mut x = random_vec(&mut rng, n);
        if replay < 2 {
            x[0] = if replay == 0 { 0.5 } else { -0.5 }; // both ways at least once
        }
        let out = graph.replay(&x)?;
        let (gy, gz) = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.z)?);
        branchy(&rt, &s.clone_htod(&x)?, &mut ey, &mut ez)?;
        let pos = x[0] > 0.0;
        taken[usize::from(pos)] += 1;
        let hy: Vec<f32> = x.iter().map(|v| if pos { 2.0 * v } else { 0.0 }).collect();
        let hz: Vec<f32> = x
            .iter()
            .map(|v| if pos { v + 1.0 } else { v - 1.0 })
            .collect();
        assert_eq!(gy, hy, "replay {replay} (x[0] = {}): if, graph", x[0]);
        assert_eq!(gz, hz, "replay {replay}: if/else, graph");
        assert_eq!(s.clone_dtoh(&ey)?, hy, "replay {replay}: if, eager");
        assert_eq!(s.clone_dtoh(&ez)?, hz, "replay {replay}: if/else, eager");
    }
    assert!(taken[0] > 0 && taken[1] > 0, "both branches ran: {taken:?}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 4. Nesting: a loop and a branch inside a loop.

const ROWS: usize = 16;

/// For `i < rows[0]`: `acc[i] = 1 + 2 + … + (i + 1)` (an inner loop), negated for odd `i`
/// (a branch).
#[cuda_graph(warmup = 1, check_determinism)]
fn triangle(
    rt: &Runtime,
    rows: &CudaSlice<u32>,
    acc: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let (inner_step, parity, negate, outer_step) = (
        rt.function(SRC, "inner_step")?,
        rt.function(SRC, "parity")?,
        rt.function(SRC, "negate_row")?,
        rt.function(SRC, "outer_step")?,
    );
    s.memset_zeros(&mut *acc)?;
    let mut ij = s.alloc_zeros::<u32>(2)?;
    let outer = rt.condition(true)?;
    let inner = rt.condition(true)?;
    let odd = rt.condition(false)?;
    rt.graph_while(&outer, Some(ROWS as u32), |rt| {
        let s = rt.stream();
        inner.set(rt, true)?;
        rt.graph_while(&inner, Some(ROWS as u32 + 1), |rt| {
            let c = inner.kernel_arg(rt);
            // SAFETY: `inner_step` updates two words of `ij` and one float of `acc` at
            // index ij[0] < ROWS (the outer loop stops at rows <= ROWS).
            unsafe {
                rt.stream()
                    .launch_builder(&inner_step)
                    .arg(&mut ij)
                    .arg(&mut *acc)
                    .arg(&c)
                    .launch(one())
            }?;
            Ok(())
        })?;
        let c = odd.kernel_arg(rt);
        // SAFETY: `parity` reads one word of `ij` and sets `odd`.
        unsafe { s.launch_builder(&parity).arg(&ij).arg(&c).launch(one()) }?;
        rt.graph_if(&odd, |rt| {
            // SAFETY: `negate_row` reads one word of `ij` and updates acc[ij[0]].
            unsafe {
                rt.stream()
                    .launch_builder(&negate)
                    .arg(&ij)
                    .arg(&mut *acc)
                    .launch(one())
            }?;
            Ok(())
        })?;
        let c = outer.kernel_arg(rt);
        // SAFETY: `outer_step` updates `ij`, reads one word of `rows`, sets `outer`.
        unsafe {
            s.launch_builder(&outer_step)
                .arg(&mut ij)
                .arg(rows)
                .arg(&c)
                .launch(one())
        }?;
        Ok(())
    })
}

fn triangle_on_host(rows: u32) -> Vec<f32> {
    let mut acc = vec![0.0f32; ROWS];
    let rows = (rows.max(1) as usize).min(ROWS);
    for (i, a) in acc.iter_mut().enumerate().take(rows) {
        let t = ((i + 1) * (i + 2) / 2) as f32;
        *a = if i % 2 == 1 { -t } else { t };
    }
    acc
}

#[gpu_test]
fn nested_loops_and_branches_match_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("nested_loops_and_branches_match_eager");
    let s = rt.stream().clone();
    let mut graph = TriangleGraph::capture(&rt, [4u32].as_slice(), ROWS)?;
    assert_eq!(graph.info().kinds.conditionals, 3, "{:?}", graph.info());
    let mut eager = s.alloc_zeros::<f32>(ROWS)?;
    for replay in 0..6 {
        let rows: u32 = rng.random_range(1..=ROWS as u32);
        let got = s.clone_dtoh(graph.replay([rows].as_slice())?.acc)?;
        triangle(&rt, &s.clone_htod(&[rows])?, &mut eager)?;
        let want = triangle_on_host(rows);
        assert_eq!(got, want, "replay {replay}, rows {rows}: graph");
        assert_eq!(s.clone_dtoh(&eager)?, want, "rows {rows}: eager");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 5. Random numbers drawn inside a loop body.

const DRAW_N: usize = 1000;
const DRAW_ROWS: usize = 8;

/// Row `r < rows[0]` of `out` is a fresh uniform draw of `DRAW_N` values, one per iteration.
#[cuda_graph(warmup = 2)]
fn draw_rows(
    rt: &Runtime,
    rows: &CudaSlice<u32>,
    out: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let (store, next) = (
        rt.function(SRC, "store_row")?,
        rt.function(SRC, "next_row")?,
    );
    let n = DRAW_N as i32;
    s.memset_zeros(&mut *out)?;
    let mut tmp = s.alloc_zeros::<f32>(DRAW_N)?;
    let mut row = s.alloc_zeros::<u32>(1)?;
    let go = rt.condition(true)?;
    rt.graph_while(&go, Some(DRAW_ROWS as u32), |rt| {
        rt.rng().uniform(rt, &mut tmp, 0.0, 1.0)?;
        let c = go.kernel_arg(rt);
        // SAFETY: `store_row` reads `n` floats of `tmp` and one word of `row` (< DRAW_ROWS:
        // the loop is bounded by it) and writes row `row` of `out` (DRAW_ROWS × n floats);
        // `next_row` updates `row`, reads `rows` and sets `go`.
        unsafe {
            rt.stream()
                .launch_builder(&store)
                .arg(&tmp)
                .arg(&mut *out)
                .arg(&row)
                .arg(&n)
                .launch(grid(DRAW_N))?;
            rt.stream()
                .launch_builder(&next)
                .arg(&mut row)
                .arg(rows)
                .arg(&c)
                .launch(one())?;
        }
        Ok(())
    })
}

/// What `draw_rows` writes for `rows` rows from a generator at `(seed, offset)`.
fn draws_on_host(seed: u64, offset: u64, rows: u32) -> Vec<f32> {
    let groups = DRAW_N.div_ceil(4) as u64;
    let mut out = vec![0.0f32; DRAW_ROWS * DRAW_N];
    for r in 0..rows.max(1) as usize {
        for i in 0..DRAW_N {
            out[r * DRAW_N + i] =
                reference_uniform_in(seed, offset + r as u64 * groups, i as u64, 0.0, 1.0);
        }
    }
    out
}

#[gpu_test]
fn random_numbers_inside_a_loop_are_fresh_every_iteration(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("random_numbers_inside_a_loop_are_fresh_every_iteration");
    let s = rt.stream().clone();
    let mut graph = DrawRowsGraph::capture(&rt, [2u32].as_slice(), DRAW_ROWS * DRAW_N)?;
    let mut eager = s.alloc_zeros::<f32>(DRAW_ROWS * DRAW_N)?;
    let mut previous: Option<Vec<f32>> = None;
    for replay in 0..5 {
        let rows: u32 = rng.random_range(2..=DRAW_ROWS as u32);
        // The generator's position before the replay, read on the host between launches.
        let (seed, offset) = rt.rng().seed_and_offset(&rt)?;
        let got = s.clone_dtoh(graph.replay([rows].as_slice())?.out)?;
        let want = draws_on_host(seed, offset, rows);
        assert_eq!(
            got, want,
            "replay {replay}, {rows} rows: graph vs host Philox"
        );
        let rows_of = |v: &[f32], r: usize| v[r * DRAW_N..(r + 1) * DRAW_N].to_vec();
        assert_ne!(
            rows_of(&got, 0),
            rows_of(&got, 1),
            "fresh numbers per iteration"
        );
        if let Some(p) = &previous {
            assert_ne!(rows_of(p, 0), rows_of(&got, 0), "fresh numbers per replay");
        }
        // Eagerly from the same position: the same numbers.
        let (seed, offset) = rt.rng().seed_and_offset(&rt)?;
        draw_rows(&rt, &s.clone_htod(&[rows])?, &mut eager)?;
        assert_eq!(
            s.clone_dtoh(&eager)?,
            draws_on_host(seed, offset, rows),
            "eager, {rows} rows"
        );
        previous = Some(got);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 6. What a body must not record: typed errors, and the runtime stays usable.

/// Allocates a temporary inside the loop's closure.
#[cuda_graph(warmup = 1)]
fn allocates_in_body(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_while(&go, Some(3), |rt| {
        let tmp = rt.stream().alloc_zeros::<f32>(y.len())?;
        rt.stream().memcpy_dtod(&tmp, &mut *y)?;
        Ok(())
    })
}

/// `Runtime::synchronize` in a helper (written in the body, the macro would reject it).
fn runtime_sync(rt: &Runtime) -> Result<(), GraphError> {
    rt.synchronize()
}

/// Synchronizes inside the loop's closure through the runtime (refused before CUDA sees it).
#[cuda_graph(warmup = 1)]
fn syncs_in_body(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_while(&go, Some(2), |rt| {
        rt.stream().memset_zeros(&mut *y)?;
        runtime_sync(rt)
    })
}

/// A helper the macro does not look into: a raw stream synchronize.
fn wait_for(stream: &CudaStream) -> Result<(), GraphError> {
    stream.synchronize()?;
    Ok(())
}

/// Synchronizes inside a branch through a helper (CUDA invalidates the recording).
#[cuda_graph(warmup = 1)]
fn helper_syncs_in_body(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_if(&go, |rt| {
        rt.stream().memset_zeros(&mut *y)?;
        wait_for(rt.stream())
    })
}

/// Creates a condition inside a closure.
#[cuda_graph(warmup = 1)]
fn condition_in_body(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_if(&go, |rt| {
        let _inner = rt.condition(true)?;
        rt.stream().memset_zeros(&mut *y)?;
        Ok(())
    })
}

/// Creates a condition and never tests it.
#[cuda_graph(warmup = 1)]
fn unused_condition(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let _go = rt.condition(true)?;
    rt.stream().memset_zeros(&mut *y)?;
    Ok(())
}

/// One condition tested by two constructs.
#[cuda_graph(warmup = 1)]
fn condition_tested_twice(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_if(&go, |rt| Ok(rt.stream().memset_zeros(&mut *y)?))?;
    rt.graph_if(&go, |rt| Ok(rt.stream().memset_zeros(&mut *y)?))
}

/// A loop inside a fork's closure.
#[cuda_graph(warmup = 1)]
fn loop_in_fork(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(false)?;
    rt.fork(|_side| rt.graph_while(&go, Some(1), |rt| Ok(rt.stream().memset_zeros(&mut *y)?)))
}

/// After a refused capture, the runtime captures and replays another graph correctly.
fn still_usable(rt: &Runtime) -> Result<(), GraphError> {
    let s = rt.stream();
    let mut graph = CountToGraph::capture(rt, [4u32].as_slice(), 1)?;
    assert_eq!(
        s.clone_dtoh(graph.replay([4u32].as_slice())?.count)?,
        vec![4]
    );
    assert_eq!(
        s.clone_dtoh(graph.replay([6u32].as_slice())?.count)?,
        vec![6]
    );
    Ok(())
}

#[gpu_test]
fn refused_allocation_in_a_loop_body(rt: Runtime) -> Result<(), GraphError> {
    let s = rt.stream().clone();
    // Eagerly the allocation is fine.
    let mut y = s.alloc_zeros::<f32>(64)?;
    allocates_in_body(&rt, &mut y)?;
    let err = AllocatesInBodyGraph::capture(&rt, 64).unwrap_err();
    match &err {
        GraphError::ForbiddenInConditional {
            construct: "graph_while",
            graph: "allocates_in_body",
            what,
            ..
        } => assert!(what.contains("allocation"), "{err}"),
        other => panic!("expected ForbiddenInConditional, got {other:?}: {other}"),
    }
    assert!(
        err.to_string().contains("before the `graph_while` call"),
        "{err}"
    );
    still_usable(&rt)
}

#[gpu_test]
fn refused_sync_in_a_loop_body(rt: Runtime) -> Result<(), GraphError> {
    let err = SyncsInBodyGraph::capture(&rt, 64).unwrap_err();
    match &err {
        GraphError::ConditionalBody {
            construct: "graph_while",
            source,
            ..
        } => assert!(
            matches!(**source, GraphError::SyncInCapture { .. }),
            "{source:?}"
        ),
        other => panic!("expected ConditionalBody, got {other:?}: {other}"),
    }
    still_usable(&rt)?;
    // A raw synchronize in a helper: CUDA invalidates the (scratch) recording.
    let err = HelperSyncsInBodyGraph::capture(&rt, 64).unwrap_err();
    match &err {
        GraphError::ConditionalBody {
            construct: "graph_if",
            source,
            ..
        } => assert!(
            source.capture_code().is_some(),
            "a capture error: {source:?}"
        ),
        other => panic!("expected ConditionalBody, got {other:?}: {other}"),
    }
    eprintln!("a raw sync in a graph_if body: {err}");
    still_usable(&rt)
}

#[gpu_test]
fn refused_misplaced_conditions(rt: Runtime) -> Result<(), GraphError> {
    let s = rt.stream().clone();
    let mut y = s.alloc_zeros::<f32>(64)?;
    // Inside a closure: refused eagerly too, so the warmup already says it.
    let eager = condition_in_body(&rt, &mut y).unwrap_err();
    assert!(
        matches!(
            eager,
            GraphError::ConditionMisuse {
                construct: "Runtime::condition",
                ..
            }
        ),
        "{eager:?}"
    );
    let err = ConditionInBodyGraph::capture(&rt, 64).unwrap_err();
    assert!(err.to_string().contains("inside the closure"), "{err}");
    // Never tested: CUDA would refuse to instantiate; refused by name instead.
    unused_condition(&rt, &mut y)?;
    let err = UnusedConditionGraph::capture(&rt, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::UnusedCondition {
                graph: "unused_condition",
                ..
            }
        ),
        "{err:?}"
    );
    // Tested by two constructs: refused eagerly, and so by the warmup.
    let err = condition_tested_twice(&rt, &mut y).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::ConditionMisuse {
                construct: "graph_if",
                ..
            }
        ) && err.to_string().contains("already tested"),
        "{err:?}"
    );
    assert!(ConditionTestedTwiceGraph::capture(&rt, 64).is_err());
    // Inside a fork's closure.
    let err = loop_in_fork(&rt, &mut y).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::ConditionMisuse {
                construct: "graph_while",
                ..
            }
        ),
        "{err:?}"
    );
    still_usable(&rt)
}

// ---------------------------------------------------------------------------------------
// 7. Unrolled loops (`graph_while_unrolled`): the same steps as `graph_while`, bit for bit,
//    for trip counts that are and are not multiples of the unroll factor.

/// `halve_until_small` with `unroll` steps per iteration of the loop node.
#[cuda_graph(warmup = 2, check_determinism)]
fn halve_unrolled(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
    #[constant] unroll: u32,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let halve = rt.function(SRC, "halve_count_guarded")?;
    let n = x.len() as i32;
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while_unrolled(&go, Some(1000), unroll, |rt| {
        let arg = go.kernel_arg(rt);
        // SAFETY: `halve_count_guarded` reads and writes `n` floats of `y` and one word of
        // `iters`, and reads `go`.
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

#[gpu_test]
fn unrolled_while_loop_matches_eager_and_the_plain_loop(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("unrolled_while_loop_matches_eager_and_the_plain_loop");
    let n = 1000;
    let s = rt.stream().clone();
    let input = |rng: &mut rand::rngs::SmallRng| {
        let mut x = random_vec(rng, n);
        // 0 to ~17 iterations: x[0] in (0.05, 1e5).
        x[0] = rng.random_range(-3.0f32..11.5).exp();
        x
    };
    let mut plain = HalveUntilSmallGraph::capture(&rt, &input(&mut rng), n, 1)?;
    let (mut ey, mut ei) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<u32>(1)?);
    for unroll in [2u32, 3, 4, 8] {
        let mut graph = HalveUnrolledGraph::capture(&rt, &input(&mut rng), n, 1, unroll)?;
        let kinds = graph.info().kinds;
        assert_eq!(
            kinds.conditionals,
            1,
            "one loop node at the top: {:?}",
            graph.info()
        );
        let mut trips = Vec::new();
        for replay in 0..8 {
            let mut x = input(&mut rng);
            if replay == 0 {
                // unroll + 1 iterations, not a multiple of the unroll, whatever the seed.
                x[0] = 1.5 * 2f32.powi(unroll as i32);
            }
            let out = graph.replay(&x)?;
            let (gy, gi) = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.iters)?[0]);
            let out = plain.replay(&x)?;
            let (py, pi) = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.iters)?[0]);
            halve_unrolled(&rt, &s.clone_htod(&x)?, &mut ey, &mut ei, unroll)?;
            let (hy, hi) = halve_on_host(&x);
            let at = format!("unroll {unroll}, replay {replay}, {hi} iterations");
            assert_eq!(gi, hi, "{at}: iterations, unrolled graph vs host");
            assert_eq!(pi, hi, "{at}: iterations, plain graph vs host");
            assert_eq!(s.clone_dtoh(&ei)?[0], hi, "{at}: iterations, eager");
            assert_eq!(gy, hy, "{at}: unrolled graph vs host, bitwise");
            assert_eq!(gy, py, "{at}: unrolled vs plain graph, bitwise");
            assert_eq!(s.clone_dtoh(&ey)?, hy, "{at}: eager vs host, bitwise");
            trips.push(hi);
        }
        assert!(
            trips.iter().any(|t| t % unroll != 0),
            "unroll {unroll}: a trip count not a multiple of it: {trips:?}"
        );
        let report = graph.verify(&input(&mut rng), Tolerance::BITWISE)?;
        assert!(report.is_ok(), "unroll {unroll}: {report}");
    }
    Ok(())
}

/// `halve_until_small` unrolled in the ring form: step c halves y from ring position c % k
/// into (c + 1) % k (k = `unroll`; position 0 is `y`, the others a temporary) with a kernel
/// (into a scratch buffer) and a device copy that do not read the condition; only the count
/// and the library's setter are guarded.
/// The steps after the last one write positions the result is not at; after the loop,
/// `ring_take` copies the result into `y`.
#[cuda_graph(warmup = 2, check_determinism)]
fn halve_ring(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
    #[constant] bound: u32,
    #[constant] unroll: u32,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let halve = rt.function(SRC, "halve_into")?;
    let count = rt.function(SRC, "count_only_guarded")?;
    let take = rt.function(SRC, "ring_take")?;
    let n = x.len();
    let k = unroll as usize;
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    let mut ring = s.alloc_zeros::<f32>(n * (k - 1).max(1))?;
    let mut tmp = s.alloc_zeros::<f32>(n)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    let mut step = 0usize;
    let ni = n as i32;
    rt.graph_while_unrolled(&go, Some(bound), unroll, |rt| {
        let (from, to) = (step % k, (step + 1) % k);
        step += 1;
        let arg = go.kernel_arg(rt);
        let src = if from == 0 {
            y.slice(..)
        } else {
            ring.slice((from - 1) * n..from * n)
        };
        // SAFETY: `halve_into` reads `n` floats at one ring position (y or a block of `ring`,
        // (k - 1) n floats) and writes `n` of `tmp`.
        unsafe {
            rt.stream()
                .launch_builder(&halve)
                .arg(&src)
                .arg(&mut tmp)
                .arg(&ni)
                .launch(grid(n))
        }?;
        // A device copy (no guard possible) into the next position.
        if to == 0 {
            rt.stream().memcpy_dtod(&tmp, &mut *y)?;
        } else {
            rt.stream()
                .memcpy_dtod(&tmp, &mut ring.slice_mut((to - 1) * n..to * n))?;
        }
        // SAFETY: `count_only_guarded` updates one word of `iters` and reads `go`.
        unsafe {
            rt.stream()
                .launch_builder(&count)
                .arg(&mut *iters)
                .arg(&arg)
                .launch(one())?;
        }
        let now = if to == 0 {
            y.slice(..)
        } else {
            ring.slice((to - 1) * n..to * n)
        };
        go.set_from(rt, &now, Compare::Gt, 1.0)
    })?;
    let k32 = unroll;
    // SAFETY: `ring_take` reads one word of `iters` and copies `n` floats of a block of
    // `ring` into `y`.
    unsafe {
        s.launch_builder(&take)
            .arg(&mut *y)
            .arg(&ring)
            .arg(&*iters)
            .arg(&ni)
            .arg(&k32)
            .launch(grid(n))
    }?;
    Ok(())
}

#[gpu_test]
fn unrolled_ring_loop_with_unguarded_kernels_matches_eager_and_the_host(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("unrolled_ring_loop_with_unguarded_kernels_matches_eager_and_the_host");
    let n = 1000;
    let s = rt.stream().clone();
    let input = |rng: &mut rand::rngs::SmallRng| {
        let mut x = random_vec(rng, n);
        // 0 to ~17 iterations: x[0] in (0.05, 1e5).
        x[0] = rng.random_range(-3.0f32..11.5).exp();
        x
    };
    let (mut ey, mut ei) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<u32>(1)?);
    for (unroll, bound) in [(3u32, 1000u32), (4, 1000), (8, 1000), (4, 5)] {
        let mut graph = HalveRingGraph::capture(&rt, &input(&mut rng), n, 1, bound, unroll)?;
        let mut trips = Vec::new();
        for replay in 0..8 {
            let mut x = input(&mut rng);
            if replay == 0 {
                // unroll + 1 iterations, not a multiple of the unroll, whatever the seed.
                x[0] = 1.5 * 2f32.powi(unroll as i32);
            }
            let out = graph.replay(&x)?;
            let (gy, gi) = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.iters)?[0]);
            halve_ring(&rt, &s.clone_htod(&x)?, &mut ey, &mut ei, bound, unroll)?;
            // The host loop, stopped by the bound as well.
            let (mut hy, mut hi) = (x.clone(), 0u32);
            while hy[0] > 1.0 && hi < bound {
                hy.iter_mut().for_each(|v| *v *= 0.5);
                hi += 1;
            }
            let at = format!("unroll {unroll}, bound {bound}, replay {replay}, {hi} iterations");
            assert_eq!(gi, hi, "{at}: iterations, graph vs host");
            assert_eq!(s.clone_dtoh(&ei)?[0], hi, "{at}: iterations, eager");
            assert_eq!(gy, hy, "{at}: graph vs host, bitwise");
            assert_eq!(s.clone_dtoh(&ey)?, hy, "{at}: eager vs host, bitwise");
            trips.push(hi);
        }
        assert!(
            trips.iter().any(|t| t % unroll != 0),
            "unroll {unroll}: a trip count not a multiple of it: {trips:?}"
        );
        let report = graph.verify(&input(&mut rng), Tolerance::BITWISE)?;
        assert!(report.is_ok(), "unroll {unroll}: {report}");
    }
    Ok(())
}

/// `count_to` unrolled: the condition set by a kernel of the test (`kernel_arg` taken inside
/// the step), the bound counted in steps; the kernel tests the condition first, or
/// (`read_first`) reads it first and tests it before its stores.
#[cuda_graph(warmup = 2)]
fn count_to_unrolled(
    rt: &Runtime,
    stop: &CudaSlice<u32>,
    count: &mut CudaSlice<u32>,
    #[constant] bound: Option<u32>,
    #[constant] unroll: u32,
    #[constant] read_first: bool,
) -> Result<(), GraphError> {
    let kernel = if read_first {
        "count_until_read_first"
    } else {
        "count_until_guarded"
    };
    let f = rt.function(SRC, kernel)?;
    rt.stream().memset_zeros(&mut *count)?;
    let go = rt.condition(true)?;
    rt.graph_while_unrolled(&go, bound, unroll, |rt| {
        let arg = go.kernel_arg(rt);
        // SAFETY: `count_until` reads one word of `stop`, updates one of `count`, sets `go`.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&mut *count)
                .arg(stop)
                .arg(&arg)
                .launch(one())
        }?;
        Ok(())
    })
}

#[gpu_test]
fn unrolled_loop_stops_at_the_device_condition_and_the_bound(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("unrolled_loop_stops_at_the_device_condition_and_the_bound");
    let s = rt.stream().clone();
    let mut eager = s.alloc_zeros::<u32>(1)?;
    for (unroll, read_first) in [(3u32, false), (4, false), (3, true), (4, true)] {
        let mut bounded = CountToUnrolledGraph::capture(
            &rt,
            [3u32].as_slice(),
            1,
            Some(BOUND),
            unroll,
            read_first,
        )?;
        let mut free =
            CountToUnrolledGraph::capture(&rt, [3u32].as_slice(), 1, None, unroll, read_first)?;
        for replay in 0..12 {
            // The first iteration always runs (the condition starts true): at least 1.
            let stop: u32 = match replay {
                0 => 1_000_000,
                1 => BOUND,
                2 => BOUND + 1,
                _ => rng.random_range(1..=2 * BOUND),
            };
            let at =
                format!("unroll {unroll}, read first {read_first}, replay {replay}, stop {stop}");
            let got = s.clone_dtoh(bounded.replay([stop].as_slice())?.count)?[0];
            count_to_unrolled(
                &rt,
                &s.clone_htod(&[stop])?,
                &mut eager,
                Some(BOUND),
                unroll,
                read_first,
            )?;
            let want = stop.clamp(1, BOUND);
            assert_eq!(got, want, "{at}: bounded graph");
            assert_eq!(s.clone_dtoh(&eager)?[0], want, "{at}: bounded eager");
            if stop <= 2 * BOUND {
                let got = s.clone_dtoh(free.replay([stop].as_slice())?.count)?[0];
                assert_eq!(got, stop.max(1), "{at}: unbounded graph");
            }
        }
    }
    Ok(())
}

/// `never_clears` unrolled: the bound alone ends it, 7 steps with 3 per iteration.
#[cuda_graph(warmup = 1)]
fn never_clears_unrolled(rt: &Runtime, count: &mut CudaSlice<u32>) -> Result<(), GraphError> {
    let f = rt.function(SRC, "count_only_guarded")?;
    rt.stream().memset_zeros(&mut *count)?;
    let go = rt.condition(true)?;
    rt.graph_while_unrolled(&go, Some(7), 3, |rt| {
        let arg = go.kernel_arg(rt);
        // SAFETY: `count_only_guarded` updates one word of `count` and reads `go`.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&mut *count)
                .arg(&arg)
                .launch(one())
        }?;
        Ok(())
    })
}

/// `unroll = 0`: refused.
#[cuda_graph(warmup = 1)]
fn unrolled_zero(rt: &Runtime, count: &mut CudaSlice<u32>) -> Result<(), GraphError> {
    let go = rt.condition(false)?;
    rt.graph_while_unrolled(&go, Some(7), 0, |rt| {
        rt.stream().memset_zeros(&mut *count)?;
        Ok(())
    })
}

#[gpu_test]
fn unrolled_bound_ends_a_loop_that_never_clears(rt: Runtime) -> Result<(), GraphError> {
    let s = rt.stream().clone();
    let mut eager = s.alloc_zeros::<u32>(1)?;
    never_clears_unrolled(&rt, &mut eager)?;
    assert_eq!(s.clone_dtoh(&eager)?, vec![7], "eager");
    let mut graph = NeverClearsUnrolledGraph::capture(&rt, 1)?;
    for replay in 0..3 {
        assert_eq!(
            s.clone_dtoh(graph.replay()?.count)?,
            vec![7],
            "replay {replay}"
        );
    }
    // Refusals: typed errors (inside the warmup's or the loop body's error), runtime usable.
    let err = UnrolledZeroGraph::capture(&rt, 1).unwrap_err();
    let GraphError::Warmup { source, .. } = &err else {
        panic!("a refusal inside the warmup: {err:?}");
    };
    assert!(
        matches!(
            **source,
            GraphError::ConditionMisuse {
                construct: "graph_while_unrolled",
                ..
            }
        ) && source.to_string().contains("is 0"),
        "{err:?}"
    );
    still_usable(&rt)
}

// ---------------------------------------------------------------------------------------
// 8. Kernels with shared memory and barriers: in a plain graph, a loop body and a branch.

/// Blocks of `halve_with_block_sums`.
const BLOCKS: usize = 24;

/// `halve_with_block_sums` over `y` (`BLOCKS` blocks of 256), writing `sums`.
fn halve_with_block_sums(
    rt: &Runtime,
    y: &mut CudaSlice<f32>,
    sums: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let f = rt.function(SRC, "halve_with_block_sums")?;
    let cfg = LaunchConfig {
        grid_dim: (BLOCKS as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel reads and writes `256 * BLOCKS` floats of `y` (its length) and
    // writes `BLOCKS` of `sums` (its length); blocks of 256 as the kernel requires.
    unsafe { rt.stream().launch_builder(&f).arg(y).arg(sums).launch(cfg) }?;
    Ok(())
}

/// `y = x`, then three block-sum halvings as plain nodes.
#[cuda_graph(warmup = 2)]
fn block_sums_plain(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    sums: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, &mut *y)?;
    for _ in 0..3 {
        halve_with_block_sums(rt, &mut *y, &mut *sums)?;
    }
    Ok(())
}

/// `y = x`; block-sum halvings while `y[0] > 1`; one more, into `last`, when `flip > 0`.
#[cuda_graph(warmup = 2)]
fn block_sums_in_a_loop(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    flip: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    sums: &mut CudaSlice<f32>,
    last: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *sums)?;
    s.memset_zeros(&mut *last)?;
    let go = rt.condition(false)?;
    let positive = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    positive.set_from(rt, flip, Compare::Gt, 0.0)?;
    rt.graph_while(&go, Some(1000), |rt| {
        halve_with_block_sums(rt, &mut *y, &mut *sums)?;
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })?;
    rt.graph_if(&positive, |rt| {
        halve_with_block_sums(rt, &mut *y, &mut *last)
    })
}

/// `y`'s 256-element block sums on the host.
fn block_sums_on_host(y: &[f32]) -> Vec<f32> {
    y.chunks(256).map(|c| c.iter().sum::<f32>()).collect()
}

/// The GPU's block sums within rounding of the host's (the tree adds in another order).
fn assert_sums_close(got: &[f32], want: &[f32], what: &str) {
    for (b, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "{what}: block {b}: {g} on the GPU, {w} on the host"
        );
    }
}

/// An input whose first element takes 0 to ~17 halvings to reach 1.
fn halvings_input(rng: &mut rand::rngs::SmallRng, n: usize) -> Vec<f32> {
    let mut x = random_vec(rng, n);
    x[0] = rng.random_range(-3.0f32..11.5).exp();
    x
}

/// Block reductions through shared memory and `__syncthreads` as plain nodes: every replay
/// equals an eager call bitwise and the host's halvings exactly. (With the next test, this
/// gives compute-sanitizer's racecheck and synccheck a kernel with barriers and shared
/// memory in each place a graph can hold one.)
#[gpu_test]
fn shared_memory_reductions_as_plain_nodes_match_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("shared_memory_reductions_as_plain_nodes_match_eager");
    let n = 256 * BLOCKS;
    let s = rt.stream().clone();
    let mut graph = BlockSumsPlainGraph::capture(&rt, &halvings_input(&mut rng, n), n, BLOCKS)?;
    let (mut ey, mut es) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(BLOCKS)?);
    for replay in 0..6 {
        let x = halvings_input(&mut rng, n);
        let at = format!("replay {replay}");
        let out = graph.replay(&x)?;
        let (gy, gs) = (s.clone_dtoh(out.y)?, s.clone_dtoh(out.sums)?);
        block_sums_plain(&rt, &s.clone_htod(&x)?, &mut ey, &mut es)?;
        let hy: Vec<f32> = x.iter().map(|v| v * 0.125).collect();
        assert_eq!(gy, hy, "{at}: graph vs host");
        assert_eq!(s.clone_dtoh(&ey)?, hy, "{at}: eager vs host");
        assert_eq!(gs, s.clone_dtoh(&es)?, "{at}: the sums, graph vs eager");
        let before_last: Vec<f32> = x.iter().map(|v| v * 0.25).collect();
        assert_sums_close(&gs, &block_sums_on_host(&before_last), &at);
    }
    Ok(())
}

/// The same reduction as a loop body whose trip count follows the input and as a branch:
/// every replay equals an eager call bitwise and the host's halvings exactly.
#[gpu_test]
fn shared_memory_reductions_in_loop_bodies_and_branches_match_eager(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("shared_memory_reductions_in_loop_bodies_and_branches_match_eager");
    let n = 256 * BLOCKS;
    let s = rt.stream().clone();
    let x0 = halvings_input(&mut rng, n);
    let mut graph =
        BlockSumsInALoopGraph::capture(&rt, &x0, [1.0f32].as_slice(), n, BLOCKS, BLOCKS)?;
    assert_eq!(graph.info().kinds.conditionals, 2, "{:?}", graph.info());
    let (mut ey, mut es, mut el) = (
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(BLOCKS)?,
        s.alloc_zeros::<f32>(BLOCKS)?,
    );
    let mut trips = Vec::new();
    for replay in 0..8 {
        let x = halvings_input(&mut rng, n);
        let flip = match replay {
            0 => 0.5,
            1 => -0.5,
            _ => rng.random_range(-1.0f32..1.0),
        };
        let out = graph.replay(&x, [flip].as_slice())?;
        let (gy, gs, gl) = (
            s.clone_dtoh(out.y)?,
            s.clone_dtoh(out.sums)?,
            s.clone_dtoh(out.last)?,
        );
        let (xd, fd) = (s.clone_htod(&x)?, s.clone_htod(&[flip])?);
        block_sums_in_a_loop(&rt, &xd, &fd, &mut ey, &mut es, &mut el)?;
        let (mut hy, iters) = halve_on_host(&x);
        let before_branch = hy.clone();
        if flip > 0.0 {
            hy.iter_mut().for_each(|v| *v *= 0.5);
        }
        let at = format!("replay {replay}, {iters} iterations, flip {flip}");
        assert_eq!(gy, hy, "{at}: graph vs host");
        assert_eq!(s.clone_dtoh(&ey)?, hy, "{at}: eager vs host");
        assert_eq!(
            gs,
            s.clone_dtoh(&es)?,
            "{at}: the loop's sums, graph vs eager"
        );
        assert_eq!(
            gl,
            s.clone_dtoh(&el)?,
            "{at}: the branch's sums, graph vs eager"
        );
        if flip > 0.0 {
            assert_sums_close(&gl, &block_sums_on_host(&before_branch), &at);
        } else {
            assert!(gl.iter().all(|v| *v == 0.0), "{at}: the branch did not run");
        }
        trips.push(iters);
    }
    trips.sort_unstable();
    trips.dedup();
    assert!(trips.len() >= 3, "the trip counts varied: {trips:?}");
    Ok(())
}

#[cpu_test]
fn the_device_api_is_prepended_once() {
    assert_eq!(SRC.matches("struct GraphCondition").count(), 1);
    assert!(SRC.starts_with(graph_runtime::conditional::CONDITION_DEVICE_API));
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
