//! # 16 — a candle-transformers Llama, decoded by one graph for every position
//!
//! A SmolLM2-135M-shaped Llama (hidden 576, 30 layers, 9 heads, 3 KV heads, MLP 1536, vocab
//! 49152, rope theta 100000, tied embeddings), random weights from a seeded `VarMap`, no
//! downloads. Three decoders generate the same greedy tokens at batch 1:
//!
//! * **candle-transformers eager**: `llama::Llama::forward` with its own `llama::Cache`, which
//!   grows the KV cache with `Tensor::cat` (a graph of it would serve one position and free
//!   tensors made before it: the capture is refused).
//! * **ours, eager**: the same Llama written again with the same `VarBuilder` names (so it
//!   reads the very same weight tensors) and `graph_runtime::candle::StaticKvCache`: the KV
//!   cache has a fixed shape, each step writes its keys and values in place at a position
//!   held in a device tensor, and the rotary and causal-mask rows are picked by that
//!   position. The attention differs from candle-transformers' in five lines.
//! * **ours, one graph**: that step as a `#[cuda_graph]` function, captured once; every
//!   position replays the same graph (token and position are its inputs, logits its result).
//!
//! Checks (non-zero exit on a failure): the three produce the same tokens, and the graph's
//! logits equal ours-eager's bit for bit at every position. Prints µs per token for each.
//!
//! Build with the candle tier (candle's kernels need nvcc: `bash scripts/candle-tier.sh` sets
//! it up), run: `cargo run --release --features candle --example 16-candle-llama-decode`
//! (`-- --layers 4` for a quick run).

use std::time::Instant;

use bench_report::table::{us, Table};
use candle_transformers::models::llama::{self, LlamaEosToks};
use clap::Parser;
use graph_runtime::candle::candle_core::{self as candle, DType, Device, IndexOp, Module, Tensor};
use graph_runtime::candle::candle_nn::{
    self, embedding, linear_no_bias, rms_norm, Embedding, Linear, RmsNorm, VarBuilder, VarMap,
};
use graph_runtime::candle::{greedy_next, RotaryTables, StaticKvCache};
use graph_runtime::{cuda_graph, BoxError, DeviceState, Runtime};
use workloads::check::max_abs_diff;
use workloads::testing::{gpu_required, init_tracing};

/// candle-transformers' Llama decode step against the same model as one CUDA graph.
#[derive(Parser)]
struct Args {
    /// Transformer layers (SmolLM2-135M has 30; fewer for a quick run).
    #[arg(long, default_value_t = 30)]
    layers: usize,
    /// Tokens generated (and the static cache's length).
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Timed generations per decoder (the median is printed).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Only compare candle-transformers' and our Llama eagerly on the CPU (no graph, no
    /// timing): checks the rewrite on a machine without a GPU.
    #[arg(long)]
    cpu: bool,
}

/// `--cpu`: candle-transformers' decode and ours, eagerly on the CPU, token for token.
fn cpu_check(cfg: &llama::Config, n: usize) -> Result<(), BoxError> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let theirs = llama::Llama::load(vb.clone(), cfg)?;
    let ours = GraphLlama::load(vb, cfg, n)?;
    let mut their_cache = llama::Cache::new(true, DType::F32, cfg, &dev)?;
    let our_cache = ours.cache(n, &dev)?;
    let first = Tensor::from_vec(vec![cfg.bos_token_id.unwrap_or(1)], (1, 1), &dev)?;
    let (mut ta, mut tb) = (first.clone(), first);
    let (mut worst, mut largest) = (0f32, 0f32);
    let mut tokens = Vec::new();
    for p in 0..n {
        let la = theirs.forward(&ta, p, &mut their_cache)?;
        let lb = ours.step(&tb, &Tensor::from_vec(vec![p as u32], 1, &dev)?, &our_cache)?;
        let (ha, hb) = (host_f32(&la)?, host_f32(&lb)?);
        worst = worst.max(max_abs_diff(&ha, &hb));
        largest = ha.iter().fold(largest, |m, x| m.max(x.abs()));
        ta = greedy_next(&la)?;
        tb = greedy_next(&lb)?;
        let (a, b) = (ta.to_vec2::<u32>()?[0][0], tb.to_vec2::<u32>()?[0][0]);
        if a != b {
            return Err(format!(
                "CPU: tokens differ at step {p}: candle-transformers {a}, ours {b}"
            )
            .into());
        }
        tokens.push(a);
    }
    println!(
        "CPU, {} layers, {n} tokens: ours = candle-transformers token for token; largest |logit difference| \
         {worst:.2e} (largest |logit| {largest:.1}); first tokens {:?}",
        cfg.num_hidden_layers,
        &tokens[..tokens.len().min(12)]
    );
    if worst > 1e-3 * largest.max(1.0) {
        return Err("CPU: the logits differ by more than 1e-3 of the largest".into());
    }
    Ok(())
}

