//! # 25 — a tensor-parallel Llama decoder in candle on 1, 2 and 4 GPUs, one graph per rank
//!
//! Borrows from this workspace: `workloads` (the GPUs or a skip, timing helpers, NCCL facts)
//! and `bench-report` (records, tables).
//!
//! Llama-3.2-1B- and Llama-3.1-8B-shaped decoders in `bf16` with random weights (no
//! downloads), split Megatron-style over `W` GPUs, one thread, candle device and
//! [`Communicator`] per rank:
//!
//! * attention by heads: `q`, `k` and `v` column-parallel (one fused weight; rank `r` holds
//!   query heads `r·H/W ..` and KV heads `r·K/W ..`), the output projection row-parallel,
//!   then `all_reduce_tensor` of the partial sum; the [`StaticKvCache`] holds the rank's KV
//!   heads only;
//! * the MLP by features: gate and up column-parallel (one fused weight), down row-parallel,
//!   then `all_reduce_tensor`;
//! * the embedding on every rank; the LM head by vocabulary rows, its logits gathered with
//!   `all_gather_tensor` (so every rank picks the same greedy token on the device).
//!
//! Every shard is cut from the same whole matrix (made on each rank's GPU from one seed per
//! matrix), so the 1-, 2- and 4-GPU decoders are one model. The step is one
//! `#[cuda_graph]` per rank serving every position (token and position are its inputs);
//! the hidden state's all-reduces (`bf16`, 4–8 KiB) take the one-shot kernel.
//!
//! Checks (non-zero exit on a failure): on every GPU count, the graph's logits equal the same
//! ranks' eager logits bit for bit at every position, and every rank's logits are the same
//! bits; tokens against one GPU's, or where summing in another order changes a token, the
//! first such position and the logit difference there. Prints µs per token (a whole
//! 128-token generation, median of `--runs`, the slower rank), eager and graph, and the
//! ratio to one GPU's graph.
//!
//! `--torch` runs `scripts/torch_tp_decode.py` afterwards (the same shapes with
//! `torch.distributed` and the step captured whole with `torch.cuda.graph`).
//!
//! The step fuses what candle would run as several small kernels (see
//! `examples/common/llama_kernels.rs`): the rotary embedding, the cache write and the
//! attention of a layer are one kernel, each residual add is one kernel with the norm after
//! it, SwiGLU is one kernel; `--unfused` runs candle's own ops instead. That halves the nodes
//! of each graph (8B: 978 against 1918 on one GPU).
//!
//! What sets the time at batch 1: reading the weights (15 GB per token for the 8B shape,
//! divided by the GPU count), plus what every rank pays whatever the count (about ten kernels
//! per layer, each a few µs of launch and ramp, and with several GPUs two all-reduces of
//! 6–7 µs per layer). On H200s the 8B figures (5.25 / 3.76 / 2.95 ms per token on 1 / 2 / 4
//! GPUs, one run) fit about 3.2 ms that divide by the GPU count and 2.0 ms that do not: more
//! GPUs shrink only the first, so 2 GPUs give 0.72× and 4 give 0.56× of one GPU's time.
//!
//! Build with the candle tier and NCCL (`eval "$(bash scripts/cuda-toolchain.sh)"`), run:
//! `bash scripts/with-nccl.sh cargo run --release --features candle,nccl --example
//! 25-tensor-parallel-llama [-- --config llama-8b --worlds 1,2,4 --torch --json]`.

use std::process::Command;
use std::time::Instant;

use bench_report::record::{read_output, Record, Side};
use bench_report::table::{us, Table};
use clap::Parser;
use graph_runtime::candle::candle_core::{self as candle, DType, Device, Module, Tensor};
use graph_runtime::candle::candle_nn::{self, Embedding, Linear, RmsNorm};
use graph_runtime::candle::{greedy_next, RotaryTables, StaticKvCache};
use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp};
use graph_runtime::{cuda_graph, BoxError, DeviceState, Runtime};
use workloads::check::{first_mismatch, max_abs_diff};

#[path = "common/llama_kernels.rs"]
mod llama_kernels;
use llama_kernels::Kernels;
use workloads::testing::{gpus_or_skip, init_tracing, usable_gpus};

