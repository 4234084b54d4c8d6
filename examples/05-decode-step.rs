//! # 05 — an LLM decode step: one graph for every token
//!
//! Borrows from this workspace: `workloads` (the decoder and its f64 host model, comparisons,
//! timing, the runtime or a skip) and `bench-report` (records, tables).
//!
//! A small pre-norm transformer (8 blocks, width 512, 8 heads, SwiGLU feed-forward of 1536,
//! vocabulary 4096) generates 256 tokens greedily at batch 1. Each step is: embedding,
//! then per block RMSNorm → QKV projection (cuBLAS GEMV) → rotary embedding and KV-cache
//! write → attention over the cache → output projection + residual → RMSNorm → gate/up
//! projection → SiLU·up → down projection + residual; then the final RMSNorm, the logits
//! and a greedy argmax. 76 launches per token.
//!
//! What makes **one** graph serve all 256 tokens: nothing that changes from token to token
//! is a host value. The current token and its position live in device memory (`#[state]`
//! `DecodeState`); the kernels read them through pointers, and the last kernel writes the
//! next token, appends it to the output and moves the position on. The graphed loop is 256
//! `launch` calls and one read at the end: no host round trip per token. The KV cache is
//! `#[state] kv: &mut CudaSlice<f32>`, written in place.
//!
//! Checks: the 256 tokens of the eager loop and of the graph loop are identical (5 runs
//! each); the first step's logits match the f64 host reference; the first 16 tokens are the
//! host reference's greedy choice given the same prefix.
//!
//! The model on the GPU (weights, state, the step's launches, restart, the check against the
//! host) is `workloads::decode`, shared with `14-decode-loop`; this file holds the graph
//! over it and the measurements.
//!
//! Run: `cargo run --release --example 05-decode-step` (`-- --json` for machine-readable
//! lines).

use std::sync::Arc;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use clap::Parser;
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime, Tolerance};
use workloads::check::{max_scaled_diff, verified};
use workloads::decode::{
    check_against_host, generated, restart, step, upload, DecodeState, Last, Weights, BOS,
    KERNEL_MAX_SEQ,
};
use workloads::reference::{Decoder, DecoderSpec, HostKvCache};
use workloads::testing::{runtime_or_skip, seeded_rng};
use workloads::timing::{median, wall_once};

/// Greedy decoding of a small transformer at batch 1, eager and with one graph for every
/// token.
#[derive(Parser)]
struct Args {
    /// Print one JSON line for the report after the table.
    #[arg(long)]
    json: bool,
}

const SPEC: DecoderSpec = DecoderSpec {
    dim: 512,
    heads: 8,
    layers: 8,
    ffn: 1536,
    vocab: 4096,
    max_seq: 256,
    theta: 10_000.0,
    eps: 1e-5,
};
/// Tokens generated per run: the whole cache.
const TOKENS: usize = SPEC.max_seq;
/// Timed runs of each loop.
const RUNS: usize = 5;
/// Tokens checked against the host reference.
const CPU_TOKENS: usize = 16;
const _: () = assert!(
    SPEC.max_seq <= KERNEL_MAX_SEQ,
    "the attention kernel holds at most 1024 scores"
);

// 1. One decode step. No parameter changes between tokens: the token and the position are
//    read on the device (in `DecodeState`), so the graph captured from this body is right for
//    every position. The step's 76 launches are `workloads::decode::step` (shared with
//    `14-decode-loop`); its last kernel writes the next token (argmax) at *pos, then
//    *pos += 1.
#[cuda_graph(warmup = 2)]
fn decode_step(
    rt: &Runtime,
    #[state] w: &Weights,
    #[state] kv: &mut CudaSlice<f32>,
    #[state] st: &mut DecodeState,
) -> Result<(), GraphError> {
    step(rt, w, kv, st, &SPEC, Last::Argmax)
}

/// A decoder that keeps its captured step next to the weights it reads: the graph owns its
/// cache and state and shares the weights, so it has no borrowed lifetime
/// (`DecodeStepGraph<'static>`) and can live in a struct.
struct Engine {
    graph: DecodeStepGraph<'static>,
}

impl Engine {
    fn new(rt: &Runtime, weights: Arc<Weights>) -> Result<Self, GraphError> {
        let s = rt.stream();
        let mut kv = s.alloc_zeros::<f32>(SPEC.kv_len())?;
        let mut st = DecodeState::new(s, &SPEC, TOKENS)?;
        restart(s, &mut kv, &mut st)?;
        let mut graph = DecodeStepGraph::capture(rt, weights, kv, st)?;
        // One step checked against the eager function (`generate` restarts afterwards).
        println!("{}", verified(graph.verify(Tolerance::BITWISE)?)?);
        Ok(Engine { graph })
    }

    /// Generates `TOKENS` tokens from BOS: µs per token and the tokens.
    fn generate(&mut self, s: &Arc<CudaStream>) -> Result<(f64, Vec<i32>), GraphError> {
        let state = self.graph.state_mut();
        let (mut kv, st) = (state.kv, state.st);
        restart(s, &mut kv, st)?;
        let ((), us) = wall_once(s, || {
            for _ in 0..TOKENS {
                self.graph.launch()?;
            }
            Ok(())
        })?;
        Ok((us / TOKENS as f64, generated(s, self.graph.state_mut().st)?))
    }
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(rt) = runtime_or_skip("05-decode-step") else {
        return Ok(());
    };
    let s = rt.stream().clone();

