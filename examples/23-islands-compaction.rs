//! # 23 — eager islands: a shape known only on the host, between graphed segments
//!
//! Borrows from this workspace: `workloads` (random inputs, timing, the runtime or a skip)
//! and `bench-report` (tables, records); the launch timing and the tables are
//! `examples/common/islands.rs`, shared with the other islands example.
//!
//! A stream compaction keeps the elements that pass a test; how many pass is known only after
//! the scores are computed, and the next stage works on that many. A graph has fixed shapes,
//! so the count is read on the host in an island; the stage after it works on a buffer of the
//! largest size with the count as a device value (its kernels stop at the count):
//!
//! ```text
//! segment 1: scores (16 kernels) ─┤ island: read, keep the positive ones, write them and their count ├─ segment 2: 16 kernels over the kept ones
//! ```
//!
//! Checks: over 64 inputs, the graph's kept values, counts and results equal the eager
//! function's, and the counts change from input to input. Tables: µs per call, eager and
//! graphed, and where a replay's host time goes.
//!
//! Run: `cargo run --release --example 23-islands-compaction` (`-- --json` for the report).

use std::time::{Duration, Instant};

use bench_report::record::{Record, Side};
use clap::Parser;
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime};
use workloads::testing::{random_vec, runtime_or_skip, seeded_rng};
use workloads::timing::{median, wall_once};

#[path = "common/islands.rs"]
mod islands;

/// A compaction whose count is read on the host, between two graphed segments.
#[derive(Parser)]
struct Args {
    /// Print one JSON line for the report after the tables.
    #[arg(long)]
    json: bool,
}

const K: &str = r#"
extern "C" __global__ void affine_tanh(float *y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(a * y[i] + b);
}
extern "C" __global__ void affine_tanh_counted(float *y, float a, float b, const int *count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count[0]) y[i] = tanhf(a * y[i] + b);
}
"#;

const N: usize = 1 << 16;
/// Kernels in each segment.
const DEPTH: usize = 16;
const CALLS: usize = 64;
const RUNS: usize = 5;

/// The time the island spends, kept as `#[island]` state.
#[derive(Clone, Debug, Default)]
struct Clock(Duration);

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

