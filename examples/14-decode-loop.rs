//! # 14 — decode until the end token: a whole generation in one graph launch
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
//! `example05`: 424 µs of kernels, on-device loop +1.2%.
//!
//! Run: `cargo run --release --example 14-decode-loop` (`-- --json` adds one JSON line per
//! size; `-- --sizes tiny,small` picks sizes).

use std::sync::Arc;
use std::time::Instant;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use clap::{Parser, ValueEnum};
use graph_runtime::cudarc::driver::sys::CUevent_flags;
use graph_runtime::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use graph_runtime::{cuda_graph, BoxError, Condition, DeviceState, GraphError, Runtime};
use workloads::kernels::DECODE;
use workloads::ops::blas::matvec;
use workloads::reference::{argmax, Decoder, DecoderLayer, DecoderSpec, HostKvCache};
use workloads::testing::{runtime_or_skip, seeded_rng};
use workloads::timing::median;

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

/// The first token.
const BOS: i32 = 1;
/// Steps per launch of the unrolled graph that measures the kernels' GPU time.
const UNROLL: usize = 8;
/// Tokens checked against the host model.
const CPU_TOKENS: usize = 8;

/// The weights on the device, each kind stacked over the blocks (as in `05-decode-step`).
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

/// The current token and position (device values), the generated tokens, the activations.
#[derive(DeviceState)]
struct DecodeState {
    token: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    /// 1 once the end token or the length limit is reached (the stopping steps only).
    done: CudaSlice<i32>,
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
    fn new(s: &Arc<CudaStream>, spec: &DecoderSpec) -> Result<Self, GraphError> {
        let d = spec.dim;
        Ok(DecodeState {
            token: s.clone_htod(&[BOS])?,
            pos: s.alloc_zeros(1)?,
            done: s.alloc_zeros(1)?,
            tokens: s.alloc_zeros(max_tokens(spec))?,
            x: s.alloc_zeros(d)?,
            xn: s.alloc_zeros(d)?,
            qkv: s.alloc_zeros(3 * d)?,
            attn: s.alloc_zeros(d)?,
            gu: s.alloc_zeros(2 * spec.ffn)?,
            h: s.alloc_zeros(spec.ffn)?,
            logits: s.alloc_zeros(spec.vocab)?,
        })
    }
}

/// Tokens a sequence may have: the cache's positions but the slack row.
fn max_tokens(spec: &DecoderSpec) -> usize {
    spec.max_seq - 1
}

/// Back to the start: BOS at position 0, cache and output cleared (host-side, between runs).
fn restart(
    s: &Arc<CudaStream>,
    kv: &mut impl DevicePtrMut<f32>,
    st: &mut DecodeState,
) -> Result<(), GraphError> {
    s.memset_zeros(kv)?;
    s.memset_zeros(&mut st.pos)?;
    s.memset_zeros(&mut st.done)?;
    s.memset_zeros(&mut st.tokens)?;
    s.memcpy_htod([BOS].as_slice(), &mut st.token)?;
    Ok(())
}

/// The step's last kernel when the loop runs on the device: greedy argmax as in `DECODE`'s
/// `argmax_advance`, then the loop's condition: go on while the token is not the end token
/// and the output has room. Once that is no longer so, `done` is set and later calls (the
/// rest of an unrolled iteration) change nothing.
const STOP: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
extern "C" __global__ void argmax_advance_stop(const float *logits, int vocab, int *token, int *pos,
                                               int *done, int *tokens, int max_tokens, int end_token,
                                               GraphCondition go) {
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    float bv = __int_as_float(0xff800000);
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = logits[i];
        if (v > bv) { bv = v; bi = i; }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            float ov = best_v[threadIdx.x + stride];
            int oi = best_i[threadIdx.x + stride];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (*done) {
            graph_condition_set(go, false);
        } else {
            int p = *pos;
            int next = best_i[0];
            *token = next;
            if (p >= 0 && p < max_tokens) tokens[p] = next;
            *pos = p + 1;
            bool more = next != end_token && p + 1 < max_tokens;
            if (!more) *done = 1;
            graph_condition_set(go, more);
        }
    }
}
"#
);

fn one_block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// How a step ends: the plain argmax, or the argmax that also sets the loop's condition.
#[derive(Clone, Copy)]
enum Last<'a> {
    Argmax,
    ArgmaxStop { go: &'a Condition, end: i32 },
}

