//! The candle models of `12-candle-mlp`, `13-candle-decoder` and `tests/candle.rs`, written
//! as a candle user writes them: candle-nn building blocks, random weights, batch 1.
//!
//! Nothing here knows about graphs except `#[derive(DeviceState)]`, which tells a graph where
//! a model's tensors are; the graph functions themselves live next to their callers.

#![allow(dead_code)] // each program uses part of it

use graph_runtime::candle::candle_core::{DType, Device, Error, Module, Result, Tensor, D};
use graph_runtime::candle::candle_nn::{self, Embedding, Linear, RmsNorm};
use graph_runtime::DeviceState;

/// A linear layer with random weights (about unit variance of the output).
pub fn random_linear(dev: &Device, inp: usize, out: usize, bias: bool) -> Result<Linear> {
    let std = (1.0 / inp as f64).sqrt();
    let w = Tensor::randn(0f32, std as f32, (out, inp), dev)?;
    let b = if bias {
        Some(Tensor::randn(0f32, 0.1, out, dev)?)
    } else {
        None
    };
    Ok(Linear::new(w, b))
}

/// `layers` × (Linear `dim`→`dim` + GELU): the MLP of `04-mlp-inference`, in candle.
#[derive(DeviceState)]
pub struct Mlp {
    pub layers: Vec<Linear>,
}

impl Mlp {
    /// Random weights on `dev`.
    pub fn new(dev: &Device, layers: usize, dim: usize) -> Result<Self> {
        let layers = (0..layers)
            .map(|_| random_linear(dev, dim, dim, true))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers })
    }

    /// `x` of shape `(batch, dim)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward(&h)?.gelu()?;
        }
        Ok(h)
    }
}

/// The decoder's sizes.
#[derive(Debug, Clone, Copy)]
pub struct DecoderConfig {
    pub vocab: usize,
    pub hidden: usize,
    pub heads: usize,
    pub ffn: usize,
    pub layers: usize,
    /// The static KV cache's length: the most positions one sequence can have.
    pub max_len: usize,
}

impl DecoderConfig {
    /// The decoder of `13-candle-decoder`: hidden 512, 8 heads, 8 layers, vocab 4096.
    pub const SMALL: DecoderConfig = DecoderConfig {
        vocab: 4096,
        hidden: 512,
        heads: 8,
        ffn: 1408,
        layers: 8,
        max_len: 256,
    };

    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// One pre-norm block: attention with rotary positions, then a SwiGLU MLP.
#[derive(DeviceState)]
pub struct Block {
    pub attn_norm: RmsNorm,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub mlp_norm: RmsNorm,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// A small Llama-style decoder, written with candle-nn blocks. Its tables (rotary cos/sin and
/// the causal mask, one row per position) are indexed with a position held in a device
/// tensor, so one graph serves every position.
#[derive(DeviceState)]
pub struct Decoder {
    pub embed: Embedding,
    pub blocks: Vec<Block>,
    pub norm: RmsNorm,
    pub lm_head: Linear,
    /// `(max_len, head_dim / 2)`.
    pub cos: Tensor,
    pub sin: Tensor,
    /// `(max_len, max_len)`: row `p` is 0 up to `p` and -inf after it.
    pub mask: Tensor,
    #[device_state(skip)]
    pub cfg: DecoderConfig,
}

/// The static KV cache: one `(1, heads, max_len, head_dim)` tensor per layer for keys and for
/// values, written in place at the position.
#[derive(DeviceState)]
pub struct KvCache {
    pub k: Vec<Tensor>,
    pub v: Vec<Tensor>,
}

impl KvCache {
    /// Zeros for `cfg`.
    pub fn new(dev: &Device, cfg: &DecoderConfig) -> Result<Self> {
        let shape = (1, cfg.heads, cfg.max_len, cfg.head_dim());
        let zeros = || Tensor::zeros(shape, DType::F32, dev);
        Ok(KvCache {
            k: (0..cfg.layers).map(|_| zeros()).collect::<Result<_>>()?,
            v: (0..cfg.layers).map(|_| zeros()).collect::<Result<_>>()?,
        })
    }
}

impl Decoder {
    /// Random weights on `dev`.
    pub fn new(dev: &Device, cfg: DecoderConfig) -> Result<Self> {
        let (h, f) = (cfg.hidden, cfg.ffn);
        let norm = || Ok::<_, Error>(RmsNorm::new(Tensor::ones(h, DType::F32, dev)?, 1e-5));
        let blocks = (0..cfg.layers)
            .map(|_| {
                Ok(Block {
                    attn_norm: norm()?,
                    q: random_linear(dev, h, h, false)?,
                    k: random_linear(dev, h, h, false)?,
                    v: random_linear(dev, h, h, false)?,
                    o: random_linear(dev, h, h, false)?,
                    mlp_norm: norm()?,
                    gate: random_linear(dev, h, f, false)?,
                    up: random_linear(dev, h, f, false)?,
                    down: random_linear(dev, f, h, false)?,
                })
            })
            .collect::<Result<_>>()?;
        let half = cfg.head_dim() / 2;
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / cfg.head_dim() as f32))
            .collect();
        let angles: Vec<f32> = (0..cfg.max_len)
            .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
            .collect();
        let angles = Tensor::from_vec(angles, (cfg.max_len, half), dev)?;
        let mask: Vec<f32> = (0..cfg.max_len)
            .flat_map(|p| {
                (0..cfg.max_len).map(move |j| if j <= p { 0.0 } else { f32::NEG_INFINITY })
            })
            .collect();
        Ok(Decoder {
            embed: Embedding::new(Tensor::randn(0f32, 1.0, (cfg.vocab, h), dev)?, h),
            blocks,
            norm: norm()?,
            lm_head: random_linear(dev, h, cfg.vocab, false)?,
            cos: angles.cos()?,
            sin: angles.sin()?,
            mask: Tensor::from_vec(mask, (cfg.max_len, cfg.max_len), dev)?,
            cfg,
        })
    }

