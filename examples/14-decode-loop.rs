//! # 14 — decode until the end token: a whole generation in one graph launch
//!
//! Borrows from this workspace: `workloads` (the decoder and its f64 host model, timing, the
//! runtime or a skip) and `bench-report` (records, tables).
//!
//! `05-decode-step` made one graph serve every token, but the host still launches it once per
//! token, and a real decoder must also *stop*: at the end token, which only the GPU knows.
//! With a straight-line graph that means one replay per token and a host read of the token
//! after each (a copy and a synchronize, what PyTorch's `.item()` does). Here the loop itself
//! is in the graph: `rt.graph_while(&go, …, |rt| step(…))` records a CUDA WHILE node whose
//! body is one decode step, and the step's last kernel (greedy argmax) sets the condition on
//! the device, `next != END && pos < N`, through the library's device API
//! (`graph_condition_set`). One `launch` generates the whole sequence.
//!
//! Models (pre-norm transformer, SwiGLU, greedy, batch 1; `--sizes`):
//! * `tiny`: 1 block, width 128, 4 heads, ffn 384, vocab 1024;
//! * `small`: 2 blocks, width 256, 4 heads, ffn 768, vocab 2048;
//! * `example05`: the size of `05-decode-step` (8 blocks, width 512, 8 heads, ffn 1536,
//!   vocab 4096).
//!
//! Each generates up to `--tokens` tokens (256) from BOS. The end token is chosen from a first
//! eager run without stopping: the token whose first appearance comes last, so the loop stops
//! on the device late in the sequence (or, when every token repeats early, no end token and
//! the length bound stops it).
//!
//! Rows of the table, per token (median of `--runs` generations):
//! * **GPU time of one token's kernels**: a graph of 8 unrolled steps, launched back to back
//!   and timed with CUDA events: the floor for any loop;
//! * **on-device loop**: one launch of the `graph_while` graph for the whole generation, host
//!   wall time including the launch and the final synchronize, over the tokens generated; the
//!   `+ bound` row adds `max_iterations` (one more one-thread kernel per token);
//! * **on-device loop, 8 steps per iteration** (`--unroll`): the loop's body is 8 decode
//!   steps, so the relaunch of the body that every WHILE iteration costs on the device (about
//!   4 µs on an H100) is paid once per 8 tokens. The argmax kernel keeps a `done` flag on the
//!   device: once the end token (or the length limit) is reached, the remaining steps of the
//!   iteration change nothing (no token, no position); they still run, so a sequence pays at
//!   most 7 wasted steps;
//! * **on-device loop, 8 steps per iteration, `graph_while_unrolled`**: the library's
//!   unrolling of the one-step loop; the argmax kernel's `done` flag and the library's guard
//!   (`graph_condition_active` is false after the step that stopped) keep the extra steps
//!   from changing the tokens, and the steps after the end only rewrite the frozen position;
//! * **replay + host read**: the one-step graph launched per token, then the token read back
//!   (`clone_dtoh` of 4 bytes, which synchronizes) to decide whether to stop;
//! * **eager loop**: the same function called eagerly: `graph_while` then runs on the host,
//!   reading the condition after every step.
//!
//! Checks: every variant generates the same tokens, and stops at the same place; the first 8
//! tokens are the f64 host model's greedy choices. `scripts/torch_decode_loop.py` measures
//! PyTorch's per-token graph replay with `.item()` for the same shapes.
//!
//! On an H100 (driver 580), per token: `tiny` 30.1 µs of kernels; on-device loop 34.2 µs
//! (+13%), 31.3 µs with 8 steps per iteration (+3.9%); one replay per token with a host read
//! 44.8 µs (1.43× slower than the unrolled loop); PyTorch's replay + `.item()` 103 µs.
//! `example05`: 424 µs of kernels, on-device loop +1.2%. On an H200 (driver 580), `tiny`:
//! 29.4 µs of kernels; on-device loop 33.8 µs (+14.7%); 8 steps per iteration 30.7 µs by
//! hand (+4.3%) and 31.0 µs with `graph_while_unrolled` (+5.3%); replay + host read 41.6 µs.
//!
//! The model on the GPU (weights, state, one step's kernels, the stopping argmax) is
//! `workloads::decode`, shared with `05-decode-step`; this file holds the three graphs over
//! it and the measurements.
//!
//! Run: `cargo run --release --example 14-decode-loop` (`-- --json` adds one JSON line per
//! size; `-- --sizes tiny,small` picks sizes).