/// SmolLM2-135M's shape, as a candle-transformers config.
fn smollm2_135m(layers: usize) -> llama::Config {
    llama::Config {
        hidden_size: 576,
        intermediate_size: 1536,
        vocab_size: 49152,
        num_hidden_layers: layers,
        num_attention_heads: 9,
        num_key_value_heads: 3,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 100_000.0,
        bos_token_id: Some(1),
        eos_token_id: Some(LlamaEosToks::Single(2)),
        rope_scaling: None,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
    }
}

/// One Llama block, loaded with candle-transformers' names.
#[derive(DeviceState)]
struct Block {
    input_layernorm: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    post_attention_layernorm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// The Llama of candle-transformers with a static KV cache: the same weights (same
/// `VarBuilder` names), the same ops, no shape or host value that depends on the position.
#[derive(DeviceState)]
struct GraphLlama {
    embed_tokens: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rotary: RotaryTables,
    #[device_state(skip)]
    heads: usize,
    #[device_state(skip)]
    kv_heads: usize,
    #[device_state(skip)]
    hidden: usize,
}

impl GraphLlama {
    fn load(vb: VarBuilder, cfg: &llama::Config, max_len: usize) -> candle::Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let hd = h / cfg.num_attention_heads;
        let kv = hd * cfg.num_key_value_heads;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|l| {
                let vb = vb.pp(format!("model.layers.{l}"));
                let (att, mlp) = (vb.pp("self_attn"), vb.pp("mlp"));
                Ok(Block {
                    input_layernorm: rms_norm(h, cfg.rms_norm_eps, vb.pp("input_layernorm"))?,
                    q_proj: linear_no_bias(h, h, att.pp("q_proj"))?,
                    k_proj: linear_no_bias(h, kv, att.pp("k_proj"))?,
                    v_proj: linear_no_bias(h, kv, att.pp("v_proj"))?,
                    o_proj: linear_no_bias(h, h, att.pp("o_proj"))?,
                    post_attention_layernorm: rms_norm(
                        h,
                        cfg.rms_norm_eps,
                        vb.pp("post_attention_layernorm"),
                    )?,
                    gate_proj: linear_no_bias(h, i, mlp.pp("gate_proj"))?,
                    up_proj: linear_no_bias(h, i, mlp.pp("up_proj"))?,
                    down_proj: linear_no_bias(i, h, mlp.pp("down_proj"))?,
                })
            })
            .collect::<candle::Result<_>>()?;
        let embed_tokens = embedding(cfg.vocab_size, h, vb.pp("model.embed_tokens"))?;
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(embed_tokens.embeddings().clone(), None)
        } else {
            linear_no_bias(h, cfg.vocab_size, vb.pp("lm_head"))?
        };
        Ok(GraphLlama {
            embed_tokens,
            blocks,
            norm: rms_norm(h, cfg.rms_norm_eps, vb.pp("model.norm"))?,
            lm_head,
            rotary: RotaryTables::llama(hd, cfg.rope_theta, max_len, DType::F32, vb.device())?,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            hidden: h,
        })
    }

    /// A cache for this model: `max_len` positions at batch 1.
    fn cache(&self, max_len: usize, dev: &Device) -> candle::Result<StaticKvCache> {
        let hd = self.hidden / self.heads;
        let dims = (1, self.kv_heads, max_len, hd);
        StaticKvCache::new(self.blocks.len(), dims, DType::F32, dev)
    }

    /// One decoding step at batch 1: `token` `(1, 1)` u32 and `pos` `(1,)` u32 on the device;
    /// returns the logits `(1, vocab)`.
    fn step(&self, token: &Tensor, pos: &Tensor, cache: &StaticKvCache) -> candle::Result<Tensor> {
        let (heads, kv, hidden) = (self.heads, self.kv_heads, self.hidden);
        let hd = hidden / heads;
        let at = cache.at(pos, 1)?; // was: an `index_pos: usize` argument
        let (cos, sin) = self.rotary.at(&at)?; // was: cache.cos.narrow(0, index_pos, 1)
        let mut x = self.embed_tokens.forward(token)?;
        for (layer, b) in self.blocks.iter().enumerate() {
            let residual = &x;
            let n = b.input_layernorm.forward(&x)?;
            let split = |t: Tensor, h: usize| t.reshape((1, 1, h, hd))?.transpose(1, 2);
            let q = split(b.q_proj.forward(&n)?, heads)?.contiguous()?;
            let k = split(b.k_proj.forward(&n)?, kv)?.contiguous()?;
            let v = split(b.v_proj.forward(&n)?, kv)?;
            let q = candle_nn::rotary_emb::rope(&q, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope(&k, &cos, &sin)?;
            let (k, v) = cache.write(layer, &at, &k, &v)?; // was: Tensor::cat(&[cache_k, &k], 2)
            let k = candle_transformers::utils::repeat_kv(k, heads / kv)?;
            let v = candle_transformers::utils::repeat_kv(v, heads / kv)?;
            let att = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
            let att = att.broadcast_add(at.mask())?; // was: no mask for one token
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            let y = att.matmul(&v.contiguous()?)?;
            let y = y.transpose(1, 2)?.reshape((1, 1, hidden))?;
            x = (b.o_proj.forward(&y)? + residual)?;
            let residual = &x;
            let n = b.post_attention_layernorm.forward(&x)?;
            let m = (candle_nn::ops::silu(&b.gate_proj.forward(&n)?)? * b.up_proj.forward(&n)?)?;
            x = (b.down_proj.forward(&m)? + residual)?;
        }
        let x = self.norm.forward(&x)?;
        let x = x.i((.., 0, ..))?.contiguous()?;
        self.lm_head.forward(&x)
    }
}