/// Tensor-parallel Llama decoding in candle, eager and as one graph per rank.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// `llama-1b`, `llama-8b` or `all`.
    #[arg(long, default_value = "all")]
    config: String,
    /// GPU counts, comma-separated (those above the machine's are skipped).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4])]
    worlds: Vec<usize>,
    /// Tokens generated (and the static cache's length).
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Timed generations per decoder (the median is printed).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// candle's own ops for the norms, SwiGLU and attention instead of the fused kernels of
    /// `examples/common/llama_kernels.rs` (to measure what fusing gives).
    #[arg(long)]
    unfused: bool,
    /// Fewer layers than the shape has, for a quick run.
    #[arg(long)]
    layers: Option<usize>,
    /// Run PyTorch's reference afterwards (`scripts/torch_tp_decode.py`).
    #[arg(long)]
    torch: bool,
    /// Print one JSON record per shape and GPU count (`bench_report::record`).
    #[arg(long)]
    json: bool,
}

/// A Llama shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    name: &'static str,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    vocab: usize,
    theta: f32,
    tied: bool,
}

const LLAMA_1B: Shape = Shape {
    name: "llama-1b",
    hidden: 2048,
    layers: 16,
    heads: 32,
    kv_heads: 8,
    head_dim: 64,
    intermediate: 8192,
    vocab: 128_256,
    theta: 500_000.0,
    tied: true,
};

const LLAMA_8B: Shape = Shape {
    name: "llama-8b",
    hidden: 4096,
    layers: 32,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    intermediate: 14_336,
    vocab: 128_256,
    theta: 500_000.0,
    tied: false,
};

/// Standard deviation of every random weight matrix.
const INIT_STD: f64 = 0.02;
const EPS: f64 = 1e-5;

/// One rank's part of a block.
#[derive(DeviceState)]
struct Block {
    attn_norm: RmsNorm,
    /// This rank's query, key and value rows, stacked.
    qkv: Linear,
    /// This rank's columns of the output projection.
    o: Linear,
    mlp_norm: RmsNorm,
    /// This rank's gate and up rows, stacked.
    gate_up: Linear,
    /// This rank's columns of the down projection.
    down: Linear,
}

/// One rank's part of the model.
#[derive(DeviceState)]
struct Shard {
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    /// This rank's rows of the LM head.
    lm_head: Linear,
    rotary: RotaryTables,
    #[device_state(skip)]
    dims: Dims,
    /// The fused kernels (`None`: candle's ops).
    #[device_state(skip)]
    kernels: Option<Kernels>,
}

/// A rank's sizes.
#[derive(Debug, Clone, Copy)]
struct Dims {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
}

/// Matrix `which` of layer `layer` (or of the whole model), made whole on `dev` from its own
/// seed: the same bits on every GPU, whatever the rank.
fn whole(
    dev: &Device,
    layer: usize,
    which: u64,
    rows: usize,
    cols: usize,
) -> candle::Result<Tensor> {
    dev.set_seed(1_000_003 * (layer as u64 + 1) + which)?;
    Tensor::randn(0f32, INIT_STD as f32, (rows, cols), dev)?.to_dtype(DType::BF16)
}