use std::sync::Arc;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use clap::{Parser, ValueEnum};
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime};
use workloads::decode::{
    check_against_host, generated, max_tokens, restart, step, upload, DecodeState, Last, Weights,
};
use workloads::reference::{Decoder, DecoderSpec};
use workloads::testing::{runtime_or_skip, seeded_rng};
use workloads::timing::{median, once, wall_once};

/// Greedy decoding until an end token: one graph launch per sequence (`graph_while`) against
/// one replay per token with a host read of the token.
#[derive(Parser)]
struct Args {
    /// Model sizes to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [Size::Tiny, Size::Small, Size::Example05])]
    sizes: Vec<Size>,
    /// Most tokens per sequence (the KV cache holds this many positions).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(8..=1000))]
    tokens: u32,
    /// Decode steps per `graph_while` iteration in the unrolled on-device loop.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    unroll: u32,
    /// Timed generations per variant (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Print one JSON line per size after its table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Size {
    Tiny,
    Small,
    #[value(name = "example05")]
    Example05,
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Size::Tiny => "tiny",
            Size::Small => "small",
            Size::Example05 => "example05",
        })
    }
}

impl Size {
    /// The model for sequences of at most `tokens` tokens. The cache holds one position more:
    /// the steps of an unrolled iteration after the end write the frozen position's row.
    fn spec(self, tokens: usize) -> DecoderSpec {
        let (layers, dim, heads, ffn, vocab) = match self {
            Size::Tiny => (1, 128, 4, 384, 1024),
            Size::Small => (2, 256, 4, 768, 2048),
            Size::Example05 => (8, 512, 8, 1536, 4096),
        };
        DecoderSpec {
            dim,
            heads,
            layers,
            ffn,
            vocab,
            max_seq: tokens + 1,
            theta: 10_000.0,
            eps: 1e-5,
        }
    }
}

/// Steps per launch of the unrolled graph that measures the kernels' GPU time.
const UNROLL: usize = 8;
/// Tokens checked against the host model.
const CPU_TOKENS: usize = 8;

// 1. One step, for the replay-per-token loop and the first eager run.
#[cuda_graph(warmup = 2)]
fn decode_step(
    rt: &Runtime,
    #[state] w: &Weights,
    #[state] kv: &mut CudaSlice<f32>,
    #[state] st: &mut DecodeState,
    #[constant] spec: DecoderSpec,
) -> Result<(), GraphError> {
    step(rt, w, kv, st, &spec, Last::Argmax)
}

// 2. The whole generation: steps while the last kernel says so. Eagerly this is a host loop
//    that reads the condition after every step; captured, one WHILE node.
//    `unroll` steps per iteration: the body's relaunch is paid once per `unroll` tokens.
#[cuda_graph(warmup = 1)]
#[allow(clippy::too_many_arguments)]
fn decode_loop(
    rt: &Runtime,
    #[state] w: &Weights,
    #[state] kv: &mut CudaSlice<f32>,
    #[state] st: &mut DecodeState,
    #[constant] spec: DecoderSpec,
    #[constant] end: i32,
    #[constant] bounded: bool,
    #[constant] unroll: usize,
    #[constant] lib_unroll: u32,
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    let bound = bounded.then_some(max_tokens(&spec) as u32);
    rt.graph_while_unrolled(&go, bound, lib_unroll, |rt| {
        for _ in 0..unroll {
            step(rt, w, kv, st, &spec, Last::ArgmaxStop { go: &go, end })?;
        }
        Ok(())
    })
}

