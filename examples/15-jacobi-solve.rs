//! # 15 — an iterative solver that stops on the GPU: Jacobi until the residual is small
//!
//! Borrows from this workspace: `workloads` (random inputs, timing, the runtime or a skip) and
//! `bench-report` (records, tables).
//!
//! Solves the 2-D Poisson problem `A x = b` on an `m × m` grid (the 5-point Laplacian, zero
//! boundary: 4 on the diagonal, −1 for each neighbour) with Jacobi iterations until the
//! relative residual `‖b − A x‖ / ‖b‖` falls below `--tol`. How many iterations that takes
//! depends on `b`: a straight-line graph cannot know, so the usual program replays a graph of
//! one iteration and reads the residual back after each (a copy and a synchronize).
//!
//! Here the whole solve is one graph launch: `rt.graph_while(&go, Some(max), |rt| …)` records
//! a CUDA WHILE node whose body does two Jacobi sweeps (x → y → x, so the body's buffers are
//! the same every iteration), computes the relative residual in one block (a fixed-order
//! reduction: the same bits eagerly and in the graph) and sets the condition itself,
//! `graph_condition_set(go, residual > tol)` (the device API: no extra kernel per iteration).
//! The iteration bound (`--max-iterations`) stops a solve that does not converge.
//!
//! Rows of the table (median of `--runs` solves, each with a fresh random `b`):
//! * **GPU time of the iterations' kernels**: a graph of 16 unrolled iterations without any
//!   check (the two sweeps and the residual; the loop's body adds the loop bound's one-thread
//!   kernel, `graph_while` only), launched back to back and timed with CUDA events;
//! * **on-device loop**: one launch of the `graph_while` graph per solve, host wall time;
//! * **on-device loop, k per loop-node iteration** (`--unroll`, 16): the same solve with
//!   `graph_while_unrolled`, k iterations per iteration of the loop node. The iterations
//!   after the last one of a solve still run and must change nothing; `--form` says how:
//!   * `each` (the default): every kernel takes the condition (`go.kernel_arg(rt)`) and
//!     changes nothing when `graph_condition_active` is false. Each reads it first and tests
//!     it just before its first store, so that the read (one 16-byte load) overlaps the
//!     kernel's own loads; the residual kernel reads it in thread 0 only, the one that writes,
//!     and sets the condition with `graph_condition_set_active`, which skips a second read;
//!   * `ring`: x moves around a ring of k buffers (x itself and k − 1 more): iteration c reads
//!     position c % k and writes (c + 1) % k, so the iterations after the last one write y and
//!     positions after the solution's, never the solution: the sweeps take no condition at
//!     all, only the residual reads it, and a copy after the loop moves the solution to x;
//!   * `unguarded`: no kernel reads the condition, so the extra iterations change x and the
//!     count: wrong results (not checked), a floor for the time;
//! * **replay + host read**: a graph of one iteration replayed until the residual read back
//!   after each replay is small enough;
//! * **eager loop**: the solve function called eagerly (`graph_while` reads the condition on
//!   the host after every iteration).
//!
//! Checks: for every `b`, the on-device loops (plain and unrolled; not `--form unguarded`'s),
//! the replay loop and the eager loop end with the same iteration count and bitwise the same
//! `x`; the residual of that `x`, recomputed on the
//! host in f64, is below the tolerance.
//!
//! On an H200 (driver 580), 48×48, median 1371 iterations, µs per iteration (GPU time of the
//! on-device loops), one process per form: kernels 6.09–6.12; `graph_while` 10.3 (+69–70%);
//! `graph_while_unrolled`, `--form each`: by 16, 6.44 (+5.7%), by 32, 6.30 (+3.0%);
//! `--form ring`: by 16, 6.29 (+3.4%), by 32, 6.16 (+0.8%); `--form unguarded` (the floor):
//! by 16, 6.27 (+2.9%). One replay per iteration with a host read: 16.6–19.0. (Earlier, with
//! the condition read as three 4-byte loads by every thread of every kernel, `each` by 16
//! was +15%.)
//!
//! Run: `cargo run --release --example 15-jacobi-solve` (`-- --json` for a JSON line,
//! `-- --form ring --unroll 32` for another form, `-- --grid 64 --tol 1e-5` for another
//! problem).

use std::sync::Arc;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use clap::Parser;
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::{
    cuda_graph, BoxError, Compare, ConditionArg, DeviceState, GraphError, Runtime,
};
use workloads::testing::{random_vec, runtime_or_skip, seeded_rng};
use workloads::timing::{median, once, wall_once};

