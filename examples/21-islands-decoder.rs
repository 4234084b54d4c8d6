//! # 21 — eager islands: a decoder whose KV cache grows by concatenation
//!
//! Borrows from this workspace: `workloads` (the decoder of `05-decode-step` split at its
//! attention, the concatenating cache, timing, the runtime or a skip) and `bench-report`
//! (tables, records).
//!
//! candle-transformers' decoders keep their KV cache as tensors that grow by one row per
//! token (`Tensor::cat`), with the length on the host: a new buffer every step, so the
//! attention cannot be part of a graph. Everything around it can: here each block's RMSNorm
//! and QKV projection, and its output projection and feed-forward block, are graphed, and the
//! attention with its growing cache runs in an eager island between them:
//!
//! ```text
//! embed, block 0 front ─┤ island: cache 0 += row, attention ├─ block 0 back, block 1 front ─┤ … ├─ head
//! ```
//!
//! `rt.eager(move || …)` inside the body marks the island; the graph's replay launches the
//! segments (9 for 8 blocks) and runs the islands' code between them. The cache is
//! `#[island]` state: only islands touch it, it is any `Clone` type, and the graph lends it
//! back between generations (`state_mut().cache`).
//!
//! Checks: the tokens of the all-eager loop, the islands graph and the static-cache graph of
//! `05-decode-step` are identical (the same kernels in the same order). Table: µs per token
//! of the three, and where a replay's host time goes (the islands' own work, and the rest:
//! the segments' launches).
//!
//! Run: `cargo run --release --example 21-islands-decoder` (`-- --json` for the report).

use std::sync::Arc;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use clap::Parser;
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime, Tolerance};
use workloads::check::verified;
use workloads::decode::{
    block_back, block_front, concat_attention, embed, generated, head, restart, restart_state,
    step, upload, ConcatKv, DecodeState, Kernels, Last, Weights, KERNEL_MAX_SEQ,
};
use workloads::reference::{Decoder, DecoderSpec};
use workloads::testing::{runtime_or_skip, seeded_rng};
use workloads::timing::{median, wall_once};

/// A decoder with a concatenating KV cache in eager islands, against all-eager and against
/// the static-cache graph.
#[derive(Parser)]
struct Args {
    /// Print one JSON line for the report after the table.
    #[arg(long)]
    json: bool,
}

/// The decoder of `05-decode-step` (8 blocks of width 512), and two smaller ones of the same
/// depth (widths 128 and 256): at batch 1 a small model's step is launch-bound, which is where
/// a graph helps most and candle-transformers' eager decode spends 7-14 ms per token.
const SPECS: [(&str, DecoderSpec); 3] = [
    (
        "8 × 128",
        DecoderSpec {
            dim: 128,
            heads: 4,
            layers: 8,
            ffn: 384,
            vocab: 4096,
            max_seq: 256,
            theta: 10_000.0,
            eps: 1e-5,
        },
    ),
    (
        "8 × 256",
        DecoderSpec {
            dim: 256,
            heads: 4,
            layers: 8,
            ffn: 768,
            vocab: 4096,
            max_seq: 256,
            theta: 10_000.0,
            eps: 1e-5,
        },
    ),
    (
        "8 × 512 (05's)",
        DecoderSpec {
            dim: 512,
            heads: 8,
            layers: 8,
            ffn: 1536,
            vocab: 4096,
            max_seq: 256,
            theta: 10_000.0,
            eps: 1e-5,
        },
    ),
];
/// Tokens per generation.
const TOKENS: usize = 128;
/// Timed generations of each loop.
const RUNS: usize = 5;
const _: () = assert!(
    SPECS[0].1.max_seq <= KERNEL_MAX_SEQ
        && SPECS[1].1.max_seq <= KERNEL_MAX_SEQ
        && SPECS[2].1.max_seq <= KERNEL_MAX_SEQ
);