    /// One decoding step at batch 1: `token` `(1, 1)` u32 and `pos` `(1,)` u32, both on the
    /// device. Writes the step's keys and values into `cache` at `pos` and returns the logits
    /// `(1, 1, vocab)`. No shape depends on `pos`.
    pub fn step(&self, token: &Tensor, pos: &Tensor, cache: &KvCache) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (heads, hd) = (cfg.heads, cfg.head_dim());
        let cos = self.cos.index_select(pos, 0)?;
        let sin = self.sin.index_select(pos, 0)?;
        let mask = self
            .mask
            .index_select(pos, 0)?
            .reshape((1, 1, 1, cfg.max_len))?;
        // Where this step's key and value go: `pos` along the cache's position axis.
        let at = pos
            .reshape((1, 1, 1, 1))?
            .broadcast_as((1, heads, 1, hd))?
            .contiguous()?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x = self.embed.forward(token)?;
        for (b, (ck, cv)) in self.blocks.iter().zip(cache.k.iter().zip(&cache.v)) {
            let n = b.attn_norm.forward(&x)?;
            let split = |t: Tensor| t.reshape((1, 1, heads, hd))?.transpose(1, 2)?.contiguous();
            let q = candle_nn::rotary_emb::rope(&split(b.q.forward(&n)?)?, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope(&split(b.k.forward(&n)?)?, &cos, &sin)?;
            let v = split(b.v.forward(&n)?)?;
            ck.scatter_set(&at, &k, 2)?;
            cv.scatter_set(&at, &v, 2)?;
            let att = (q.matmul(&ck.t()?)? * scale)?.broadcast_add(&mask)?;
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            let o = att
                .matmul(cv)?
                .transpose(1, 2)?
                .reshape((1, 1, cfg.hidden))?;
            x = (x + b.o.forward(&o)?)?;
            let n = b.mlp_norm.forward(&x)?;
            let m = (b.gate.forward(&n)?.silu()? * b.up.forward(&n)?)?;
            x = (x + b.down.forward(&m)?)?;
        }
        self.lm_head.forward(&self.norm.forward(&x)?)
    }
}

/// The most likely next token of `logits` `(1, 1, vocab)`, on the device: `(1, 1)` u32.
pub fn greedy(logits: &Tensor) -> Result<Tensor> {
    logits.argmax_keepdim(D::Minus1)?.reshape((1, 1))
}
