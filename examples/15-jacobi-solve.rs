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
//!   `graph_while_unrolled`, k iterations per iteration of the loop node; the kernels take
//!   the condition (`go.kernel_arg(rt)`) and change nothing when `graph_condition_active` is
//!   false, so the iterations after the last one of a solve change nothing. Each kernel reads
//!   it first and tests it just before its first store, so that the read (a round trip to L2)
//!   overlaps the kernel's own loads; the residual kernel then sets the condition with
//!   `graph_condition_set_active`, which skips a second read;
//! * **replay + host read**: a graph of one iteration replayed until the residual read back
//!   after each replay is small enough;
//! * **eager loop**: the solve function called eagerly (`graph_while` reads the condition on
//!   the host after every iteration).
//!
//! Checks: for every `b`, the on-device loop, the replay loop and the eager loop end with the
//! same iteration count and bitwise the same `x`; the residual of that `x`, recomputed on the
//! host in f64, is below the tolerance.
//!
//! On an H200 (driver 580), 48×48, median 1371 iterations, GPU µs per iteration, every form
//! measured back to back in one process (a probe with these kernels): kernels 5.68; `graph_while` 10.0 (+76%);
//! `graph_while_unrolled` with kernels that test the condition first, by 8: 7.60 (+34%), by
//! 16: 7.33 (+29%); read first and tested before the store, by 8: 6.81 (+20%), by 16: 6.54
//! (+15%), by 32: 6.47 (+14%); the same loop with kernels that never test (wrong past the
//! last iteration, a floor): by 16, 5.85 (+3.0%). What remains is the condition's read, about
//! 0.23 µs per kernel of under 2 µs. One replay per iteration with a host read: 18.4.
//!
//! Run: `cargo run --release --example 15-jacobi-solve` (`-- --json` for a JSON line,
//! `-- --grid 64 --tol 1e-5` for another problem).

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
    /// Print one JSON line after the table.
    #[arg(long)]
    json: bool,
}

const SRC: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
// y = (b + the four neighbours of x) / 4 on an m x m grid with a zero boundary. Nothing once
// the loop's condition is cleared (`graph_while_unrolled`: a step after the last one). The
// condition is read first and tested before the store: its read overlaps the loads of x and b.
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
// Then the loop goes on while stats[0] > tol. The condition is read first and tested before
// the writes: its read overlaps the reduction.
extern "C" __global__ void relative_residual(const float *x, const float *b, float *stats,
                                             unsigned int *iters, int m, float tol, GraphCondition go) {
    bool active = graph_condition_active(go);
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
}

impl System {
    fn new(s: &Arc<CudaStream>, m: usize) -> Result<Self, GraphError> {
        Ok(System {
            b: s.alloc_zeros(m * m)?,
            x: s.alloc_zeros(m * m)?,
            y: s.alloc_zeros(m * m)?,
            stats: s.alloc_zeros(2)?,
            iters: s.alloc_zeros(1)?,
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

/// One loop iteration: two sweeps (x → y → x) and the residual, which sets `go` to
/// `residual > tol`; `go` is the loop's condition (the kernels do nothing once it is cleared),
/// `ConditionArg::always()` outside a loop.
fn iteration(
    rt: &Runtime,
    sys: &mut System,
    m: usize,
    tol: f32,
    go: ConditionArg<'_>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let sweep = rt.function(SRC, "jacobi_sweep")?;
    let residual = rt.function(SRC, "relative_residual")?;
    let mi = m as i32;
    let cells = LaunchConfig::for_num_elems((m * m) as u32);
    let block = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: every buffer holds m² floats (stats 2, iters 1); the sweeps read `x`/`y` and `b`
    // and write the other of `x`/`y`; the residual reads `x` and `b`, writes stats and iters.
    unsafe {
        s.launch_builder(&sweep)
            .arg(&sys.x)
            .arg(&sys.b)
            .arg(&mut sys.y)
            .arg(&mi)
            .arg(&go)
            .launch(cells)?;
        s.launch_builder(&sweep)
            .arg(&sys.y)
            .arg(&sys.b)
            .arg(&mut sys.x)
            .arg(&mi)
            .arg(&go)
            .launch(cells)?;
        s.launch_builder(&residual)
            .arg(&sys.x)
            .arg(&sys.b)
            .arg(&mut sys.stats)
            .arg(&mut sys.iters)
            .arg(&mi)
            .arg(&tol)
            .arg(&go)
            .launch(block)?;
    }
    Ok(())
}

// 1. The whole solve: iterations while the relative residual is above `tol`, at most `max`.
#[cuda_graph(warmup = 1)]
fn jacobi_solve(
    rt: &Runtime,
    #[state] sys: &mut System,
    #[constant] m: usize,
    #[constant] tol: f32,
    #[constant] max: u32,
    #[constant] unroll: u32,
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_while_unrolled(&go, Some(max), unroll, |rt| {
        iteration(rt, sys, m, tol, go.kernel_arg(rt))
    })
}

// 2. One iteration, for the replay loop that reads the residual on the host.
#[cuda_graph(warmup = 1)]
fn jacobi_iteration(
    rt: &Runtime,
    #[state] sys: &mut System,
    #[constant] m: usize,
) -> Result<(), GraphError> {
    iteration(rt, sys, m, 0.0, ConditionArg::always())
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
        iteration(rt, sys, m, 0.0, ConditionArg::always())?;
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
    let mut eager = System::new(&s, m)?;
    let mut looped = JacobiSolveGraph::capture(&rt, System::new(&s, m)?, m, tol, max, 1)?;
    let k = args.unroll;
    let mut looped_k = JacobiSolveGraph::capture(&rt, System::new(&s, m)?, m, tol, max, k)?;
    let mut one = JacobiIterationGraph::capture(&rt, System::new(&s, m)?, m)?;
    let mut unrolled = JacobiUnrolledGraph::capture(&rt, System::new(&s, m)?, m, UNROLL)?;

    let (mut eager_ms, mut loop_ms, mut loop_gpu_ms, mut replay_ms, mut gpu_iter_us) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut loop_k_ms, mut loop_k_gpu_ms) = (vec![], vec![]);
    let mut iterations = Vec::new();
    let mut failures = Vec::new();
    for (run, b) in rhs.iter().enumerate() {
        // a. Eagerly: graph_while reads the condition after every iteration.
        eager.reset(&s, b)?;
        let ((), us) = wall_once(&s, || jacobi_solve(&rt, &mut eager, m, tol, max, 1))?;
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
        let same = e.x == g.x
            && r.x == g.x
            && gk.x == g.x
            && e.sweeps == g.sweeps
            && r.sweeps == g.sweeps
            && gk.sweeps == g.sweeps;
        println!(
            "solve {run}: {} iterations ({} sweeps), relative residual {:.3e} on the GPU, {host:.3e} in f64 \
             on the host; eager, replay, on-device loop and unrolled loop bitwise equal: {}",
            g.sweeps / 2,
            g.sweeps,
            g.residual,
            if same { "yes" } else { "NO" }
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
            "on-device loop, {k} iterations per loop-node iteration (`graph_while_unrolled`), wall"
        ),
        "1".into(),
        lk,
    );
    row(
        &mut t,
        &format!("on-device loop, {k} per loop-node iteration, GPU time (events)"),
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
