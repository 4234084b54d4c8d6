//! # 05 — an LLM decode step: one graph for every token
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
//! Run: `cargo run --release --example 05-decode-step` (`-- --json` for machine-readable
//! lines).

use std::sync::Arc;
use std::time::Instant;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use clap::Parser;
use graph_runtime::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use graph_runtime::{cuda_graph, BoxError, DeviceState, GraphError, Runtime, Tolerance};
use workloads::check::{max_scaled_diff, verified};
use workloads::kernels::DECODE;
use workloads::ops::blas::matvec;
use workloads::reference::{argmax, Decoder, DecoderLayer, DecoderSpec, HostKvCache};
use workloads::testing::{runtime_or_skip, seeded_rng};
use workloads::timing::median;

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
/// The first token.
const BOS: i32 = 1;
/// Timed runs of each loop.
const RUNS: usize = 5;
/// Tokens checked against the host reference.
const CPU_TOKENS: usize = 16;
/// The `MAX_SEQ` of the attention kernel's shared memory.
const KERNEL_MAX_SEQ: usize = 1024;
const _: () = assert!(
    SPEC.max_seq <= KERNEL_MAX_SEQ,
    "the attention kernel holds at most 1024 scores"
);

/// The weights on the device, each kind stacked over the blocks (block `l`'s `wqkv` is
/// `wqkv[l · 3·dim·dim ..]`).
#[derive(DeviceState)]
struct Weights {
    embed: CudaSlice<f32>,
    attn_norm: CudaSlice<f32>,
    wqkv: CudaSlice<f32>,
    wo: CudaSlice<f32>,
    ffn_norm: CudaSlice<f32>,
    w13: CudaSlice<f32>,
    w2: CudaSlice<f32>,
    final_norm: CudaSlice<f32>,
    lm_head: CudaSlice<f32>,
}