impl Shard {
    /// Rank `rank` of `world`'s shard of `s`.
    fn new(
        s: &Shape,
        dev: &Device,
        (rank, world): (usize, usize),
        max_len: usize,
        kernels: Option<Kernels>,
    ) -> candle::Result<Self> {
        let (h, hd) = (s.hidden, s.head_dim);
        let dims = Dims {
            heads: s.heads / world,
            kv_heads: s.kv_heads / world,
            head_dim: hd,
            inter: s.intermediate / world,
        };
        let rows = |t: Tensor, per: usize| t.narrow(0, rank * per, per);
        let cols = |t: Tensor, per: usize| t.narrow(1, rank * per, per)?.contiguous();
        let norm = || -> candle::Result<RmsNorm> {
            Ok(RmsNorm::new(Tensor::ones(h, DType::BF16, dev)?, EPS))
        };
        let mut blocks = Vec::with_capacity(s.layers);
        for l in 0..s.layers {
            let q = rows(whole(dev, l, 0, s.heads * hd, h)?, dims.heads * hd)?;
            let q = (q * (1.0 / (hd as f64).sqrt()))?;
            let k = rows(whole(dev, l, 1, s.kv_heads * hd, h)?, dims.kv_heads * hd)?;
            let v = rows(whole(dev, l, 2, s.kv_heads * hd, h)?, dims.kv_heads * hd)?;
            let o = cols(whole(dev, l, 3, h, s.heads * hd)?, dims.heads * hd)?;
            let gate = rows(whole(dev, l, 4, s.intermediate, h)?, dims.inter)?;
            let up = rows(whole(dev, l, 5, s.intermediate, h)?, dims.inter)?;
            let down = cols(whole(dev, l, 6, h, s.intermediate)?, dims.inter)?;
            blocks.push(Block {
                attn_norm: norm()?,
                qkv: Linear::new(Tensor::cat(&[q, k, v], 0)?, None),
                o: Linear::new(o, None),
                mlp_norm: norm()?,
                gate_up: Linear::new(Tensor::cat(&[gate, up], 0)?, None),
                down: Linear::new(down, None),
            });
        }
        let embed = whole(dev, s.layers, 0, s.vocab, h)?;
        let head = match s.tied {
            true => embed.clone(),
            false => whole(dev, s.layers, 1, s.vocab, h)?,
        };
        let per = s.vocab / world;
        Ok(Shard {
            embed: Embedding::new(embed, h),
            blocks,
            norm: norm()?,
            lm_head: Linear::new(rows(head, per)?.contiguous()?, None),
            rotary: RotaryTables::llama(hd, s.theta, max_len, DType::BF16, dev)?,
            dims,
            kernels,
        })
    }

    fn cache(&self, layers: usize, max_len: usize, dev: &Device) -> candle::Result<StaticKvCache> {
        let d = self.dims;
        StaticKvCache::new(
            layers,
            (1, d.kv_heads, max_len, d.head_dim),
            DType::BF16,
            dev,
        )
    }

    /// One decoding step at batch 1 on this rank: `token` `(1, 1)` u32 and `pos` `(1,)` u32 on
    /// the device; returns the whole vocabulary's logits `(1, vocab)` in f32. `comm` is
    /// `None` on one GPU.
    fn step(
        &self,
        comm: Option<&Communicator>,
        token: &Tensor,
        pos: &Tensor,
        cache: &StaticKvCache,
    ) -> candle::Result<Tensor> {
        let Dims {
            heads,
            kv_heads: kv,
            head_dim: hd,
            inter,
        } = self.dims;
        if let Some(k) = &self.kernels {
            return self.fused_step(k, comm, token, pos, cache);
        }
        let sum = |t: Tensor| sum(comm, t);
        let at = cache.at(pos, 1)?;
        let mask = at.mask().to_dtype(DType::BF16)?;
        let mut x = self.embed.forward(&token.flatten_all()?)?; // (1, hidden)
        for (layer, b) in self.blocks.iter().enumerate() {
            let qkv = b.qkv.forward(&b.attn_norm.forward(&x)?)?;
            let part =
                |from: usize, n: usize| qkv.narrow(1, from * hd, n * hd)?.reshape((1, n, 1, hd));
            // Rotary embedding of the queries and keys at once; the queries carry the
            // attention's 1/√head_dim already (folded into their weights).
            let qk = self.rotary.apply(&part(0, heads + kv)?, &at)?;
            let (q, k) = (qk.narrow(1, 0, heads)?, qk.narrow(1, heads, kv)?);
            let v = part(heads + kv, kv)?;
            let (ck, cv) = cache.write(layer, &at, &k, &v)?;
            // Grouped-query attention without copying the keys: query heads of one KV head
            // side by side, (1, kv, group, hd) · (1, kv, hd, max_len).
            let q = q.reshape((1, kv, heads / kv, hd))?;
            let att = q.matmul(&ck.t()?)?;
            let att = candle_nn::ops::softmax_last_dim(&att.broadcast_add(&mask)?)?;
            let y = att.matmul(&cv)?.reshape((1, heads * hd))?;
            x = (&x + sum(b.o.forward(&y)?)?)?;
            let gu = b.gate_up.forward(&b.mlp_norm.forward(&x)?)?;
            let m =
                (candle_nn::ops::silu(&gu.narrow(1, 0, inter)?)? * gu.narrow(1, inter, inter)?)?;
            x = (&x + sum(b.down.forward(&m)?)?)?;
        }
        self.logits(comm, &self.norm.forward(&x)?)
    }