    // 3. Random weights (host copy kept for the reference), one cache and state per loop.
    let dec = Decoder::random(SPEC, &mut seeded_rng(5));
    let w = Arc::new(upload(&s, &dec)?); // shared by the eager loop and the engine's graph
    let mut kv_eager = s.alloc_zeros::<f32>(SPEC.kv_len())?;
    let mut st_eager = DecodeState::new(&s, &SPEC, TOKENS)?;

    // 4. The first step's logits against the host.
    decode_step(&rt, &w, &mut kv_eager, &mut st_eager)?;
    let gpu_logits = s.clone_dtoh(st_eager.logits())?;
    let host_logits = dec.step(&mut HostKvCache::new(&SPEC), BOS as usize, 0);
    let logit_err = max_scaled_diff(&gpu_logits, &host_logits);

    // 5. The eager loop: 256 calls, one synchronize at the end.
    let mut eager_runs = Vec::new();
    let mut eager_tokens = Vec::new();
    for _ in 0..RUNS {
        restart(&s, &mut kv_eager, &mut st_eager)?;
        let ((), us) = wall_once(&s, || {
            for _ in 0..TOKENS {
                decode_step(&rt, &w, &mut kv_eager, &mut st_eager)?;
            }
            Ok(())
        })?;
        eager_runs.push(us / TOKENS as f64);
        eager_tokens.push(generated(&s, &st_eager)?);
    }

    // 6. The graph, inside an engine that owns it with its cache and state (the weights are
    //    shared): captured once, then 256 launches per run. The warmup's two steps leave
    //    the cache and the state as they were (the graph snapshots and restores them).
    let mut engine = Engine::new(&rt, w.clone())?;
    let nodes = engine.graph.info().kinds.kernels;
    let mut graph_runs = Vec::new();
    let mut graph_tokens = Vec::new();
    for _ in 0..RUNS {
        let (us, tokens) = engine.generate(&s)?;
        graph_runs.push(us);
        graph_tokens.push(tokens);
    }

    // 7. Every run of both loops produced the same 256 tokens.
    let reference = &eager_tokens[0];
    let identical = eager_tokens
        .iter()
        .chain(&graph_tokens)
        .all(|t| t == reference);
    let first_diff = graph_tokens[0]
        .iter()
        .zip(reference)
        .position(|(a, b)| a != b);
    let mut distinct = reference.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let host_check = check_against_host(&dec, reference, CPU_TOKENS);

    let (eager_us, graph_us) = (median(eager_runs), median(graph_runs));
    let device = rt.context().name().unwrap_or_default();
    println!(
        "decode at batch 1 on {device}: {} blocks, width {}, {} heads, ffn {}, vocab {}; {TOKENS} tokens, median of {RUNS} runs\n",
        SPEC.layers, SPEC.dim, SPEC.heads, SPEC.ffn, SPEC.vocab
    );
    let mut t = Table::new(&[
        "loop",
        ">launches per token",
        ">µs per token",
        ">tokens/s",
        ">speedup",
    ]);
    t.row(vec![
        "eager (one call per step)".into(),
        nodes.to_string(),
        us(eager_us),
        format!("{:.0}", 1e6 / eager_us),
        "1.00×".into(),
    ]);
    t.row(vec![
        "graph (one launch per step)".into(),
        "1".into(),
        us(graph_us),
        format!("{:.0}", 1e6 / graph_us),
        format!("{:.2}×", eager_us / graph_us),
    ]);
    print!("{}", t.to_markdown());
    println!(
        "\nfirst tokens: {:?} … ({} distinct of {TOKENS})",
        &reference[..16.min(reference.len())],
        distinct.len()
    );
    println!("first-step logits vs host: max error {logit_err:.1e}");
    match &host_check {
        Ok(gap) => println!("first {CPU_TOKENS} tokens are the host's greedy choices (largest forgiven near-tie gap {gap:.1e})"),
        Err(e) => println!("host check FAILED: {e}"),
    }
    if args.json {
        let what = format!(
            "decode step, {} layers, dim {}, vocab {} ({TOKENS} tokens)",
            SPEC.layers, SPEC.dim, SPEC.vocab
        );
        let rec = Record::new("decode", Side::Ours, "decode", what, eager_us, graph_us)
            .shape("tokens", TOKENS)
            .shape("layers", SPEC.layers)
            .shape("dim", SPEC.dim)
            .shape("heads", SPEC.heads)
            .shape("ffn", SPEC.ffn)
            .shape("vocab", SPEC.vocab)
            .kernels(nodes)
            .check(
                "256 greedy tokens, eager vs graph, 5 runs each; 16 vs f64 host",
                identical && host_check.is_ok() && logit_err < 1e-3,
            )
            .with("eager_tok_s", 1e6 / eager_us)
            .with("graph_tok_s", 1e6 / graph_us)
            .with("distinct_tokens", distinct.len());
        println!("{}", rec.line());
    }

    if !identical {
        return Err(format!(
            "eager and graph token sequences differ (first graph run differs at position {first_diff:?})"
        )
        .into());
    }
    if logit_err >= 1e-3 {
        return Err(format!("first-step logits are off the host reference by {logit_err}").into());
    }
    host_check?;
    println!("eager and graph generated the same {TOKENS} tokens in every run");
    Ok(())
}