/// Jacobi on the 2-D Poisson problem until the relative residual is below a tolerance: the
/// whole solve in one graph launch against one replay per iteration with a host read.
#[derive(Parser)]
struct Args {
    /// Grid side `m` (the system has m² unknowns).
    #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u32).range(4..=1024))]
    grid: u32,
    /// Relative residual to reach.
    #[arg(long, default_value_t = 1e-4)]
    tol: f32,
    /// Most loop iterations (two sweeps each) per solve.
    #[arg(long, default_value_t = 100_000)]
    max_iterations: u32,
    /// Timed solves per variant, each with a fresh random right-hand side.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Iterations per iteration of the loop node in the unrolled on-device loop
    /// (`graph_while_unrolled`).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    unroll: u32,
    /// How the unrolled loop's extra steps (after the one that stopped it) change nothing:
    /// `ring` (x moves around a ring of `--unroll` buffers; only the residual kernel reads the
    /// condition), `each` (every kernel reads it and skips its stores), `unguarded` (no kernel
    /// reads it: wrong results past the last iteration, a floor for the timing; not checked).
    #[arg(long, value_enum, default_value_t = Form::Each)]
    form: Form,
    /// Print one JSON line after the table.
    #[arg(long)]
    json: bool,
}

/// How the extra steps of the unrolled loop change nothing (see `--form`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Ring,
    Each,
    Unguarded,
}

impl Form {
    /// The code the graph's constant holds.
    fn code(self) -> u32 {
        match self {
            Form::Ring => 0,
            Form::Each => 1,
            Form::Unguarded => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Form::Ring => "ring",
            Form::Each => "each",
            Form::Unguarded => "unguarded",
        }
    }
}

const SRC: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
// y = (b + the four neighbours of x) / 4 on an m x m grid with a zero boundary. Nothing once
// the loop's condition is cleared (`graph_while_unrolled`: a step after the last one). The
// condition is read first and tested before the store: its read overlaps the loads of x and b.
// (`--form ring` and `unguarded` pass `ConditionArg::always()`: no read, always a store.)
extern "C" __global__ void jacobi_sweep(const float *x, const float *b, float *y, int m, GraphCondition go) {
    bool active = graph_condition_active(go);
    int n = m * m;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        int i = k / m, j = k % m;
        float s = b[k];
        if (i > 0) s += x[k - m];
        if (i + 1 < m) s += x[k + m];
        if (j > 0) s += x[k - 1];
        if (j + 1 < m) s += x[k + 1];
        if (!active) return;
        y[k] = 0.25f * s;
    }
}

// stats[0] = |b - A x| / |b|, stats[1] = |b - A x|; iters[0] += 2 (two sweeps). One block of
// 1024 threads: each sums a fixed set of cells, then a fixed tree: the same bits every run.
// Then the loop goes on while stats[0] > tol. Thread 0, the one that writes, reads the
// condition first and tests it before the writes: its read overlaps the reduction. (`guarded`
// 0: it does not read it, for the timing floor of `--form unguarded`.)
extern "C" __global__ void relative_residual(const float *x, const float *b, float *stats,
                                             unsigned int *iters, int m, float tol, GraphCondition go,
                                             int guarded) {
    bool active = true;
    if (threadIdx.x == 0 && guarded) active = graph_condition_active(go);
    __shared__ float rr[1024];
    __shared__ float bb[1024];
    int n = m * m;
    float r2 = 0.0f, b2 = 0.0f;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        int i = k / m, j = k % m;
        float ax = 4.0f * x[k];
        if (i > 0) ax -= x[k - m];
        if (i + 1 < m) ax -= x[k + m];
        if (j > 0) ax -= x[k - 1];
        if (j + 1 < m) ax -= x[k + 1];
        float r = b[k] - ax;
        r2 += r * r;
        b2 += b[k] * b[k];
    }
    rr[threadIdx.x] = r2;
    bb[threadIdx.x] = b2;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            rr[threadIdx.x] += rr[threadIdx.x + s];
            bb[threadIdx.x] += bb[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && active) {
        float r = sqrtf(rr[0]);
        float rel = r / sqrtf(bb[0]);
        stats[0] = rel;
        stats[1] = r;
        iters[0] += 2u;
        graph_condition_set_active(go, rel > tol);
    }
}