// 3. `steps` steps in a row, no decisions: the GPU time of the kernels alone.
#[cuda_graph(warmup = 1)]
fn decode_unrolled(
    rt: &Runtime,
    #[state] w: &Weights,
    #[state] kv: &mut CudaSlice<f32>,
    #[state] st: &mut DecodeState,
    #[constant] spec: DecoderSpec,
    #[constant] steps: usize,
) -> Result<(), GraphError> {
    for _ in 0..steps {
        step(rt, w, kv, st, &spec, Last::Argmax)?;
    }
    Ok(())
}

/// The end token: the one whose first appearance in `full` comes last, with the number of
/// tokens a generation stopping at it produces; or none (-1) when that would be under a
/// quarter of the sequence.
fn pick_end(full: &[i32]) -> (i32, usize) {
    let mut best = (-1, full.len());
    let mut last_new = 0;
    for (i, t) in full.iter().enumerate() {
        if !full[..i].contains(t) {
            last_new = i;
            best = (*t, i + 1);
        }
    }
    if last_new + 1 < full.len() / 4 {
        (-1, full.len())
    } else {
        best
    }
}

/// What one size measured.
struct Measured {
    gpu_us: f64,
    loop_us: f64,
    loop_gpu_us: f64,
    unrolled_us: f64,
    /// The on-device loop with the library's unrolling (`graph_while_unrolled`).
    lib_unrolled_us: f64,
    bounded_us: f64,
    replay_us: f64,
    eager_us: f64,
    kernels: usize,
    generated: usize,
    end: i32,
    identical: bool,
    host_ok: Result<(), String>,
}