    /// The whole vocabulary's logits `(1, vocab)` in f32 from the final norm's output.
    fn logits(&self, comm: Option<&Communicator>, h: &Tensor) -> candle::Result<Tensor> {
        let logits = self.lm_head.forward(h)?.to_dtype(DType::F32)?;
        match comm {
            Some(c) => c.all_gather_tensor(&logits)?.reshape((1, ())),
            None => Ok(logits),
        }
    }

    /// [`Shard::step`] with the fused kernels: per layer the attention is one kernel (rotary
    /// embedding, cache write, attention), each residual add is fused with the norm after it,
    /// SwiGLU is one kernel; the matmuls and collectives are the same.
    fn fused_step(
        &self,
        k: &Kernels,
        comm: Option<&Communicator>,
        token: &Tensor,
        pos: &Tensor,
        cache: &StaticKvCache,
    ) -> candle::Result<Tensor> {
        let Dims {
            heads, kv_heads, ..
        } = self.dims;
        let sum = |t: Tensor| sum(comm, t);
        let tables = self.rotary.tables();
        let mut x = self.embed.forward(&token.flatten_all()?)?; // (1, hidden)
        let mut h = self.blocks[0].attn_norm.forward(&x)?;
        for (layer, b) in self.blocks.iter().enumerate() {
            let qkv = b.qkv.forward(&h)?;
            let layer_cache = (cache.keys(layer)?, cache.values(layer)?);
            let y = k.attention(&qkv, tables, pos, layer_cache, heads, kv_heads)?;
            let (x1, h1) = k.add_rms_norm(&x, &sum(b.o.forward(&y)?)?, b.mlp_norm.weight(), EPS)?;
            let m = k.silu_mul(&b.gate_up.forward(&h1)?)?;
            let next = self
                .blocks
                .get(layer + 1)
                .map_or(&self.norm, |n| &n.attn_norm);
            (x, h) = k.add_rms_norm(&x1, &sum(b.down.forward(&m)?)?, next.weight(), EPS)?;
        }
        self.logits(comm, &h)
    }
}

/// `t` summed over the ranks (`None`: one GPU, `t` itself).
fn sum(comm: Option<&Communicator>, t: Tensor) -> candle::Result<Tensor> {
    match comm {
        Some(c) => c.all_reduce_tensor(&t, ReduceOp::Sum),
        None => Ok(t),
    }
}

// One decoding step of one rank; the attribute makes `TpStepGraph`.
#[cuda_graph(warmup = 2, verify = "never")]
fn tp_step(
    dev: &Device,
    token: &Tensor,
    pos: &Tensor,
    #[state] comm: &Communicator,
    #[state] model: &Shard,
    #[state] cache: &mut StaticKvCache,
) -> candle::Result<Tensor> {
    let _ = dev;
    model.step(Some(comm), token, pos, cache)
}

// The same step on one GPU (no collective).
#[cuda_graph(warmup = 2, verify = "never")]
fn step(
    dev: &Device,
    token: &Tensor,
    pos: &Tensor,
    #[state] model: &Shard,
    #[state] cache: &mut StaticKvCache,
) -> candle::Result<Tensor> {
    let _ = dev;
    model.step(None, token, pos, cache)
}

/// What one rank measured on one GPU count.
struct RankRun {
    tokens: Vec<u32>,
    /// Every position's logits, rank 0 only (for the comparison across GPU counts).
    logits: Option<Vec<Vec<f32>>>,
    /// A hash of every position's logits bits (for the comparison across ranks).
    hash: u64,
    graph_bitwise: bool,
    eager_us: f64,
    graph_us: f64,
    capture_ms: f64,
    /// The graph's nodes: all, kernels, and graph memory nodes (allocations and frees of
    /// candle's op outputs).
    nodes: (usize, usize, usize),
}