/// One decode step's kernels (as in `05-decode-step`, for any size).
fn step(
    rt: &Runtime,
    w: &Weights,
    kv: &mut CudaSlice<f32>,
    st: &mut DecodeState,
    spec: &DecoderSpec,
    last: Last<'_>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let embed = rt.function(DECODE, "embed")?;
    let rmsnorm = rt.function(DECODE, "rmsnorm")?;
    let rope_kv = rt.function(DECODE, "rope_kv")?;
    let attention = rt.function(DECODE, "attention")?;
    let silu_mul = rt.function(DECODE, "silu_mul")?;
    let (d, ffn) = (spec.dim, spec.ffn);
    let (di, hd, ms, fi, vi) = (
        d as i32,
        spec.head_dim() as i32,
        spec.max_seq as i32,
        ffn as i32,
        spec.vocab as i32,
    );
    let (eps, theta, tokens) = (spec.eps, spec.theta, max_tokens(spec) as i32);
    let heads = LaunchConfig {
        grid_dim: (spec.heads as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `embed` reads row *token (< vocab: the argmax writes indices below vocab,
    // restart writes BOS) of the [vocab, dim] table and writes dim floats of `x`.
    unsafe {
        s.launch_builder(&embed)
            .arg(&w.embed)
            .arg(&st.token)
            .arg(&mut st.x)
            .arg(&di)
            .launch(LaunchConfig::for_num_elems(d as u32))?;
    }
    for l in 0..spec.layers {
        let li = l as i32;
        let attn_norm = w.attn_norm.slice(l * d..(l + 1) * d);
        let ffn_norm = w.ffn_norm.slice(l * d..(l + 1) * d);
        let wqkv = w.wqkv.slice(l * 3 * d * d..(l + 1) * 3 * d * d);
        let wo = w.wo.slice(l * d * d..(l + 1) * d * d);
        let w13 = w.w13.slice(l * 2 * ffn * d..(l + 1) * 2 * ffn * d);
        let w2 = w.w2.slice(l * d * ffn..(l + 1) * d * ffn);
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
        // SAFETY: one thread per element of dim rotates q and k of `qkv` (3·dim floats) and
        // writes row *pos of layer l's cache: *pos <= max_tokens < max_seq (the loops stop at
        // max_tokens tokens, and the stopping argmax freezes *pos once done).
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
        // SAFETY: one block per head reads q, rows 0..=*pos (clamped to max_seq <= 1024, the
        // kernel's MAX_SEQ) of layer l's cache, and writes head_dim floats of `attn` per head.
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
        matvec(rt, &wo, &st.attn, &mut st.x, d, d, 1.0)?;
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
    // SAFETY: as the block norms.
    unsafe {
        s.launch_builder(&rmsnorm)
            .arg(&st.x)
            .arg(&w.final_norm)
            .arg(&mut st.xn)
            .arg(&di)
            .arg(&eps)
            .launch(one_block(512))?;
    }
    matvec(rt, &w.lm_head, &st.xn, &mut st.logits, spec.vocab, d, 0.0)?;
    // SAFETY: one block of 1024 threads (the kernels' shared arrays hold 1024) reads vocab
    // logits, writes one int each of `token`, `pos` (and `done`), and tokens[*pos] only while
    // *pos < max_tokens, the buffer's length; the stopping variant also sets the condition.
    unsafe {
        match last {
            Last::Argmax => {
                let f = rt.function(DECODE, "argmax_advance")?;
                s.launch_builder(&f)
                    .arg(&st.logits)
                    .arg(&vi)
                    .arg(&mut st.token)
                    .arg(&mut st.pos)
                    .arg(&mut st.tokens)
                    .arg(&tokens)
                    .launch(one_block(1024))?;
            }
            Last::ArgmaxStop { go, end } => {
                let f = rt.function(STOP, "argmax_advance_stop")?;
                let go = go.kernel_arg(rt);
                s.launch_builder(&f)
                    .arg(&st.logits)
                    .arg(&vi)
                    .arg(&mut st.token)
                    .arg(&mut st.pos)
                    .arg(&mut st.done)
                    .arg(&mut st.tokens)
                    .arg(&tokens)
                    .arg(&end)
                    .arg(&go)
                    .launch(one_block(1024))?;
            }
        }
    }
    Ok(())
}

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
) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    let bound = bounded.then_some(max_tokens(&spec) as u32);
    rt.graph_while(&go, bound, |rt| {
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

/// The first `n` tokens against the host model, teacher-forced (near-ties within rounding
/// are forgiven, as in `05-decode-step`).
fn check_against_host(dec: &Decoder, tokens: &[i32], n: usize) -> Result<(), String> {
    let mut cache = HostKvCache::new(&dec.spec);
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
        }
    }
    Ok(())
}

/// The tokens a generation left in `st`: `tokens[..pos]`.
fn generated(s: &Arc<CudaStream>, st: &DecodeState) -> Result<Vec<i32>, GraphError> {
    let pos = s.clone_dtoh(&st.pos)?[0].max(0) as usize;
    let all = s.clone_dtoh(&st.tokens)?;
    Ok(all[..pos.min(all.len())].to_vec())
}

/// What one size measured.
struct Measured {
    gpu_us: f64,
    loop_us: f64,
    loop_gpu_us: f64,
    unrolled_us: f64,
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
            DecodeState::new(&s, &spec)?,
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
    let host_ok = check_against_host(&dec, &full, CPU_TOKENS);

    // b. The eager loop: graph_while on the host, a read of the condition per token.
    let mut eager_runs = Vec::new();
    let mut sequences = Vec::new();
    for _ in 0..runs {
        restart(&s, &mut kv, &mut st)?;
        s.synchronize()?;
        let t = Instant::now();
        decode_loop(rt, &w, &mut kv, &mut st, spec, end, false, 1)?;
        s.synchronize()?;
        let seq = generated(&s, &st)?;
        eager_runs.push(t.elapsed().as_secs_f64() * 1e6 / seq.len() as f64);
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
        s.synchronize()?;
        let t = Instant::now();
        let mut count = 0;
        loop {
            one.launch()?;
            count += 1;
            let token = s.clone_dtoh(&one.state_mut().st.token)?[0];
            if token == end || count == n {
                break;
            }
        }
        replay_runs.push(t.elapsed().as_secs_f64() * 1e6 / count as f64);
        sequences.push(generated(&s, one.state_mut().st)?);
    }

    // d. The on-device loop: one launch per generation; plain, with the library bound, and
    //    with `unroll` steps per iteration.
    let kernels = one.info().kinds.kernels;
    let mut loop_runs = Vec::new();
    let mut loop_gpu_runs = Vec::new();
    let mut bounded_runs = Vec::new();
    let mut unrolled_runs = Vec::new();
    let unroll = args.unroll as usize;
    for (bounded, k) in [(false, 1), (true, 1), (false, unroll)] {
        let (kv_l, st_l) = fresh()?;
        let mut looped =
            DecodeLoopGraph::capture(rt, w.clone(), kv_l, st_l, spec, end, bounded, k)?;
        for _ in 0..runs {
            {
                let state = looped.state_mut();
                let (mut kv, st) = (state.kv, state.st);
                restart(&s, &mut kv, st)?;
            }
            s.synchronize()?;
            let t = Instant::now();
            let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            looped.launch()?;
            let stop = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            s.synchronize()?;
            let wall = t.elapsed().as_secs_f64() * 1e6;
            let seq = generated(&s, looped.state_mut().st)?;
            let n = seq.len() as f64;
            match (bounded, k) {
                (true, _) => bounded_runs.push(wall / n),
                (false, 1) => {
                    loop_runs.push(wall / n);
                    loop_gpu_runs.push(start.elapsed_ms(&stop)? as f64 * 1e3 / n);
                }
                _ => unrolled_runs.push(wall / n),
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
        s.synchronize()?;
        let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        for _ in 0..launches {
            unrolled.launch()?;
        }
        let stop = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        stop.synchronize()?;
        gpu_runs.push(start.elapsed_ms(&stop)? as f64 * 1e3 / (launches * UNROLL) as f64);
    }

    let want = &full[..expected];
    let identical = sequences.iter().all(|seq| seq.as_slice() == want);
    Ok(Measured {
        gpu_us: median(gpu_runs),
        loop_us: median(loop_runs),
        loop_gpu_us: median(loop_gpu_runs),
        unrolled_us: median(unrolled_runs),
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
            &format!("on-device loop, {} steps per iteration, wall", args.unroll),
            "1".into(),
            m.unrolled_us,
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