fn run_size(rt: &Runtime, size: Size, args: &Args) -> Result<Measured, BoxError> {
    let s = rt.stream().clone();
    let spec = size.spec(args.tokens as usize);
    let runs = args.runs as usize;
    let dec = Decoder::random(spec, &mut seeded_rng(14));
    let w = Arc::new(upload(&s, &dec)?);
    let fresh = || -> Result<(CudaSlice<f32>, DecodeState), GraphError> {
        Ok((
            s.alloc_zeros::<f32>(spec.kv_len())?,
            DecodeState::new(&s, &spec, max_tokens(&spec))?,
        ))
    };

    // a. A first eager run without stopping: the sequence, and the end token.
    let (mut kv, mut st) = fresh()?;
    restart(&s, &mut kv, &mut st)?;
    let n = max_tokens(&spec);
    for _ in 0..n {
        decode_step(rt, &w, &mut kv, &mut st, spec)?;
    }
    let full = generated(&s, &st)?;
    let (end, expected) = pick_end(&full);
    let host_ok = check_against_host(&dec, &full, CPU_TOKENS).map(drop);

    // b. The eager loop: graph_while on the host, a read of the condition per token.
    let mut eager_runs = Vec::new();
    let mut sequences = Vec::new();
    for _ in 0..runs {
        restart(&s, &mut kv, &mut st)?;
        let ((), us) = wall_once(&s, || {
            decode_loop(rt, &w, &mut kv, &mut st, spec, end, false, 1, 1)
        })?;
        let seq = generated(&s, &st)?;
        eager_runs.push(us / seq.len() as f64);
        sequences.push(seq);
    }

    // c. One replay per token, then a host read of the token to decide.
    let (kv_r, st_r) = fresh()?;
    let mut one = DecodeStepGraph::capture(rt, w.clone(), kv_r, st_r, spec)?;
    let mut replay_runs = Vec::new();
    for _ in 0..runs {
        {
            let state = one.state_mut();
            let (mut kv, st) = (state.kv, state.st);
            restart(&s, &mut kv, st)?;
        }
        let (count, us) = wall_once(&s, || {
            let mut count = 0;
            loop {
                one.launch()?;
                count += 1;
                let token = s.clone_dtoh(&one.state_mut().st.token)?[0];
                if token == end || count == n {
                    return Ok(count);
                }
            }
        })?;
        replay_runs.push(us / count as f64);
        sequences.push(generated(&s, one.state_mut().st)?);
    }

    // d. The on-device loop: one launch per generation; plain, with the library bound, and
    //    with `unroll` steps per iteration.
    let kernels = one.info().kinds.kernels;
    let mut loop_runs = Vec::new();
    let mut loop_gpu_runs = Vec::new();
    let mut bounded_runs = Vec::new();
    let mut unrolled_runs = Vec::new();
    let mut lib_runs = Vec::new();
    let unroll = args.unroll as usize;
    for (bounded, k, lib) in [
        (false, 1, 1),
        (true, 1, 1),
        (false, unroll, 1),
        (false, 1, args.unroll),
    ] {
        let (kv_l, st_l) = fresh()?;
        let mut looped =
            DecodeLoopGraph::capture(rt, w.clone(), kv_l, st_l, spec, end, bounded, k, lib)?;
        for _ in 0..runs {
            {
                let state = looped.state_mut();
                let (mut kv, st) = (state.kv, state.st);
                restart(&s, &mut kv, st)?;
            }
            let t = once(&s, || looped.launch().map(drop))?;
            let seq = generated(&s, looped.state_mut().st)?;
            let n = seq.len() as f64;
            match (bounded, k) {
                (true, _) => bounded_runs.push(t.wall_us / n),
                _ if lib > 1 => lib_runs.push(t.wall_us / n),
                (false, 1) => {
                    loop_runs.push(t.wall_us / n);
                    loop_gpu_runs.push(t.gpu_us / n);
                }
                _ => unrolled_runs.push(t.wall_us / n),
            }
            sequences.push(seq);
        }
    }

    // e. The GPU time of the kernels alone: UNROLL steps per launch, back to back, events.
    let (kv_u, st_u) = fresh()?;
    let mut unrolled = DecodeUnrolledGraph::capture(rt, w.clone(), kv_u, st_u, spec, UNROLL)?;
    let launches = (expected / UNROLL).max(1);
    let mut gpu_runs = Vec::new();
    for _ in 0..runs {
        {
            let state = unrolled.state_mut();
            let (mut kv, st) = (state.kv, state.st);
            restart(&s, &mut kv, st)?;
        }
        let t = once(&s, || {
            for _ in 0..launches {
                unrolled.launch()?;
            }
            Ok(())
        })?;
        gpu_runs.push(t.gpu_us / (launches * UNROLL) as f64);
    }

    let want = &full[..expected];
    let identical = sequences.iter().all(|seq| seq.as_slice() == want);
    Ok(Measured {
        gpu_us: median(gpu_runs),
        loop_us: median(loop_runs),
        loop_gpu_us: median(loop_gpu_runs),
        unrolled_us: median(unrolled_runs),
        lib_unrolled_us: median(lib_runs),
        bounded_us: median(bounded_runs),
        replay_us: median(replay_runs),
        eager_us: median(eager_runs),
        kernels,
        generated: expected,
        end,
        identical,
        host_ok,
    })
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(rt) = runtime_or_skip("14-decode-loop") else {
        return Ok(());
    };
    let device = rt.context().name().unwrap_or_default();
    let mut failures = Vec::new();
    for &size in &args.sizes {
        let spec = size.spec(args.tokens as usize);
        let m = run_size(&rt, size, &args)?;
        println!(
            "\n### {size}: {} blocks, width {}, {} heads, ffn {}, vocab {} on {device}",
            spec.layers, spec.dim, spec.heads, spec.ffn, spec.vocab
        );
        println!(
            "{} tokens generated of at most {} ({}), median of {} runs; {} kernels per token\n",
            m.generated,
            max_tokens(&spec),
            if m.end >= 0 {
                format!("stopped on the device at end token {}", m.end)
            } else {
                "no end token: the length bound stops it".to_owned()
            },
            args.runs,
            m.kernels
        );
        let mut t = Table::new(&[
            "per token",
            ">launches per sequence",
            ">µs per token",
            ">vs kernels' GPU time",
            ">speedup vs replay + read",
        ]);
        let row = |t: &mut Table, what: &str, launches: String, v: f64| {
            t.row(vec![
                what.into(),
                launches,
                us(v),
                format!("{:+.1}%", (v / m.gpu_us - 1.0) * 100.0),
                format!("{:.2}×", m.replay_us / v),
            ]);
        };
        row(
            &mut t,
            "GPU time of one token's kernels (unrolled graph, events)",
            "—".into(),
            m.gpu_us,
        );
        row(
            &mut t,
            "on-device loop (`graph_while`), wall",
            "1".into(),
            m.loop_us,
        );
        row(
            &mut t,
            "on-device loop, GPU time (events)",
            "1".into(),
            m.loop_gpu_us,
        );
        row(
            &mut t,
            "on-device loop + `max_iterations` bound, wall",
            "1".into(),
            m.bounded_us,
        );
        row(
            &mut t,
            &format!(
                "on-device loop, {} steps per iteration (hand-unrolled, done flag), wall",
                args.unroll
            ),
            "1".into(),
            m.unrolled_us,
        );
        row(
            &mut t,
            &format!(
                "on-device loop, {} steps per iteration (`graph_while_unrolled`), wall",
                args.unroll
            ),
            "1".into(),
            m.lib_unrolled_us,
        );
        row(
            &mut t,
            "one replay per token + host read of the token",
            m.generated.to_string(),
            m.replay_us,
        );
        row(
            &mut t,
            "eager loop (host reads the condition per token)",
            format!("{}", m.generated * m.kernels),
            m.eager_us,
        );
        print!("{}", t.to_markdown());
        println!(
            "tokens: every variant generated the same {} tokens: {}; first {CPU_TOKENS} vs the f64 host \
             model: {}",
            m.generated,
            if m.identical { "yes" } else { "NO" },
            match &m.host_ok {
                Ok(()) => "match".to_owned(),
                Err(e) => format!("FAILED: {e}"),
            }
        );
        if args.json {
            let what = format!(
                "decode until an end token, {} layers, dim {}, vocab {} ({} tokens)",
                spec.layers, spec.dim, spec.vocab, m.generated
            );
            let rec = Record::new(
                "decode_loop",
                Side::Ours,
                format!("decode_loop/{size}"),
                what,
                m.replay_us,
                m.loop_us,
            )
            .shape("tokens", max_tokens(&spec))
            .shape("layers", spec.layers)
            .shape("dim", spec.dim)
            .shape("heads", spec.heads)
            .shape("ffn", spec.ffn)
            .shape("vocab", spec.vocab)
            .kernels(m.kernels)
            .check(
                "tokens identical: eager loop, replay + read, on-device loop (with and without bound); \
                 8 vs f64 host",
                m.identical && m.host_ok.is_ok(),
            )
            .with("generated", m.generated)
            .with("gpu_token_us", m.gpu_us)
            .with("loop_gpu_us", m.loop_gpu_us)
            .with("bounded_us", m.bounded_us)
            .with("unrolled_us", m.unrolled_us)
            .with("unroll", args.unroll)
            .with("lib_unrolled_us", m.lib_unrolled_us)
            .with("eager_loop_us", m.eager_us);
            println!("{}", rec.line());
        }
        if !m.identical {
            failures.push(format!("{size}: the variants generated different tokens"));
        }
        if let Err(e) = m.host_ok {
            failures.push(format!("{size}: host check: {e}"));
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    Ok(())
}