/// A generation's device tokens and (when kept) its logits.
struct Generation {
    tokens: Vec<Tensor>,
    logits: Vec<Tensor>,
}

impl Generation {
    fn host_tokens(&self) -> candle::Result<Vec<u32>> {
        Tensor::cat(&self.tokens, 0)?
            .flatten_all()?
            .to_vec1::<u32>()
    }

    fn host_logits(&self) -> candle::Result<Vec<Vec<f32>>> {
        self.logits
            .iter()
            .map(|l| l.flatten_all()?.to_vec1::<f32>())
            .collect()
    }
}

fn fnv(hash: u64, bits: &[f32]) -> u64 {
    bits.iter().fold(hash, |h, v| {
        (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// One rank's whole run: build the shard, decode eagerly, capture, decode with the graph,
/// compare, time.
fn rank_main(
    shape: &Shape,
    args: &Args,
    rank: usize,
    world: usize,
    group: &CommGroup,
) -> Result<RankRun, BoxError> {
    let dev = Device::new_cuda(rank)?;
    let rt = Runtime::from_candle(&dev)?;
    let stream = dev.as_cuda_device()?.cuda_stream();
    let comm = match world {
        1 => None,
        _ => Some(group.join(&rt, rank)?),
    };
    let n = args.tokens;
    let kernels = (!args.unfused).then(|| Kernels::new(&rt)).transpose()?;
    let model = Shard::new(shape, &dev, (rank, world), n, kernels)?;
    let positions: Vec<Tensor> = (0..n as u32)
        .map(|p| Tensor::from_vec(vec![p], 1, &dev))
        .collect::<Result<_, _>>()?;
    let first = Tensor::from_vec(vec![1u32], (1, 1), &dev)?;
    let align = || -> Result<(), BoxError> {
        stream.synchronize()?;
        if let Some(c) = &comm {
            c.barrier()?;
        }
        Ok(())
    };

    let mut eager_cache = model.cache(shape.layers, n, &dev)?;
    let t0 = Instant::now();
    let graph_cache = model.cache(shape.layers, n, &dev)?;
    let mut graph = match &comm {
        Some(c) => Either::Tp(c.capture(|| {
            TpStepGraph::capture(&rt, &first, &positions[0], c, &model, graph_cache)
        })?),
        None => Either::One(StepGraph::capture(
            &rt,
            &first,
            &positions[0],
            &model,
            graph_cache,
        )?),
    };
    stream.synchronize()?;
    let capture_ms = t0.elapsed().as_secs_f64() * 1e3;
    let info = match &graph {
        Either::Tp(g) => g.info(),
        Either::One(g) => g.info(),
    };
    let kinds = &info.kinds;
    let nodes = (info.nodes(), kinds.kernels, kinds.allocs + kinds.frees);

    let mut run_eager = |keep: bool| -> Result<Generation, BoxError> {
        eager_cache.reset()?;
        let mut g = Generation {
            tokens: Vec::with_capacity(n),
            logits: Vec::new(),
        };
        let mut tok = first.clone();
        for pos in &positions {
            let logits = match &comm {
                Some(c) => tp_step(&dev, &tok, pos, c, &model, &mut eager_cache)?,
                None => step(&dev, &tok, pos, &model, &mut eager_cache)?,
            };
            tok = greedy_next(&logits)?;
            g.tokens.push(tok.clone());
            if keep {
                g.logits.push(logits);
            }
        }
        Ok(g)
    };
    let mut run_graph = |keep: bool| -> Result<Generation, BoxError> {
        let mut g = Generation {
            tokens: Vec::with_capacity(n),
            logits: Vec::new(),
        };
        let mut tok = first.clone();
        match &mut graph {
            Either::Tp(gr) => gr.state_mut().cache.reset()?,
            Either::One(gr) => gr.state_mut().cache.reset()?,
        }
        for pos in &positions {
            let logits = match &mut graph {
                Either::Tp(gr) => gr.replay(&tok, pos)?.result,
                Either::One(gr) => gr.replay(&tok, pos)?.result,
            };
            tok = greedy_next(logits)?;
            g.tokens.push(tok.clone());
            if keep {
                g.logits.push(logits.copy()?);
            }
        }
        Ok(g)
    };

    let eager = run_eager(true)?;
    let replayed = run_graph(true)?;
    let tokens = eager.host_tokens()?;
    let (le, lg) = (eager.host_logits()?, replayed.host_logits()?);
    let graph_bitwise = replayed.host_tokens()? == tokens
        && le.len() == lg.len()
        && le
            .iter()
            .zip(&lg)
            .all(|(a, b)| first_mismatch(a, b).is_none());
    let hash = lg.iter().fold(0xcbf2_9ce4_8422_2325, |h, l| fnv(h, l));
    drop((eager, replayed));

    let timed = |f: &mut dyn FnMut(bool) -> Result<Generation, BoxError>| -> Result<f64, BoxError> {
        let mut per_token = Vec::new();
        for _ in 0..args.runs.max(1) {
            align()?;
            let t = Instant::now();
            let g = f(false)?;
            stream.synchronize()?;
            per_token.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
            if g.host_tokens()? != tokens {
                return Err("a timed generation produced other tokens than the checked one".into());
            }
        }
        Ok(workloads::timing::median(per_token))
    };
    let eager_us = timed(&mut run_eager)?;
    let graph_us = timed(&mut run_graph)?;
    align()?;
    Ok(RankRun {
        tokens,
        logits: (rank == 0).then_some(lg),
        hash,
        graph_bitwise,
        eager_us,
        graph_us,
        capture_ms,
        nodes,
    })
}

enum Either<A, B> {
    Tp(A),
    One(B),
}

/// One shape on one GPU count: every rank's run, in rank order.
fn run_world(shape: &Shape, args: &Args, world: usize) -> Result<Vec<RankRun>, BoxError> {
    let group = CommGroup::new(world)?;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let group = &group;
                s.spawn(move || rank_main(shape, args, rank, world, group))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    })
}

/// Where tokens first differ from one GPU's, and the largest logit difference there.
fn first_divergence(one: &RankRun, many: &RankRun) -> Option<(usize, f32)> {
    let p = one
        .tokens
        .iter()
        .zip(&many.tokens)
        .position(|(a, b)| a != b)?;
    let diff = match (&one.logits, &many.logits) {
        (Some(a), Some(b)) => max_abs_diff(&a[p], &b[p]),
        _ => f32::NAN,
    };
    Some((p, diff))
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    init_tracing();
    if !gpus_or_skip("25-tensor-parallel-llama", 1) {
        return Ok(());
    }
    let gpus = usable_gpus()?;
    let shapes: Vec<Shape> = match args.config.as_str() {
        "llama-1b" => vec![LLAMA_1B],
        "llama-8b" => vec![LLAMA_8B],
        "all" => vec![LLAMA_1B, LLAMA_8B],
        other => {
            return Err(format!("--config {other}: expected llama-1b, llama-8b or all").into())
        }
    };
    let mut failures = Vec::new();
    let mut records = Vec::new();
    for mut shape in shapes {
        if let Some(l) = args.layers {
            shape.layers = l.max(1);
        }
        let mut table = Table::new(&[
            "GPUs",
            "eager µs/token",
            "graph µs/token",
            "graph vs 1 GPU",
            "capture ms",
            "nodes/rank (kernels, memory)",
            "graph = eager",
            "ranks equal",
            "tokens vs 1 GPU",
        ]);
        let mut one: Option<(RankRun, f64)> = None;
        for &world in &args.worlds {
            if world > gpus {
                eprintln!(
                    "{}: {world} GPUs skipped: this machine has {gpus}",
                    shape.name
                );
                continue;
            }
            if shape.heads % world != 0
                || shape.kv_heads % world != 0
                || shape.vocab % world != 0
                || shape.intermediate % world != 0
            {
                eprintln!("{}: {world} GPUs skipped: the heads, KV heads, vocabulary or MLP do not split evenly", shape.name);
                continue;
            }
            let ranks = run_world(&shape, &args, world)?;
            let slowest = |f: fn(&RankRun) -> f64| ranks.iter().map(f).fold(0f64, f64::max);
            let (eager_us, graph_us) = (slowest(|r| r.eager_us), slowest(|r| r.graph_us));
            let bitwise = ranks.iter().all(|r| r.graph_bitwise);
            let ranks_equal = ranks
                .iter()
                .all(|r| r.hash == ranks[0].hash && r.tokens == ranks[0].tokens);
            let r0 = ranks.into_iter().next().ok_or("no rank")?;
            let (vs_one, versus) = match &one {
                None => ("—".to_owned(), 1.0),
                Some((o, o_us)) => (
                    match first_divergence(o, &r0) {
                        None => "equal".to_owned(),
                        Some((p, d)) => format!("differ from position {p} (logits within {d:.2e})"),
                    },
                    graph_us / o_us,
                ),
            };
            if !bitwise {
                failures.push(format!(
                    "{} on {world} GPUs: graph logits differ from eager",
                    shape.name
                ));
            }
            if !ranks_equal {
                failures.push(format!(
                    "{} on {world} GPUs: the ranks' logits differ",
                    shape.name
                ));
            }
            table.row(vec![
                world.to_string(),
                us(eager_us),
                us(graph_us),
                format!("{versus:.2}×"),
                format!("{:.0}", r0.capture_ms),
                format!("{} ({}, {})", r0.nodes.0, r0.nodes.1, r0.nodes.2),
                bitwise.to_string(),
                ranks_equal.to_string(),
                vs_one.clone(),
            ]);
            records.push(
                Record::new(
                    "tp_decode",
                    Side::Ours,
                    format!("tp_decode/{}/{world}gpu", shape.name),
                    "candle TP decode, one graph per rank",
                    eager_us,
                    graph_us,
                )
                .shape("config", shape.name)
                .shape("world", world)
                .shape("layers", shape.layers)
                .shape("hidden", shape.hidden)
                .shape("tokens", args.tokens)
                .shape("dtype", "bf16")
                .check(
                    "graph = eager bitwise, ranks bitwise equal",
                    bitwise && ranks_equal,
                )
                .kernels(r0.nodes.1)
                .with("nodes", r0.nodes.0)
                .with("memory_nodes", r0.nodes.2)
                .with("vs_one_gpu", versus)
                .with("tokens_vs_one_gpu", vs_one)
                .with("first_tokens", r0.tokens[..r0.tokens.len().min(8)].to_vec()),
            );
            if one.is_none() && world == 1 {
                one = Some((r0, graph_us));
            }
        }
        println!(
            "\n{} ({} layers, bf16, batch 1, {} tokens), µs per token, slower rank:",
            shape.name, shape.layers, args.tokens
        );
        print!("{}", table.to_markdown());
    }
    if args.torch {
        // Our records print whether or not PyTorch's reference ran.
        if let Err(e) = torch(&args, &mut records) {
            eprintln!("PyTorch's reference did not run: {e}");
        }
    }
    if args.json {
        for r in &records {
            println!("{}", r.line());
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    Ok(())
}

/// PyTorch's reference on the same shapes, its records added to ours.
fn torch(args: &Args, records: &mut Vec<Record>) -> Result<(), BoxError> {
    let worlds = args
        .worlds
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = Command::new("python3");
    cmd.arg("scripts/torch_tp_decode.py")
        .args(["--config", &args.config, "--worlds", &worlds])
        .args([
            "--tokens",
            &args.tokens.to_string(),
            "--runs",
            &args.runs.to_string(),
        ]);
    if let Some(l) = args.layers {
        cmd.args(["--layers", &l.to_string()]);
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!(
            "scripts/torch_tp_decode.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let theirs = read_output(&String::from_utf8_lossy(&out.stdout))?.records;
    let mut table = Table::new(&[
        "workload",
        "ours graph µs/token",
        "PyTorch eager",
        "PyTorch graph",
        "ours vs PyTorch graph",
    ]);
    for t in &theirs {
        let ours = records.iter().find(|r| r.workload == t.workload);
        let ours_us = ours.map_or(f64::NAN, |r| r.graph_us);
        table.row(vec![
            t.workload.clone(),
            us(ours_us),
            us(t.eager_us),
            us(t.graph_us),
            format!("{:.2}×", ours_us / t.graph_us),
        ]);
    }
    println!("\nagainst PyTorch (scripts/torch_tp_decode.py):");
    print!("{}", table.to_markdown());
    records.extend(theirs);
    Ok(())
}
