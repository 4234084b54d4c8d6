//! # 13 — candle code as a graph: a transformer decoder step
//!
//! Borrows from this workspace: `workloads` (comparisons, timing, tracing) and `bench-report`
//! (records, tables); the model lives in `examples/common/`.
//!
//! A small Llama-style decoder written with candle-nn blocks (embedding, 8 pre-norm blocks of
//! RMSNorm, attention with rotary positions and a SwiGLU MLP, width 512, 8 heads, vocabulary
//! 4096, random weights) decodes at batch 1, as candle runs it and as one graph.
//!
//! What makes **one** graph serve every position: nothing that changes from step to step is
//! a shape or a host value. The KV cache is static (`(1, heads, 256, 64)` per layer,
//! `#[state] &mut`), written in place with `scatter_set` at the position; the position is a
//! device tensor, and the rotary and causal-mask rows are picked with `index_select(pos)`;
//! attention always spans the whole cache, the mask hides what is not written yet. The
//! token and the position are the graph's inputs; the logits its result.
//!
//! Checks: at each of 64 positions the graph's logits equal candle eager's bit for bit (the
//! eager run has its own cache), and the greedy tokens agree.
//!
//! Build with the candle tier (candle's kernels need nvcc: `bash scripts/candle-tier.sh`
//! sets it up), run: `cargo run --release --features candle --example 13-candle-decoder`
//! (`-- --json` for machine-readable lines).

#[path = "common/candle_models.rs"]
mod candle_models;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use candle_models::{greedy, Decoder, DecoderConfig, KvCache};
use clap::Parser;
use graph_runtime::candle::candle_core::{self as candle, Device, Tensor};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime};
use workloads::check::first_mismatch;
use workloads::testing::{gpu_required, init_tracing};
use workloads::timing::{iters_for, wall_us};

/// candle eager against the same candle decoder step as one CUDA graph for every position.
#[derive(Parser)]
struct Args {
    /// Print one JSON line for the report after the table.
    #[arg(long)]
    json: bool,
    /// Positions compared between eager and graph.
    #[arg(long, default_value_t = 64)]
    positions: u32,
}

// One decoding step, as a candle user writes it; the attribute makes `DecodeGraph`.
#[cuda_graph(warmup = 2, verify = "never")]
fn decode(
    dev: &Device,
    token: &Tensor,
    pos: &Tensor,
    #[state] model: &Decoder,
    #[state] cache: &mut KvCache,
) -> candle::Result<Tensor> {
    let _ = dev;
    model.step(token, pos, cache)
}

fn host_f32(t: &Tensor) -> Result<Vec<f32>, candle::Error> {
    t.flatten_all()?.to_vec1::<f32>()
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    init_tracing();
    let dev = match Device::new_cuda(0) {
        Ok(dev) => dev,
        Err(e) if !gpu_required() => {
            eprintln!("skipped 13-candle-decoder: no usable GPU ({e})");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let cfg = DecoderConfig::SMALL;
    let positions = args.positions.min(cfg.max_len as u32);
    let rt = Runtime::from_candle(&dev)?;
    let stream = dev.as_cuda_device()?.cuda_stream();
    dev.set_seed(13)?;
    let model = Decoder::new(&dev, cfg)?;
    let eager_cache = KvCache::new(&dev, &cfg)?;
    // Positions and a first token, on the device before anything is timed.
    let pos: Vec<Tensor> = (0..cfg.max_len as u32)
        .map(|p| Tensor::from_vec(vec![p], 1, &dev))
        .collect::<Result<_, _>>()?;
    let first = Tensor::from_vec(vec![1u32], (1, 1), &dev)?;

    // One graph for every position; the graph owns its cache.
    let mut graph = DecodeGraph::capture(&rt, &first, &pos[0], &model, KvCache::new(&dev, &cfg)?)?;

    // Greedy decoding, eager and graph side by side, each feeding its own next token.
    let (mut tok_e, mut tok_g) = (first.clone(), first.clone());
    let mut identical = true;
    let mut tokens = Vec::new();
    for p in &pos[..positions as usize] {
        let eager = model.step(&tok_e, p, &eager_cache)?;
        let ours = graph.replay(&tok_g, p)?.result.clone();
        let (a, b) = (host_f32(&eager)?, host_f32(&ours)?);
        identical &= first_mismatch(&a, &b).is_none();
        tok_e = greedy(&eager)?;
        tok_g = greedy(&ours)?;
        let (te, tg) = (
            tok_e.flatten_all()?.to_vec1::<u32>()?,
            tok_g.flatten_all()?.to_vec1::<u32>()?,
        );
        identical &= te == tg;
        tokens.push(tg[0]);
    }

    // Timing: one step per call, positions cycling through the cache; the same token.
    let sync = |r: candle::Result<Tensor>| r.map(drop).map_err(|e| GraphError::User(e.into()));
    let mut p = 0usize;
    let mut next = || {
        p = (p + 1) % cfg.max_len;
        &pos[p]
    };
    let probe = wall_us(&stream, 5, || {
        sync(model.step(&first, next(), &eager_cache))
    })?;
    let iters = iters_for(probe, 400_000.0, 20, 1000);
    let eager_us = wall_us(&stream, iters, || {
        sync(model.step(&first, next(), &eager_cache))
    })?;
    let graph_us = wall_us(&stream, iters, || graph.replay(&first, next()).map(drop))?;

    let info = graph.info();
    println!(
        "candle decoder step, {} layers, width {}, {} heads, vocab {}, batch 1, f32: one graph of {} nodes \
         ({} kernels, {} temporaries) for all {} positions\n",
        cfg.layers,
        cfg.hidden,
        cfg.heads,
        cfg.vocab,
        info.nodes(),
        info.kinds.kernels,
        info.kinds.allocs,
        cfg.max_len
    );
    let mut t = Table::new(&["how", ">µs per step", ">tokens/s", ">speedup"]);
    t.row(vec![
        "candle eager".into(),
        us(eager_us),
        format!("{:.0}", 1e6 / eager_us),
        "1.00×".into(),
    ]);
    t.row(vec![
        "#[cuda_graph] replay (token and position copies included)".into(),
        us(graph_us),
        format!("{:.0}", 1e6 / graph_us),
        format!("{:.2}×", eager_us / graph_us),
    ]);
    print!("{}", t.to_markdown());
    println!(
        "\n{positions} positions, greedy: logits graph {} candle eager bitwise; first tokens {:?}",
        if identical { "=" } else { "!=" },
        &tokens[..tokens.len().min(12)]
    );
    if args.json {
        let what = format!(
            "candle decoder step, {} layers, dim {}, vocab {}, batch 1",
            cfg.layers, cfg.hidden, cfg.vocab
        );
        let rec = Record::new(
            "candle",
            Side::Ours,
            "candle_decode/1",
            what,
            eager_us,
            graph_us,
        )
        .shape("batch", 1)
        .shape("layers", cfg.layers)
        .shape("dim", cfg.hidden)
        .shape("heads", cfg.heads)
        .shape("vocab", cfg.vocab)
        .shape("max_len", cfg.max_len)
        .kernels(info.kinds.kernels)
        .check(
            format!(
                "logits bitwise and greedy tokens, candle eager vs graph, {positions} positions"
            ),
            identical,
        )
        .with("nodes", info.nodes());
        println!("{}", rec.line());
    }
    if !identical {
        return Err("the graph's logits differ from candle eager".into());
    }
    Ok(())
}