/// What a step reads and writes besides the weights and the cache: the current token and
/// position (device values), the generated tokens, and the activations.
#[derive(DeviceState)]
struct DecodeState {
    token: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    tokens: CudaSlice<i32>,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    h: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

impl DecodeState {
    fn new(s: &Arc<CudaStream>) -> Result<Self, GraphError> {
        let d = SPEC.dim;
        Ok(DecodeState {
            token: s.clone_htod(&[BOS])?,
            pos: s.alloc_zeros(1)?,
            tokens: s.alloc_zeros(TOKENS)?,
            x: s.alloc_zeros(d)?,
            xn: s.alloc_zeros(d)?,
            qkv: s.alloc_zeros(3 * d)?,
            attn: s.alloc_zeros(d)?,
            gu: s.alloc_zeros(2 * SPEC.ffn)?,
            h: s.alloc_zeros(SPEC.ffn)?,
            logits: s.alloc_zeros(SPEC.vocab)?,
        })
    }
}

/// Back to the start: token BOS at position 0, cache and output cleared (host-side, between
/// runs; never inside the graph).
fn restart(
    s: &Arc<CudaStream>,
    kv: &mut impl DevicePtrMut<f32>,
    st: &mut DecodeState,
) -> Result<(), GraphError> {
    s.memset_zeros(kv)?;
    s.memset_zeros(&mut st.pos)?;
    s.memset_zeros(&mut st.tokens)?;
    s.memcpy_htod([BOS].as_slice(), &mut st.token)?;
    Ok(())
}

fn one_block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

// 1. One decode step. No parameter changes between tokens: the token and the position are
//    read on the device, so the graph captured from this body is right for every position.
#[cuda_graph(warmup = 2)]
fn decode_step(
    rt: &Runtime,
    #[state] w: &Weights,
    #[state] kv: &mut CudaSlice<f32>,
    #[state] st: &mut DecodeState,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let embed = rt.function(DECODE, "embed")?;
    let rmsnorm = rt.function(DECODE, "rmsnorm")?;
    let rope_kv = rt.function(DECODE, "rope_kv")?;
    let attention = rt.function(DECODE, "attention")?;
    let silu_mul = rt.function(DECODE, "silu_mul")?;
    let argmax_advance = rt.function(DECODE, "argmax_advance")?;
    let (d, ffn) = (SPEC.dim, SPEC.ffn);
    let (di, hd, ms, fi, vi) = (
        d as i32,
        SPEC.head_dim() as i32,
        SPEC.max_seq as i32,
        ffn as i32,
        SPEC.vocab as i32,
    );
    let (eps, theta, tokens) = (SPEC.eps, SPEC.theta, TOKENS as i32);
    let heads = LaunchConfig {
        grid_dim: (SPEC.heads as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };

    // SAFETY: `embed` reads row *token (< vocab: argmax_advance only writes indices below
    // vocab, restart writes BOS) of the [vocab, dim] table and writes dim floats of `x`.
    unsafe {
        s.launch_builder(&embed)
            .arg(&w.embed)
            .arg(&st.token)
            .arg(&mut st.x)
            .arg(&di)
            .launch(LaunchConfig::for_num_elems(d as u32))?;
    }
    for l in 0..SPEC.layers {
        let li = l as i32;
        let attn_norm = w.attn_norm.slice(l * d..(l + 1) * d);
        let ffn_norm = w.ffn_norm.slice(l * d..(l + 1) * d);
        let wqkv = w.wqkv.slice(l * 3 * d * d..(l + 1) * 3 * d * d);
        let wo = w.wo.slice(l * d * d..(l + 1) * d * d);
        let w13 = w.w13.slice(l * 2 * ffn * d..(l + 1) * 2 * ffn * d);
        let w2 = w.w2.slice(l * d * ffn..(l + 1) * d * ffn);

        // Attention block.
        // SAFETY: rmsnorm reads dim floats of `x` and the norm weight, writes dim of `xn`.
        unsafe {
            s.launch_builder(&rmsnorm)
                .arg(&st.x)
                .arg(&attn_norm)
                .arg(&mut st.xn)
                .arg(&di)
                .arg(&eps)
                .launch(one_block(512))?;
        }
        matvec(rt, &wqkv, &st.xn, &mut st.qkv, 3 * d, d, 0.0)?;
        // SAFETY: one thread per element of dim: q and k pairs of `qkv` (3·dim floats) are
        // rotated in place; k and v go to row *pos (< max_seq while pos < TOKENS = max_seq)
        // of layer l's cache, inside the layers·2·max_seq·dim floats of `kv`.
        unsafe {
            s.launch_builder(&rope_kv)
                .arg(&mut st.qkv)
                .arg(&mut *kv)
                .arg(&st.pos)
                .arg(&li)
                .arg(&di)
                .arg(&hd)
                .arg(&ms)
                .arg(&theta)
                .launch(LaunchConfig::for_num_elems(d as u32))?;
        }
        // SAFETY: one block per head reads q from `qkv`, rows 0..=*pos (clamped to max_seq,
        // at most the kernel's MAX_SEQ: checked at compile time) of layer l's cache, and writes
        // head_dim floats of `attn` per head.
        unsafe {
            s.launch_builder(&attention)
                .arg(&st.qkv)
                .arg(&*kv)
                .arg(&mut st.attn)
                .arg(&st.pos)
                .arg(&li)
                .arg(&di)
                .arg(&hd)
                .arg(&ms)
                .launch(heads)?;
        }
        // Residual: x += Wo · attn (cuBLAS with beta = 1 adds to x in place).
        matvec(rt, &wo, &st.attn, &mut st.x, d, d, 1.0)?;

        // Feed-forward block.
        // SAFETY: as above.
        unsafe {
            s.launch_builder(&rmsnorm)
                .arg(&st.x)
                .arg(&ffn_norm)
                .arg(&mut st.xn)
                .arg(&di)
                .arg(&eps)
                .launch(one_block(512))?;
        }
        matvec(rt, &w13, &st.xn, &mut st.gu, 2 * ffn, d, 0.0)?;
        // SAFETY: reads 2·ffn floats of `gu`, writes ffn of `h`.
        unsafe {
            s.launch_builder(&silu_mul)
                .arg(&st.gu)
                .arg(&mut st.h)
                .arg(&fi)
                .launch(LaunchConfig::for_num_elems(ffn as u32))?;
        }
        matvec(rt, &w2, &st.h, &mut st.x, d, ffn, 1.0)?;
    }
    let final_norm = &w.final_norm;
    // SAFETY: as the block norms.
    unsafe {
        s.launch_builder(&rmsnorm)
            .arg(&st.x)
            .arg(final_norm)
            .arg(&mut st.xn)
            .arg(&di)
            .arg(&eps)
            .launch(one_block(512))?;
    }
    matvec(rt, &w.lm_head, &st.xn, &mut st.logits, SPEC.vocab, d, 0.0)?;
    // 2. The step's last kernel: next token = argmax, appended at *pos, then *pos += 1.
    // SAFETY: one block of 1024 threads (the kernel's shared arrays hold 1024) reads vocab
    // logits and writes one int each of `token` and `pos`, and `tokens[*pos]` only while
    // *pos < TOKENS, the buffer's length.
    unsafe {
        s.launch_builder(&argmax_advance)
            .arg(&st.logits)
            .arg(&vi)
            .arg(&mut st.token)
            .arg(&mut st.pos)
            .arg(&mut st.tokens)
            .arg(&tokens)
            .launch(one_block(1024))?;
    }
    Ok(())
}

fn upload(s: &Arc<CudaStream>, dec: &Decoder) -> Result<Weights, GraphError> {
    let stack = |f: &dyn Fn(&DecoderLayer) -> &Vec<f32>| {
        dec.layers
            .iter()
            .flat_map(|l| f(l).iter().copied())
            .collect::<Vec<f32>>()
    };
    Ok(Weights {
        embed: s.clone_htod(&dec.embed)?,
        attn_norm: s.clone_htod(&stack(&|l| &l.attn_norm))?,
        wqkv: s.clone_htod(&stack(&|l| &l.wqkv))?,
        wo: s.clone_htod(&stack(&|l| &l.wo))?,
        ffn_norm: s.clone_htod(&stack(&|l| &l.ffn_norm))?,
        w13: s.clone_htod(&stack(&|l| &l.w13))?,
        w2: s.clone_htod(&stack(&|l| &l.w2))?,
        final_norm: s.clone_htod(&dec.final_norm)?,
        lm_head: s.clone_htod(&dec.lm_head)?,
    })
}

/// Checks a generated sequence against the host model, teacher-forced: at each of the first
/// `n` positions the host sees the GPU's prefix and must choose the GPU's token, unless its
/// two candidates are within rounding of each other. Returns the largest logit gap that
/// was forgiven, or where the choice differs.
fn check_against_host(dec: &Decoder, tokens: &[i32], n: usize) -> Result<f32, String> {
    let mut cache = HostKvCache::new(&dec.spec);
    let mut forgiven = 0.0f32;
    for p in 0..n.min(tokens.len()) {
        let input = if p == 0 { BOS } else { tokens[p - 1] } as usize;
        let logits = dec.step(&mut cache, input, p);
        let (want, got) = (argmax(&logits), tokens[p] as usize);
        if want != got {
            let gap = logits[want] - logits[got];
            if gap > 1e-3 * logits[want].abs().max(1.0) {
                return Err(format!(
                    "position {p}: the GPU chose token {got}, the host {want} (logit gap {gap})"
                ));
            }
            forgiven = forgiven.max(gap);
        }
    }
    Ok(forgiven)
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
        let mut st = DecodeState::new(s)?;
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
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..TOKENS {
            self.graph.launch()?;
        }
        s.synchronize()?;
        let us = t.elapsed().as_secs_f64() * 1e6 / TOKENS as f64;
        Ok((us, s.clone_dtoh(&self.graph.state_mut().st.tokens)?))
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
    let mut st_eager = DecodeState::new(&s)?;

    // 4. The first step's logits against the host.
    decode_step(&rt, &w, &mut kv_eager, &mut st_eager)?;
    let gpu_logits = s.clone_dtoh(&st_eager.logits)?;
    let host_logits = dec.step(&mut HostKvCache::new(&SPEC), BOS as usize, 0);
    let logit_err = max_scaled_diff(&gpu_logits, &host_logits);

    // 5. The eager loop: 256 calls, one synchronize at the end.
    let mut eager_runs = Vec::new();
    let mut eager_tokens = Vec::new();
    for _ in 0..RUNS {
        restart(&s, &mut kv_eager, &mut st_eager)?;
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..TOKENS {
            decode_step(&rt, &w, &mut kv_eager, &mut st_eager)?;
        }
        s.synchronize()?;
        eager_runs.push(t.elapsed().as_secs_f64() * 1e6 / TOKENS as f64);
        eager_tokens.push(s.clone_dtoh(&st_eager.tokens)?);
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
