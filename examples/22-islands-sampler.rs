//! # 22 — eager islands: a host-side sampler between two graphed segments
//!
//! Borrows from this workspace: `workloads` (random inputs, timing, the runtime or a skip)
//! and `bench-report` (tables, records); the launch timing and the tables are
//! `examples/common/islands.rs`, shared with the other islands example.
//!
//! A generation step often ends on the host: the sampler (top-p here, with a host random
//! generator) reads the scores, draws a token, and the next model step starts from it. The
//! model's work before and after the draw is static, so it is graphed; the draw runs in an
//! island between the two segments:
//!
//! ```text
//! segment 1: scores = f(logits) (24 kernels) ─┤ island: top-p on the host ├─ segment 2: row = g(table[token]) (24 kernels)
//! ```
//!
//! The generator is `#[island]` state: only the island touches it, it is any `Clone` type,
//! and the graph undoes what its warmup drew (the replays draw what the eager program draws).
//!
//! Checks: over 64 steps with new logits each, the graph's tokens and rows equal the eager
//! function's (same seed). Tables: µs per step, eager and graphed, and where a replay's host
//! time goes.
//!
//! Run: `cargo run --release --example 22-islands-sampler` (`-- --json` for the report).

use std::time::{Duration, Instant};

use bench_report::record::{Record, Side};
use clap::Parser;
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime};
use workloads::testing::{random_vec, runtime_or_skip, seeded_rng};
use workloads::timing::{median, wall_once};

#[path = "common/islands.rs"]
mod islands;

/// A graphed step with a host-side top-p sampler in an island.
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
extern "C" __global__ void gather(const float *table, const int *idx, float *y, int dim) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < dim) y[i] = table[idx[0] * dim + i];
}
"#;

const VOCAB: usize = 32_000;
const DIM: usize = 2_048;
/// Kernels in each segment (the model's work around the draw).
const DEPTH: usize = 24;
const STEPS: usize = 64;
/// Candidates the sampler sorts.
const TOP_K: usize = 256;
const RUNS: usize = 5;

/// A host random generator (xorshift), with the time the island spends drawing.
#[derive(Clone, Debug, PartialEq)]
struct Sampler {
    state: u64,
    time: Duration,
}