// 1. The step, split at the attention: what is static is graphed, the attention with the
//    growing cache runs in an island (`rt.eager`), once per block. The island's code sees
//    the function's parameters (here `rt`, `st` and the `#[island]` cache) and copies of host
//    values of the body (`l`); the state `st` is lent to it, so it can write the attention's
//    output but not replace the state the segments read by address.
#[cuda_graph(warmup = 2)]
fn island_step(
    rt: &Runtime,
    #[state] w: &Weights,
    #[state] st: &mut DecodeState,
    #[island] cache: &mut ConcatKv,
    #[constant] spec: DecoderSpec,
) -> Result<(), GraphError> {
    let k = Kernels::of(rt)?;
    embed(rt, w, st, &spec)?;
    for l in 0..spec.layers {
        block_front(rt, &k, w, st, l, &spec)?;
        // The island's code keeps a copy of the kernels (host values) and of `l`.
        let kernels = k.clone();
        rt.eager(move || concat_attention(rt, &kernels, cache, st, l, &spec))?;
        block_back(rt, &k, w, st, l, &spec)?;
    }
    head(rt, &k, w, st, &spec, Last::Argmax)
}

// 2. The static-cache step of `05-decode-step`, for comparison: one graph for the whole step.
#[cuda_graph(warmup = 2)]
fn static_step(
    rt: &Runtime,
    #[state] w: &Weights,
    #[state] kv: &mut CudaSlice<f32>,
    #[state] st: &mut DecodeState,
    #[constant] spec: DecoderSpec,
) -> Result<(), GraphError> {
    step(rt, w, kv, st, &spec, Last::Argmax)
}

/// One generation of `TOKENS` tokens with `next`: µs per token, wall (one synchronize at the
/// end) and host (the calls themselves, which return once their work is queued).
fn generate(
    s: &Arc<CudaStream>,
    mut next: impl FnMut() -> Result<(), GraphError>,
) -> Result<(f64, f64), GraphError> {
    let mut host = std::time::Duration::ZERO;
    let ((), us) = wall_once(s, || {
        for _ in 0..TOKENS {
            let t = std::time::Instant::now();
            next()?;
            host += t.elapsed();
        }
        Ok(())
    })?;
    let per = TOKENS as f64;
    Ok((us / per, host.as_secs_f64() * 1e6 / per))
}

/// What one decoder shape measured.
struct Measured {
    eager_us: f64,
    island_us: f64,
    static_us: f64,
    island_host: f64,
    island_own: f64,
    static_host: f64,
    segments: usize,
    islands: usize,
    identical: bool,
    first_tokens: Vec<i32>,
}