// One decoding step; the attribute makes `LlamaStepGraph`, one graph for every position.
#[cuda_graph(warmup = 2, verify = "never")]
fn llama_step(
    dev: &Device,
    token: &Tensor,
    pos: &Tensor,
    #[state] model: &GraphLlama,
    #[state] cache: &mut StaticKvCache,
) -> candle::Result<Tensor> {
    let _ = dev;
    model.step(token, pos, cache)
}

/// A generation: the device tokens (fed back without a host read) and, when asked, each
/// step's logits.
struct Generation {
    tokens: Vec<Tensor>,
    logits: Vec<Tensor>,
}

impl Generation {
    fn host_tokens(&self) -> candle::Result<Vec<u32>> {
        let all = Tensor::cat(&self.tokens, 0)?;
        all.flatten_all()?.to_vec1::<u32>()
    }
}

fn host_f32(t: &Tensor) -> candle::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    init_tracing();
    if args.cpu {
        return cpu_check(&smollm2_135m(args.layers.max(1)), args.tokens.max(1));
    }
    let dev = match Device::new_cuda(0) {
        Ok(dev) => dev,
        Err(e) if !gpu_required() => {
            eprintln!("skipped 16-candle-llama-decode: no usable GPU ({e})");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let n = args.tokens.max(1);
    let cfg = smollm2_135m(args.layers.max(1));
    let rt = Runtime::from_candle(&dev)?;
    let stream = dev.as_cuda_device()?.cuda_stream();
    dev.set_seed(16)?;
    // Random weights: candle-transformers' loader creates them in the VarMap, ours finds the
    // same names there and reads the same tensors.
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let theirs = llama::Llama::load(vb.clone(), &cfg)?;
    let ours = GraphLlama::load(vb, &cfg, n)?;
    let positions: Vec<Tensor> = (0..n as u32)
        .map(|p| Tensor::from_vec(vec![p], 1, &dev))
        .collect::<Result<_, _>>()?;
    let first = Tensor::from_vec(vec![cfg.bos_token_id.unwrap_or(1)], (1, 1), &dev)?;

    let t0 = Instant::now();
    let mut graph =
        LlamaStepGraph::capture(&rt, &first, &positions[0], &ours, ours.cache(n, &dev)?)?;
    stream.synchronize()?;
    let capture_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut our_cache = ours.cache(n, &dev)?;

    // The three decoders; each keeps its tokens on the device.
    let run_theirs = |keep: bool| -> candle::Result<Generation> {
        let mut cache = llama::Cache::new(true, DType::F32, &cfg, &dev)?;
        let mut g = Generation {
            tokens: Vec::with_capacity(n),
            logits: Vec::new(),
        };
        let mut tok = first.clone();
        for p in 0..n {
            let logits = theirs.forward(&tok, p, &mut cache)?;
            tok = greedy_next(&logits)?;
            g.tokens.push(tok.clone());
            if keep {
                g.logits.push(logits);
            }
        }
        Ok(g)
    };
    let mut run_ours = |keep: bool| -> candle::Result<Generation> {
        our_cache.reset()?;
        let mut g = Generation {
            tokens: Vec::with_capacity(n),
            logits: Vec::new(),
        };
        let mut tok = first.clone();
        for pos in &positions {
            let logits = llama_step(&dev, &tok, pos, &ours, &mut our_cache)?;
            tok = greedy_next(&logits)?;
            g.tokens.push(tok.clone());
            if keep {
                g.logits.push(logits);
            }
        }
        Ok(g)
    };
    let mut run_graph = |keep: bool| -> Result<Generation, BoxError> {
        graph.state_mut().cache.reset()?;
        let mut g = Generation {
            tokens: Vec::with_capacity(n),
            logits: Vec::new(),
        };
        let mut tok = first.clone();
        for pos in &positions {
            let logits = graph.replay(&tok, pos)?.result;
            tok = greedy_next(logits)?;
            g.tokens.push(tok.clone());
            if keep {
                g.logits.push(logits.copy()?);
            }
        }
        Ok(g)
    };

    // The check: the same tokens from all three, and the graph's logits bitwise ours-eager's.
    let (a, b, c) = (run_theirs(true)?, run_ours(true)?, run_graph(true)?);
    let (ta, tb, tc) = (a.host_tokens()?, b.host_tokens()?, c.host_tokens()?);
    let mut graph_bitwise = true;
    let (mut vs_theirs, mut largest) = (0f32, 0f32);
    for p in 0..n {
        let (la, lb, lc) = (
            host_f32(&a.logits[p])?,
            host_f32(&b.logits[p])?,
            host_f32(&c.logits[p])?,
        );
        graph_bitwise &= lb.iter().zip(&lc).all(|(x, y)| x.to_bits() == y.to_bits());
        if ta[..p] == tb[..p] {
            vs_theirs = vs_theirs.max(max_abs_diff(&la, &lb));
            largest = la.iter().fold(largest, |m, x| m.max(x.abs()));
        }
    }
    drop((a, b, c));
    // Ours attends over the whole static cache (masked) where candle-transformers attends over
    // the positions written so far, so cuBLAS may sum in another order: the logits agree to
    // rounding, not bitwise.
    let close_to_theirs = vs_theirs <= 1e-3 * largest.max(1.0);

    // Timing: whole generations, median of `runs`, each decoder feeding its own tokens back.
    let timed = |f: &mut dyn FnMut() -> Result<Generation, BoxError>| -> Result<f64, BoxError> {
        let mut per_token = Vec::new();
        for _ in 0..args.runs.max(1) {
            stream.synchronize()?;
            let t = Instant::now();
            let g = f()?;
            stream.synchronize()?;
            per_token.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
            if g.host_tokens()? != ta {
                return Err("a timed generation produced other tokens than the checked one".into());
            }
        }
        Ok(workloads::timing::median(per_token))
    };
    let theirs_us = timed(&mut || Ok(run_theirs(false)?))?;
    let ours_us = timed(&mut || Ok(run_ours(false)?))?;
    let graph_us = timed(&mut || run_graph(false))?;

    let info = graph.info();
    println!(
        "candle-transformers Llama, SmolLM2-135M-shaped ({} layers, hidden {}, {} heads / {} KV heads, vocab {}), \
         random weights, f32, batch 1, {n} greedy tokens: one graph of {} nodes ({} kernels) for all {n} positions, \
         captured in {capture_ms:.0} ms\n",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.vocab_size,
        info.nodes(),
        info.kinds.kernels,
    );
    let mut t = Table::new(&["how", ">µs per token", ">tokens/s", ">speedup"]);
    for (how, v) in [
        (
            "candle-transformers `Llama::forward`, eager (grown cache)",
            theirs_us,
        ),
        ("ours, eager (StaticKvCache)", ours_us),
        ("ours, one #[cuda_graph] replay per token", graph_us),
    ] {
        t.row(vec![
            how.into(),
            us(v),
            format!("{:.0}", 1e6 / v),
            format!("{:.2}×", theirs_us / v),
        ]);
    }
    print!("{}", t.to_markdown());
    let same_tokens = ta == tb && tb == tc;
    println!(
        "\ntokens: candle-transformers {} ours eager {} graph; graph logits {} ours eager bitwise at all {n} \
         positions; largest |logit difference| ours vs candle-transformers {vs_theirs:.2e} (largest |logit| \
         {largest:.1}); {} distinct tokens, the first {:?}",
        if ta == tb { "=" } else { "!=" },
        if tb == tc { "=" } else { "!=" },
        if graph_bitwise { "=" } else { "!=" },
        ta.iter().collect::<std::collections::BTreeSet<_>>().len(),
        &ta[..ta.len().min(12)]
    );
    if !same_tokens {
        let at = |x: &[u32], y: &[u32]| x.iter().zip(y).position(|(p, q)| p != q);
        return Err(format!(
            "the tokens differ: candle-transformers vs ours eager at step {:?}, ours eager vs graph at step {:?}",
            at(&ta, &tb),
            at(&tb, &tc)
        )
        .into());
    }
    if !graph_bitwise {
        return Err("the graph's logits differ from the same model run eagerly".into());
    }
    if !close_to_theirs {
        return Err(format!(
            "our logits differ from candle-transformers' by {vs_theirs:.3e}, more than 1e-3 of the largest \
             logit ({largest:.1})"
        )
        .into());
    }
    Ok(())
}