// After a loop whose x went around a ring of k buffers (x itself at position 0, ring[p - 1]
// at position p): the solution is at position (sweeps / 2) % k; copy it into x.
extern "C" __global__ void ring_result(float *x, const float *ring, const unsigned int *iters,
                                       int n, unsigned int k) {
    unsigned int p = (iters[0] / 2u) % k;
    if (p == 0u) return;
    const float *src = ring + (size_t)(p - 1u) * (size_t)n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = src[i];
}
"#
);

/// The system and the solver's buffers.
#[derive(DeviceState)]
struct System {
    b: CudaSlice<f32>,
    x: CudaSlice<f32>,
    y: CudaSlice<f32>,
    /// `[relative residual, residual]` after the last iteration.
    stats: CudaSlice<f32>,
    /// Sweeps done.
    iters: CudaSlice<u32>,
    /// Positions 1.. of the ring of `--form ring` (x is position 0), m² floats each; scratch.
    ring: CudaSlice<f32>,
}

impl System {
    /// The buffers, with a ring of `ring` positions (x and `ring - 1` more).
    fn new(s: &Arc<CudaStream>, m: usize, ring: usize) -> Result<Self, GraphError> {
        Ok(System {
            b: s.alloc_zeros(m * m)?,
            x: s.alloc_zeros(m * m)?,
            y: s.alloc_zeros(m * m)?,
            stats: s.alloc_zeros(2)?,
            iters: s.alloc_zeros(1)?,
            ring: s.alloc_zeros(m * m * ring.saturating_sub(1).max(1))?,
        })
    }

    /// A new right-hand side, and the solver back at x = 0.
    fn reset(&mut self, s: &Arc<CudaStream>, b: &[f32]) -> Result<(), GraphError> {
        s.memcpy_htod(b, &mut self.b)?;
        s.memset_zeros(&mut self.x)?;
        s.memset_zeros(&mut self.iters)?;
        Ok(())
    }
}

/// What one loop iteration reads and writes, and how it sees the condition.
struct Step<'c> {
    m: usize,
    tol: f32,
    /// The sweeps' condition: the loop's (`--form each`) or `ConditionArg::always()`.
    sweeps: ConditionArg<'c>,
    /// The residual's condition, which it sets; `ConditionArg::always()` outside a loop.
    residual: ConditionArg<'c>,
    /// Whether the residual reads the condition before its writes (not for the floor).
    guarded: bool,
    /// Ring positions x is read from and written to (0: `sys.x`, p: `sys.ring`'s p-th block).
    from: usize,
    to: usize,
}

/// One loop iteration: two sweeps (x → y → x) and the residual, which sets the condition to
/// `residual > tol`. x is read at ring position `from` and written at `to`.
fn iteration(rt: &Runtime, sys: &mut System, st: &Step<'_>) -> Result<(), GraphError> {
    let s = rt.stream();
    let sweep = rt.function(SRC, "jacobi_sweep")?;
    let residual = rt.function(SRC, "relative_residual")?;
    let (m, n) = (st.m, st.m * st.m);
    let mi = m as i32;
    let block_of = |p: usize| (p - 1) * n..p * n;
    let cells = LaunchConfig::for_num_elems(n as u32);
    let block = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    let guarded = i32::from(st.guarded);
    // SAFETY: x, y, b and every ring block hold m² floats (stats 2, iters 1); the first sweep
    // reads x at `from` and b and writes y, the second reads y and b and writes x at `to`; the
    // residual reads x at `to` and b, writes stats and iters.
    unsafe {
        let src = if st.from == 0 {
            sys.x.slice(..)
        } else {
            sys.ring.slice(block_of(st.from))
        };
        s.launch_builder(&sweep)
            .arg(&src)
            .arg(&sys.b)
            .arg(&mut sys.y)
            .arg(&mi)
            .arg(&st.sweeps)
            .launch(cells)?;
        let mut dst = if st.to == 0 {
            sys.x.slice_mut(..)
        } else {
            sys.ring.slice_mut(block_of(st.to))
        };
        s.launch_builder(&sweep)
            .arg(&sys.y)
            .arg(&sys.b)
            .arg(&mut dst)
            .arg(&mi)
            .arg(&st.sweeps)
            .launch(cells)?;
        let out = if st.to == 0 {
            sys.x.slice(..)
        } else {
            sys.ring.slice(block_of(st.to))
        };
        s.launch_builder(&residual)
            .arg(&out)
            .arg(&sys.b)
            .arg(&mut sys.stats)
            .arg(&mut sys.iters)
            .arg(&mi)
            .arg(&st.tol)
            .arg(&st.residual)
            .arg(&guarded)
            .launch(block)?;
    }
    Ok(())
}