/// The three loops on one decoder shape.
fn measure(rt: &Runtime, spec: DecoderSpec, seed: u64) -> Result<Measured, BoxError> {
    let s = rt.stream().clone();
    let dec = Decoder::random(spec, &mut seeded_rng(seed));
    let w = upload(&s, &dec)?;

    // 3. All eager: the same function, called once per token; its islands run in place.
    let mut st = DecodeState::new(&s, &spec, TOKENS)?;
    let mut eager_runs = Vec::new();
    let mut eager_tokens = Vec::new();
    for _ in 0..RUNS {
        restart_state(&s, &mut st)?;
        let mut cache = ConcatKv::new(&spec);
        let (per, _) = generate(&s, || island_step(rt, &w, &mut st, &mut cache, spec))?;
        eager_runs.push(per);
        eager_tokens.push(generated(&s, &st)?);
    }

    // 4. The islands graph: captured once; per generation the state restarts and the cache
    //    starts empty (lent back by `state_mut`).
    let mut st_g = DecodeState::new(&s, &spec, TOKENS)?;
    restart_state(&s, &mut st_g)?;
    let mut cache_g = ConcatKv::new(&spec);
    let mut graph = IslandStepGraph::capture(rt, &w, &mut st_g, &mut cache_g, spec)?;
    let segments = graph.segments().count();
    let islands = graph.islands().len();
    // One step against the eager function (its islands included), then back to the start.
    println!("{}", verified(graph.verify(Tolerance::BITWISE)?)?);
    let mut island_runs = Vec::new();
    let mut island_host = Vec::new();
    let mut island_tokens = Vec::new();
    let mut island_share = Vec::new();
    for _ in 0..RUNS {
        {
            let state = graph.state_mut();
            restart_state(&s, state.st)?;
            *state.cache = ConcatKv::new(&spec);
        }
        let (per, host) = generate(&s, || graph.launch().map(drop))?;
        island_runs.push(per);
        island_host.push(host);
        let state = graph.state_mut();
        island_share.push(state.cache.time.as_secs_f64() * 1e6 / TOKENS as f64);
        island_tokens.push(generated(&s, state.st)?);
    }
    drop(graph);

    // 5. The static-cache graph (`05-decode-step`'s design).
    let mut kv = s.alloc_zeros::<f32>(spec.kv_len())?;
    let mut st_s = DecodeState::new(&s, &spec, TOKENS)?;
    restart(&s, &mut kv, &mut st_s)?;
    let mut fixed = StaticStepGraph::capture(rt, &w, &mut kv, &mut st_s, spec)?;
    let mut static_runs = Vec::new();
    let mut static_host = Vec::new();
    let mut static_tokens = Vec::new();
    for _ in 0..RUNS {
        {
            let state = fixed.state_mut();
            let mut kv = state.kv;
            restart(&s, &mut kv, state.st)?;
        }
        let (per, host) = generate(&s, || fixed.launch().map(drop))?;
        static_runs.push(per);
        static_host.push(host);
        static_tokens.push(generated(&s, fixed.state_mut().st)?);
    }

    // 6. The same tokens everywhere.
    let reference = &eager_tokens[0];
    let identical = eager_tokens
        .iter()
        .chain(&island_tokens)
        .chain(&static_tokens)
        .all(|t| t == reference);
    Ok(Measured {
        eager_us: median(eager_runs),
        island_us: median(island_runs),
        static_us: median(static_runs),
        island_host: median(island_host),
        island_own: median(island_share),
        static_host: median(static_host),
        segments,
        islands,
        identical,
        first_tokens: reference[..8.min(reference.len())].to_vec(),
    })
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(rt) = runtime_or_skip("21-islands-decoder") else {
        return Ok(());
    };
    let mut measured = Vec::new();
    for (k, (name, spec)) in SPECS.iter().enumerate() {
        measured.push((*name, *spec, measure(&rt, *spec, 21 + k as u64)?));
    }
    let device = rt.context().name().unwrap_or_default();
    println!(
        "\ndecode at batch 1 on {device}, KV cache grown by concatenation in an eager island per block; {TOKENS} tokens, median of {RUNS} runs\n"
    );
    let mut t = Table::new(&[
        "blocks × width",
        ">all eager µs/token",
        ">islands graph µs/token",
        ">speedup",
        ">static-cache graph µs/token",
        ">speedup",
        "segments",
    ]);
    for (name, _, m) in &measured {
        t.row(vec![
            name.to_string(),
            us(m.eager_us),
            us(m.island_us),
            format!("{:.2}×", m.eager_us / m.island_us),
            us(m.static_us),
            format!("{:.2}×", m.eager_us / m.static_us),
            format!("{} ({} islands)", m.segments, m.islands),
        ]);
    }
    print!("{}", t.to_markdown());
    println!("\nhost time of a replay (the calls, which return once their work is queued), µs per token:\n");
    let mut h = Table::new(&[
        "blocks × width",
        ">islands graph",
        ">islands' own work",
        ">the rest",
        ">per segment",
        ">static-cache graph (one launch)",
    ]);
    for (name, _, m) in &measured {
        let rest = m.island_host - m.island_own;
        h.row(vec![
            name.to_string(),
            us(m.island_host),
            us(m.island_own),
            us(rest),
            us(rest / m.segments as f64),
            us(m.static_host),
        ]);
    }
    print!("{}", h.to_markdown());
    let identical = measured.iter().all(|(_, _, m)| m.identical);
    for (name, _, m) in &measured {
        println!("{name}: first tokens {:?}", m.first_tokens);
    }
    if args.json {
        for (name, spec, m) in &measured {
            let what = format!(
                "decode step, KV cache grown by concatenation in {} islands, {name} ({TOKENS} tokens)",
                m.islands
            );
            let rec = Record::new(
                "islands",
                Side::Ours,
                format!("islands-decoder/{}", spec.dim),
                what,
                m.eager_us,
                m.island_us,
            )
            .shape("tokens", TOKENS)
            .shape("layers", spec.layers)
            .shape("dim", spec.dim)
            .check(
                "tokens identical: all eager, islands graph, static-cache graph",
                m.identical,
            )
            .with("static_graph_us", m.static_us)
            .with("island_own_us", m.island_own)
            .with("island_host_us", m.island_host)
            .with("static_host_us", m.static_host)
            .with("segments", m.segments);
            println!("{}", rec.line());
        }
    }
    if !identical {
        return Err("the three loops generated different tokens".into());
    }
    println!("all eager, the islands graph and the static-cache graph generated the same {TOKENS} tokens in every run");
    Ok(())
}