#[cuda_graph(warmup = 2)]
fn compact(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[island] clock: &mut Clock,
    scores: &mut CudaSlice<f32>,
    kept: &mut CudaSlice<f32>,
    count: &mut CudaSlice<i32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let f = rt.function(K, "affine_tanh")?;
    let n = N as i32;
    s.memcpy_dtod(x, &mut *scores)?;
    for k in 0..DEPTH {
        let a = 1.0 + k as f32 * 0.05;
        // SAFETY: `affine_tanh` updates `n` floats of `scores` in place, which holds them.
        unsafe {
            s.launch_builder(&f)
                .arg(&mut *scores)
                .arg(&a)
                .arg(&-0.05f32)
                .arg(&n)
                .launch(grid(N))?;
        }
    }
    rt.eager(|| {
        let started = Instant::now();
        let host = rt.stream().clone_dtoh(&scores)?;
        let mut positive: Vec<f32> = host.into_iter().filter(|v| *v > 0.0).collect();
        let found = positive.len() as i32;
        positive.resize(N, 0.0);
        rt.stream().memcpy_htod(&positive, &mut kept)?;
        rt.stream().memcpy_htod(&[found], &mut count)?;
        clock.0 += started.elapsed();
        Ok(())
    })?;
    let g = rt.function(K, "affine_tanh_counted")?;
    for k in 0..DEPTH {
        let a = 1.0 - k as f32 * 0.02;
        // SAFETY: `affine_tanh_counted` updates the first `count[0]` (<= N) floats of `kept`,
        // which holds N.
        unsafe {
            s.launch_builder(&g)
                .arg(&mut *kept)
                .arg(&a)
                .arg(&0.1f32)
                .arg(&*count)
                .launch(grid(N))?;
        }
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(rt) = runtime_or_skip("23-islands-compaction") else {
        return Ok(());
    };
    let s = rt.stream().clone();
    let mut rng = seeded_rng(23);
    // Inputs shifted differently, so the count of kept values changes from call to call.
    let inputs: Vec<CudaSlice<f32>> = (0..CALLS)
        .map(|k| {
            let shift = (k as f32 / CALLS as f32) - 0.5;
            let v: Vec<f32> = random_vec(&mut rng, N)
                .into_iter()
                .map(|x| x + shift)
                .collect();
            s.clone_htod(&v)
        })
        .collect::<Result<_, _>>()?;
    let (mut scores, mut kept, mut count) = (
        s.alloc_zeros::<f32>(N)?,
        s.alloc_zeros::<f32>(N)?,
        s.alloc_zeros::<i32>(1)?,
    );
    let mut clock = Clock::default();
    let mut graph_clock = Clock::default();
    let mut graph = CompactGraph::capture(&rt, &inputs[0], &mut graph_clock, N, N, 1)?;

    // 1. Eager and graphed on the same inputs: the same kept values, counts and results.
    let mut equal = true;
    let mut counts = Vec::new();
    for x in &inputs {
        compact(&rt, x, &mut clock, &mut scores, &mut kept, &mut count)?;
        let out = graph.replay(x)?;
        let (k, c) = (s.clone_dtoh(out.kept)?, s.clone_dtoh(out.count)?);
        equal &= k == s.clone_dtoh(&kept)? && c == s.clone_dtoh(&count)?;
        counts.push(c[0]);
    }
    let (lo, hi) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );

    // 2. Timing: CALLS calls per run, one synchronize at the end.
    let mut eager_runs = Vec::new();
    let mut graph_runs = Vec::new();
    let mut graph_host = Vec::new();
    let mut island_own = Vec::new();
    for _ in 0..RUNS {
        let ((), e) = wall_once(&s, || {
            for x in &inputs {
                compact(&rt, x, &mut clock, &mut scores, &mut kept, &mut count)?;
            }
            Ok(())
        })?;
        eager_runs.push(e / CALLS as f64);
        let ((), g) = wall_once(&s, || {
            for x in &inputs {
                graph.replay(x)?;
            }
            Ok(())
        })?;
        graph_runs.push(g / CALLS as f64);
        // The mechanism's host cost: launches with the inputs as they are (no input copy).
        graph.state_mut().clock.0 = Duration::ZERO;
        graph_host.push(islands::launch_host_us(&s, CALLS, || {
            graph.launch().map(drop)
        })?);
        island_own.push(graph.state_mut().clock.0.as_secs_f64() * 1e6 / CALLS as f64);
    }
    let (eager_us, graph_us) = (median(eager_runs), median(graph_runs));
    let (host_us, own_us) = (median(graph_host), median(island_own));
    let segments = graph.segments().count();
    let device = rt.context().name().unwrap_or_default();
    println!(
        "compaction of {N} values between two segments of {DEPTH} kernels on {device}: {CALLS} inputs (kept {lo} to {hi}), median of {RUNS} runs\n"
    );
    islands::print_tables("call", eager_us, graph_us, host_us, own_us, segments);
    if args.json {
        let rec = Record::new(
            "islands",
            Side::Ours,
            "islands-compaction",
            format!("compaction read on the host between two segments of {DEPTH} kernels"),
            eager_us,
            graph_us,
        )
        .shape("n", N)
        .shape("calls", CALLS)
        .check(
            "kept values, counts and results equal eager over 64 inputs; counts vary",
            equal && lo < hi,
        )
        .with("host_us", host_us)
        .with("island_own_us", own_us);
        println!("{}", rec.line());
    }
    if !equal {
        return Err("the graph's kept values or counts differ from eager".into());
    }
    if lo == hi {
        return Err("the count of kept values did not change: the inputs test nothing".into());
    }
    println!("\nkept values and counts equal eager on all {CALLS} inputs (counts {lo} to {hi})");
    Ok(())
}