/// One iteration outside any loop, x in place.
fn plain_iteration(rt: &Runtime, sys: &mut System, m: usize) -> Result<(), GraphError> {
    let st = Step {
        m,
        tol: 0.0,
        sweeps: ConditionArg::always(),
        residual: ConditionArg::always(),
        guarded: true,
        from: 0,
        to: 0,
    };
    iteration(rt, sys, &st)
}

// 1. The whole solve: iterations while the relative residual is above `tol`, at most `max`,
//    `unroll` of them per iteration of the loop node; `form` is `Form::code`.
//
//    `--form ring`: step j of a loop-node iteration reads x at ring position j % k and writes
//    it at (j + 1) % k (k = unroll; the closure is called once per step, in order: eagerly
//    once per iteration, captured k times per recording). The steps after the one that stopped
//    the loop write only positions after the solution's, never it, and y: the sweeps need no
//    guard. The residual, which writes stats and iters and sets the condition, reads it (one
//    thread). After the loop, `ring_result` copies the solution to x.
#[cuda_graph(warmup = 1)]
fn jacobi_solve(
    rt: &Runtime,
    #[state] sys: &mut System,
    #[constant] m: usize,
    #[constant] tol: f32,
    #[constant] max: u32,
    #[constant] unroll: u32,
    #[constant] form: u32,
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    let ring = if form == Form::Ring.code() {
        unroll as usize
    } else {
        1
    };
    let mut steps = 0usize;
    rt.graph_while_unrolled(&go, Some(max), unroll, |rt| {
        let arg = go.kernel_arg(rt);
        let st = Step {
            m,
            tol,
            sweeps: if form == Form::Each.code() {
                arg
            } else {
                ConditionArg::always()
            },
            residual: arg,
            guarded: form != Form::Unguarded.code(),
            from: steps % ring,
            to: (steps + 1) % ring,
        };
        steps += 1;
        iteration(rt, sys, &st)
    })?;
    if ring > 1 {
        let copy = rt.function(SRC, "ring_result")?;
        let (n, k) = ((m * m) as i32, ring as u32);
        // SAFETY: x holds m² floats, the ring (ring - 1) · m², iters 1; the kernel copies
        // the ring block named by iters into x.
        unsafe {
            rt.stream()
                .launch_builder(&copy)
                .arg(&mut sys.x)
                .arg(&sys.ring)
                .arg(&sys.iters)
                .arg(&n)
                .arg(&k)
                .launch(LaunchConfig::for_num_elems((m * m) as u32))?;
        }
    }
    Ok(())
}

// 2. One iteration, for the replay loop that reads the residual on the host.
#[cuda_graph(warmup = 1)]
fn jacobi_iteration(
    rt: &Runtime,
    #[state] sys: &mut System,
    #[constant] m: usize,
) -> Result<(), GraphError> {
    plain_iteration(rt, sys, m)
}

// 3. `steps` iterations in a row without a check: the kernels' GPU time.
#[cuda_graph(warmup = 1)]
fn jacobi_unrolled(
    rt: &Runtime,
    #[state] sys: &mut System,
    #[constant] m: usize,
    #[constant] steps: usize,
) -> Result<(), GraphError> {
    for _ in 0..steps {
        plain_iteration(rt, sys, m)?;
    }
    Ok(())
}

/// Iterations per launch of the unrolled graph.
const UNROLL: usize = 16;

/// `‖b − A x‖ / ‖b‖` in f64 on the host.
fn host_relative_residual(m: usize, b: &[f32], x: &[f32]) -> f64 {
    let (mut r2, mut b2) = (0.0f64, 0.0f64);
    for i in 0..m {
        for j in 0..m {
            let k = i * m + j;
            let mut ax = 4.0 * f64::from(x[k]);
            if i > 0 {
                ax -= f64::from(x[k - m]);
            }
            if i + 1 < m {
                ax -= f64::from(x[k + m]);
            }
            if j > 0 {
                ax -= f64::from(x[k - 1]);
            }
            if j + 1 < m {
                ax -= f64::from(x[k + 1]);
            }
            let r = f64::from(b[k]) - ax;
            r2 += r * r;
            b2 += f64::from(b[k]) * f64::from(b[k]);
        }
    }
    (r2 / b2).sqrt()
}