impl Sampler {
    fn next_f32(&mut self) -> f32 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Top-k then top-p: of the `TOP_K` most likely tokens, those whose probability reaches
    /// `p`; one drawn from them.
    fn top_p(&mut self, scores: &[f32], p: f32) -> i32 {
        let max = scores.iter().cloned().fold(f32::MIN, f32::max);
        let mut probs: Vec<(usize, f32)> =
            scores.iter().map(|s| (s - max).exp()).enumerate().collect();
        let total: f32 = probs.iter().map(|(_, q)| q).sum();
        let order = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if probs.len() > TOP_K {
            probs.select_nth_unstable_by(TOP_K - 1, order);
            probs.truncate(TOP_K);
        }
        probs.sort_unstable_by(order);
        let (mut mass, mut cut) = (0.0, probs.len());
        for (k, (_, q)) in probs.iter().enumerate() {
            mass += q / total;
            if mass >= p {
                cut = k + 1;
                break;
            }
        }
        let kept = &probs[..cut];
        let sum: f32 = kept.iter().map(|(_, q)| q).sum();
        let mut u = self.next_f32() * sum;
        for (i, q) in kept {
            if u < *q {
                return *i as i32;
            }
            u -= q;
        }
        kept[kept.len() - 1].0 as i32
    }
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// Segment 1 turns the logits into scores, the island draws a token from them on the host,
/// segment 2 embeds the token and transforms the row.
#[cuda_graph(warmup = 2)]
#[allow(clippy::too_many_arguments)]
fn sample_step(
    rt: &Runtime,
    logits: &CudaSlice<f32>,
    #[state] table: &CudaSlice<f32>,
    #[island] sampler: &mut Sampler,
    #[constant] p: f32,
    scores: &mut CudaSlice<f32>,
    token: &mut CudaSlice<i32>,
    row: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let f = rt.function(K, "affine_tanh")?;
    let (vocab, dim) = (VOCAB as i32, DIM as i32);
    s.memcpy_dtod(logits, &mut *scores)?;
    for k in 0..DEPTH {
        let a = 1.0 + k as f32 * 0.01;
        // SAFETY: `affine_tanh` updates `vocab` floats of `scores` in place, which holds them.
        unsafe {
            s.launch_builder(&f)
                .arg(&mut *scores)
                .arg(&a)
                .arg(&0.0f32)
                .arg(&vocab)
                .launch(grid(VOCAB))?;
        }
    }
    rt.eager(|| {
        let started = Instant::now();
        let host = rt.stream().clone_dtoh(&scores)?;
        let t = sampler.top_p(&host, p);
        rt.stream().memcpy_htod(&[t], &mut token)?;
        sampler.time += started.elapsed();
        Ok(())
    })?;
    let gather = rt.function(K, "gather")?;
    // SAFETY: `gather` reads row `token[0]` (< VOCAB, drawn by the island) of the table and
    // writes `dim` floats of `row`, which holds them.
    unsafe {
        s.launch_builder(&gather)
            .arg(table)
            .arg(&*token)
            .arg(&mut *row)
            .arg(&dim)
            .launch(grid(DIM))?;
    }
    for k in 0..DEPTH {
        let a = 1.0 - k as f32 * 0.01;
        // SAFETY: `affine_tanh` updates `dim` floats of `row` in place, which holds them.
        unsafe {
            s.launch_builder(&f)
                .arg(&mut *row)
                .arg(&a)
                .arg(&0.1f32)
                .arg(&dim)
                .launch(grid(DIM))?;
        }
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(rt) = runtime_or_skip("22-islands-sampler") else {
        return Ok(());
    };
    let s = rt.stream().clone();
    let mut rng = seeded_rng(22);
    let table = s.clone_htod(&random_vec(&mut rng, VOCAB * DIM))?;
    let inputs: Vec<CudaSlice<f32>> = (0..STEPS)
        .map(|_| s.clone_htod(&random_vec(&mut rng, VOCAB)))
        .collect::<Result<_, _>>()?;
    let seed = Sampler {
        state: 0x2545_f491_4f6c_dd1d,
        time: Duration::ZERO,
    };
    let (mut scores, mut token, mut row) = (
        s.alloc_zeros::<f32>(VOCAB)?,
        s.alloc_zeros::<i32>(1)?,
        s.alloc_zeros::<f32>(DIM)?,
    );

    // 1. Eager, and the graph, on the same inputs from the same seed: same tokens and rows.
    let mut eager_sampler = seed.clone();
    let mut graph_sampler = seed.clone();
    let mut graph = SampleStepGraph::capture(
        &rt,
        &inputs[0],
        &table,
        &mut graph_sampler,
        0.9,
        VOCAB,
        1,
        DIM,
    )?;
    let mut equal = true;
    let mut tokens = Vec::new();
    for x in &inputs {
        sample_step(
            &rt,
            x,
            &table,
            &mut eager_sampler,
            0.9,
            &mut scores,
            &mut token,
            &mut row,
        )?;
        let out = graph.replay(x)?;
        let (t, r) = (s.clone_dtoh(out.token)?, s.clone_dtoh(out.row)?);
        equal &= t == s.clone_dtoh(&token)? && r == s.clone_dtoh(&row)?;
        tokens.push(t[0]);
    }

    // 2. Timing: STEPS steps per run, one synchronize at the end.
    let mut eager_runs = Vec::new();
    let mut graph_runs = Vec::new();
    let mut graph_host = Vec::new();
    let mut island_own = Vec::new();
    for _ in 0..RUNS {
        let ((), e) = wall_once(&s, || {
            for x in &inputs {
                sample_step(
                    &rt,
                    x,
                    &table,
                    &mut eager_sampler,
                    0.9,
                    &mut scores,
                    &mut token,
                    &mut row,
                )?;
            }
            Ok(())
        })?;
        eager_runs.push(e / STEPS as f64);
        let ((), g) = wall_once(&s, || {
            for x in &inputs {
                graph.replay(x)?;
            }
            Ok(())
        })?;
        graph_runs.push(g / STEPS as f64);
        // The mechanism's host cost: launches with the inputs as they are (no input copy).
        graph.state_mut().sampler.time = Duration::ZERO;
        graph_host.push(islands::launch_host_us(&s, STEPS, || {
            graph.launch().map(drop)
        })?);
        island_own.push(graph.state_mut().sampler.time.as_secs_f64() * 1e6 / STEPS as f64);
    }
    let (eager_us, graph_us) = (median(eager_runs), median(graph_runs));
    let (host_us, own_us) = (median(graph_host), median(island_own));
    let segments = graph.segments().count();
    let device = rt.context().name().unwrap_or_default();
    println!(
        "top-p sampling between two segments of {DEPTH} kernels on {device}: vocabulary {VOCAB}, {STEPS} steps, median of {RUNS} runs\n"
    );
    islands::print_tables("step", eager_us, graph_us, host_us, own_us, segments);
    let mut distinct = tokens.clone();
    distinct.sort_unstable();
    distinct.dedup();
    println!(
        "\ntokens: {:?} … ({} distinct of {STEPS})",
        &tokens[..8],
        distinct.len()
    );
    if args.json {
        let rec = Record::new(
            "islands",
            Side::Ours,
            "islands-sampler",
            format!("top-p on the host between two segments of {DEPTH} kernels"),
            eager_us,
            graph_us,
        )
        .shape("vocab", VOCAB)
        .shape("steps", STEPS)
        .check("tokens and rows equal eager over 64 steps", equal)
        .with("host_us", host_us)
        .with("island_own_us", own_us);
        println!("{}", rec.line());
    }
    if !equal {
        return Err("the graph's tokens or rows differ from eager".into());
    }
    println!("the graph drew the same {STEPS} tokens as eager, rows equal");
    Ok(())
}