/// What a solve left: x, the sweeps and the relative residual.
struct Solved {
    x: Vec<f32>,
    sweeps: u32,
    residual: f32,
}

fn read(s: &Arc<CudaStream>, sys: &System) -> Result<Solved, GraphError> {
    Ok(Solved {
        x: s.clone_dtoh(&sys.x)?,
        sweeps: s.clone_dtoh(&sys.iters)?[0],
        residual: s.clone_dtoh(&sys.stats)?[0],
    })
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(rt) = runtime_or_skip("15-jacobi-solve") else {
        return Ok(());
    };
    let s = rt.stream().clone();
    let m = args.grid as usize;
    let (tol, max) = (args.tol, args.max_iterations);
    let mut rng = seeded_rng(15);
    let rhs: Vec<Vec<f32>> = (0..args.runs)
        .map(|_| random_vec(&mut rng, m * m))
        .collect();

    // The eager solve, and the three graphs (each owns its system).
    let k = args.unroll;
    let (form, positions) = (args.form.code(), k as usize);
    let mut eager = System::new(&s, m, positions)?;
    let mut looped =
        JacobiSolveGraph::capture(&rt, System::new(&s, m, positions)?, m, tol, max, 1, form)?;
    let mut looped_k =
        JacobiSolveGraph::capture(&rt, System::new(&s, m, positions)?, m, tol, max, k, form)?;
    let mut one = JacobiIterationGraph::capture(&rt, System::new(&s, m, positions)?, m)?;
    let mut unrolled =
        JacobiUnrolledGraph::capture(&rt, System::new(&s, m, positions)?, m, UNROLL)?;

    let (mut eager_ms, mut loop_ms, mut loop_gpu_ms, mut replay_ms, mut gpu_iter_us) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut loop_k_ms, mut loop_k_gpu_ms) = (vec![], vec![]);
    let mut iterations = Vec::new();
    let mut failures = Vec::new();
    for (run, b) in rhs.iter().enumerate() {
        // a. Eagerly: graph_while reads the condition after every iteration.
        eager.reset(&s, b)?;
        let ((), us) = wall_once(&s, || jacobi_solve(&rt, &mut eager, m, tol, max, 1, form))?;
        eager_ms.push(us / 1e3);
        let e = read(&s, &eager)?;

        // b. The on-device loop: one launch.
        looped.state_mut().sys.reset(&s, b)?;
        let t = once(&s, || looped.launch().map(drop))?;
        loop_ms.push(t.wall_us / 1e3);
        loop_gpu_ms.push(t.gpu_us / 1e3);
        let g = read(&s, looped.state_mut().sys)?;

        // b'. The same loop, `--unroll` iterations per iteration of the loop node.
        looped_k.state_mut().sys.reset(&s, b)?;
        let t = once(&s, || looped_k.launch().map(drop))?;
        loop_k_ms.push(t.wall_us / 1e3);
        loop_k_gpu_ms.push(t.gpu_us / 1e3);
        let gk = read(&s, looped_k.state_mut().sys)?;

        // c. The kernels alone: as many iterations, UNROLL per launch, events; right after the
        //    loops, as busy a GPU as theirs (timed after the replay loop, whose host reads
        //    leave the GPU idle between iterations, this row read 4-7% above the same kernels
        //    timed next to the loops).
        unrolled.state_mut().sys.reset(&s, b)?;
        let launches = ((g.sweeps as usize / 2) / UNROLL).max(1);
        let t = once(&s, || {
            for _ in 0..launches {
                unrolled.launch()?;
            }
            Ok(())
        })?;
        gpu_iter_us.push(t.gpu_us / (launches * UNROLL) as f64);

        // d. One replay per iteration, the residual read back after each.
        one.state_mut().sys.reset(&s, b)?;
        let ((), us) = wall_once(&s, || {
            let mut done = 0;
            loop {
                one.launch()?;
                done += 1;
                let residual = s.clone_dtoh(&one.state_mut().sys.stats)?[0];
                if !Compare::Gt.holds(residual, tol) || done == max {
                    return Ok(());
                }
            }
        })?;
        replay_ms.push(us / 1e3);
        let r = read(&s, one.state_mut().sys)?;

        let host = host_relative_residual(m, b, &g.x);
        // `--form unguarded` runs the extra steps for real: its unrolled loop is not checked.
        let checked = args.form != Form::Unguarded;
        let same = e.x == g.x
            && r.x == g.x
            && (!checked || gk.x == g.x)
            && e.sweeps == g.sweeps
            && r.sweeps == g.sweeps
            && (!checked || gk.sweeps == g.sweeps);
        println!(
            "solve {run}: {} iterations ({} sweeps), relative residual {:.3e} on the GPU, {host:.3e} in f64 \
             on the host; eager, replay, on-device loop and unrolled loop bitwise equal: {}",
            g.sweeps / 2,
            g.sweeps,
            g.residual,
            match (same, checked) {
                (true, true) => "yes",
                (true, false) => "yes (unrolled loop not checked: --form unguarded)",
                (false, _) => "NO",
            }
        );
        if !same {
            failures.push(format!(
                "solve {run}: eager ({} sweeps), replay ({}), loop ({}) and unrolled loop ({}) differ",
                e.sweeps, r.sweeps, g.sweeps, gk.sweeps
            ));
        }
        if host > f64::from(tol) * 1.01 || g.sweeps / 2 >= max {
            failures.push(format!(
                "solve {run}: did not converge (host residual {host:.3e}, {} iterations)",
                g.sweeps / 2
            ));
        }
        iterations.push(f64::from(g.sweeps / 2));
    }

    let its = median(iterations.clone());
    let (e, l, lg, r, gpu) = (
        median(eager_ms),
        median(loop_ms),
        median(loop_gpu_ms),
        median(replay_ms),
        median(gpu_iter_us),
    );
    let device = rt.context().name().unwrap_or_default();
    println!(
        "\nJacobi, {m}×{m} grid ({} unknowns), relative residual < {tol:e}, on {device}: median {its:.0} \
         iterations per solve (2 sweeps + residual, which sets the condition, each), median of {} solves\n",
        m * m,
        args.runs
    );
    let mut t = Table::new(&[
        "solve",
        ">launches per solve",
        ">ms per solve",
        ">µs per iteration",
        ">vs kernels' GPU time",
        ">speedup vs replay + read",
    ]);
    let row = |t: &mut Table, what: &str, launches: String, ms: f64| {
        let per = ms * 1e3 / its;
        t.row(vec![
            what.into(),
            launches,
            format!("{ms:.2}"),
            us(per),
            format!("{:+.1}%", (per / gpu - 1.0) * 100.0),
            format!("{:.2}×", r / ms),
        ]);
    };
    row(
        &mut t,
        "GPU time of the iterations' 3 kernels (unrolled graph, events)",
        "—".into(),
        gpu * its / 1e3,
    );
    row(
        &mut t,
        "on-device loop (`graph_while`), wall",
        "1".into(),
        l,
    );
    row(&mut t, "on-device loop, GPU time (events)", "1".into(), lg);
    let (lk, lkg) = (median(loop_k_ms), median(loop_k_gpu_ms));
    row(
        &mut t,
        &format!(
            "on-device loop, {k} iterations per loop-node iteration (`graph_while_unrolled`, --form {}), wall",
            args.form.name()
        ),
        "1".into(),
        lk,
    );
    row(
        &mut t,
        &format!(
            "on-device loop, {k} per loop-node iteration (--form {}), GPU time (events)",
            args.form.name()
        ),
        "1".into(),
        lkg,
    );
    row(
        &mut t,
        "one replay per iteration + host read of the residual",
        format!("{its:.0}"),
        r,
    );
    row(
        &mut t,
        "eager loop (host reads the condition per iteration)",
        format!("{:.0}", its * 4.0),
        e,
    );
    print!("{}", t.to_markdown());
    println!("graph: {}", looped.graph());
    if args.json {
        let rec = Record::new(
            "jacobi",
            Side::Ours,
            format!("jacobi/{m}"),
            format!("Jacobi on the {m}×{m} Poisson problem to a relative residual of {tol:e}"),
            r * 1e3 / its,
            l * 1e3 / its,
        )
        .shape("grid", m)
        .kernels(3)
        .check(
            "x bitwise and iteration counts equal: eager loop, replay + read, on-device loop; f64 host residual below tol",
            failures.is_empty(),
        )
        .with("iterations", its)
        .with("gpu_iteration_us", gpu)
        .with("loop_gpu_ms", lg)
        .with("eager_loop_ms", e)
        .with("unroll", k)
        .with("form", args.form.name())
        .with("unrolled_loop_ms", lk)
        .with("unrolled_loop_gpu_ms", lkg);
        println!("{}", rec.line());
    }
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    println!("every solve converged, and the four loops agreed bitwise");
    Ok(())
}
