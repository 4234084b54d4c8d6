//! Host reference implementations of the example models, in `f64`: what the GPU's eager
//! run is checked against (with a tolerance) before eager and graph are compared with each
//! other (bit for bit).
//!
//! * `examples/04-mlp-inference.rs`: [`mlp_inference`].
//! * `examples/05-decode-step.rs`: [`Decoder`] and [`Decoder::step`].
//! * `examples/06-train-step.rs`: [`ParamLayout`] and [`HostTrainer`]; with
//!   [`dropout_mask`], `examples/07-dropout-train.rs`.
//!
//! The formulas are the ones of the kernels in [`crate::kernels`]: GELU is the tanh
//! approximation, RMSNorm has its weight, rotary embedding rotates interleaved pairs.

use std::ops::Range;

use rand::rngs::SmallRng;
use rand::Rng;

const GELU_K0: f64 = 0.797_884_560_802_865_4;
const GELU_K1: f64 = 0.044715;

/// GELU, tanh approximation (PyTorch's `approximate="tanh"`).
pub fn gelu(v: f64) -> f64 {
    0.5 * v * (1.0 + (GELU_K0 * (v + GELU_K1 * v * v * v)).tanh())
}

/// The derivative of [`gelu`].
pub fn gelu_grad(v: f64) -> f64 {
    let t = (GELU_K0 * (v + GELU_K1 * v * v * v)).tanh();
    0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_K0 * (1.0 + 3.0 * GELU_K1 * v * v)
}

/// SiLU, `v · sigmoid(v)`.
pub fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// `y[r] = w[r, :] · x` for a row-major `w: [out, x.len()]`.
pub fn matvec(w: &[f32], x: &[f64], out: usize) -> Vec<f64> {
    let inp = x.len();
    assert!(w.len() >= out * inp, "matvec: weight too short");
    (0..out)
        .map(|r| {
            w[r * inp..(r + 1) * inp]
                .iter()
                .zip(x)
                .map(|(a, b)| *a as f64 * b)
                .sum()
        })
        .collect()
}

/// Uniform values in `[-bound, bound)`: PyTorch's default `Linear` initialisation uses
/// `bound = 1 / sqrt(fan_in)`.
pub fn uniform(rng: &mut SmallRng, n: usize, bound: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-bound..bound)).collect()
}

/// `layers` × (Linear `dim → dim` + bias + GELU) on `rows` inputs of `dim`: row-major
/// `x: [rows, dim]`, `w: [layers, dim (out), dim (in)]`, `b: [layers, dim]`.
pub fn mlp_inference(x: &[f32], w: &[f32], b: &[f32], layers: usize, dim: usize) -> Vec<f32> {
    assert_eq!(x.len() % dim, 0, "x is not a whole number of rows");
    assert_eq!(w.len(), layers * dim * dim);
    assert_eq!(b.len(), layers * dim);
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(dim) {
        let mut a: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        for l in 0..layers {
            let h = matvec(&w[l * dim * dim..(l + 1) * dim * dim], &a, dim);
            a = h
                .iter()
                .zip(&b[l * dim..(l + 1) * dim])
                .map(|(h, b)| gelu(h + *b as f64))
                .collect();
        }
        out.extend(a.iter().map(|&v| v as f32));
    }
    out
}

// ---------------------------------------------------------------------------------------
// Decoder.

/// The shape of the decoder of `examples/05-decode-step.rs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderSpec {
    /// Model width.
    pub dim: usize,
    /// Attention heads (`dim / heads` values each).
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden width of the SwiGLU feed-forward block.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Positions the KV cache holds.
    pub max_seq: usize,
    /// Rotary embedding base.
    pub theta: f32,
    /// RMSNorm epsilon.
    pub eps: f32,
}

impl DecoderSpec {
    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.dim / self.heads
    }

    /// Floats of the KV cache: `[layers][k, v][max_seq][dim]`.
    pub fn kv_len(&self) -> usize {
        self.layers * 2 * self.max_seq * self.dim
    }

    /// Floats of all weights.
    pub fn parameters(&self) -> usize {
        let d = self.dim;
        let per_layer = 2 * d + 3 * d * d + d * d + 2 * self.ffn * d + d * self.ffn;
        self.vocab * d + self.layers * per_layer + d + self.vocab * d
    }
}

/// The weights of one transformer block, row-major `[out, in]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderLayer {
    /// RMSNorm weight before attention, `[dim]`.
    pub attn_norm: Vec<f32>,
    /// Query, key and value projections stacked, `[3 · dim, dim]`.
    pub wqkv: Vec<f32>,
    /// Output projection, `[dim, dim]`.
    pub wo: Vec<f32>,
    /// RMSNorm weight before the feed-forward block, `[dim]`.
    pub ffn_norm: Vec<f32>,
    /// Gate and up projections stacked, `[2 · ffn, dim]`.
    pub w13: Vec<f32>,
    /// Down projection, `[dim, ffn]`.
    pub w2: Vec<f32>,
}

/// A decoder's weights on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoder {
    /// The shape.
    pub spec: DecoderSpec,
    /// Token embeddings, `[vocab, dim]`.
    pub embed: Vec<f32>,
    /// The blocks.
    pub layers: Vec<DecoderLayer>,
    /// The last RMSNorm's weight, `[dim]`.
    pub final_norm: Vec<f32>,
    /// The output projection, `[vocab, dim]`.
    pub lm_head: Vec<f32>,
}

/// A decoder's KV cache on the host: per layer, `[max_seq][dim]` keys and values.
#[derive(Debug, Clone, PartialEq)]
pub struct HostKvCache {
    k: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

impl HostKvCache {
    /// An empty cache for `spec`.
    pub fn new(spec: &DecoderSpec) -> Self {
        let per = spec.max_seq * spec.dim;
        HostKvCache {
            k: vec![vec![0.0; per]; spec.layers],
            v: vec![vec![0.0; per]; spec.layers],
        }
    }
}

/// `x · w / sqrt(mean(x²) + eps)`.
pub fn rmsnorm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * *w as f64).collect()
}

/// Rotates the interleaved pairs `(2i, 2i + 1)` of each head of `v` by
/// `pos · theta^(-2i / head_dim)`.
pub fn rope(v: &mut [f64], pos: usize, head_dim: usize, theta: f32) {
    for (pair, xy) in v.chunks_exact_mut(2).enumerate() {
        let j = pair % (head_dim / 2);
        let freq = (theta as f64).powf(-2.0 * j as f64 / head_dim as f64);
        let (s, c) = (pos as f64 * freq).sin_cos();
        let (x0, x1) = (xy[0], xy[1]);
        xy[0] = x0 * c - x1 * s;
        xy[1] = x0 * s + x1 * c;
    }
}

/// Softmax attention of one query per head over the first `len` cached positions.
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    len: usize,
    heads: usize,
    dim: usize,
) -> Vec<f64> {
    let hd = dim / heads;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0.0; dim];
    for h in 0..heads {
        let qh = &q[h * hd..(h + 1) * hd];
        let scores: Vec<f64> = (0..len)
            .map(|t| {
                let kt = &k[t * dim + h * hd..t * dim + (h + 1) * hd];
                qh.iter().zip(kt).map(|(a, b)| a * b).sum::<f64>() * scale
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        for d in 0..hd {
            out[h * hd + d] = (0..len)
                .map(|t| e[t] * v[t * dim + h * hd + d])
                .sum::<f64>()
                / sum;
        }
    }
    out
}

/// The index of the largest value; the lowest such index on ties (the kernel's rule).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

impl Decoder {
    /// Random weights: embeddings uniform in `[-1, 1)`, projections with PyTorch's `Linear`
    /// bound `1 / sqrt(fan_in)`, norm weights near 1.
    pub fn random(spec: DecoderSpec, rng: &mut SmallRng) -> Self {
        let d = spec.dim;
        let near_one = |rng: &mut SmallRng| -> Vec<f32> {
            (0..d).map(|_| rng.random_range(0.9..1.1)).collect()
        };
        let bound = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let embed = uniform(rng, spec.vocab * d, 1.0);
        let layers = (0..spec.layers)
            .map(|_| DecoderLayer {
                attn_norm: near_one(rng),
                wqkv: uniform(rng, 3 * d * d, bound(d)),
                wo: uniform(rng, d * d, bound(d)),
                ffn_norm: near_one(rng),
                w13: uniform(rng, 2 * spec.ffn * d, bound(d)),
                w2: uniform(rng, d * spec.ffn, bound(spec.ffn)),
            })
            .collect();
        Decoder {
            spec,
            embed,
            layers,
            final_norm: near_one(rng),
            lm_head: uniform(rng, spec.vocab * d, bound(d)),
        }
    }

    /// One decode step: the logits after `token` at position `pos`, whose key and value are
    /// written into `cache`.
    ///
    /// # Panics
    /// If `pos` is past the cache or `token` past the vocabulary.
    pub fn step(&self, cache: &mut HostKvCache, token: usize, pos: usize) -> Vec<f32> {
        let s = &self.spec;
        let d = s.dim;
        assert!(pos < s.max_seq, "position {pos} past the cache");
        assert!(token < s.vocab, "token {token} past the vocabulary");
        let mut x: Vec<f64> = self.embed[token * d..(token + 1) * d]
            .iter()
            .map(|&v| v as f64)
            .collect();
        for (l, w) in self.layers.iter().enumerate() {
            let xn = rmsnorm(&x, &w.attn_norm, s.eps);
            let qkv = matvec(&w.wqkv, &xn, 3 * d);
            let mut q = qkv[..d].to_vec();
            let mut k = qkv[d..2 * d].to_vec();
            rope(&mut q, pos, s.head_dim(), s.theta);
            rope(&mut k, pos, s.head_dim(), s.theta);
            cache.k[l][pos * d..(pos + 1) * d].copy_from_slice(&k);
            cache.v[l][pos * d..(pos + 1) * d].copy_from_slice(&qkv[2 * d..]);
            let a = attention(&q, &cache.k[l], &cache.v[l], pos + 1, s.heads, d);
            for (xi, oi) in x.iter_mut().zip(matvec(&w.wo, &a, d)) {
                *xi += oi;
            }
            let xn = rmsnorm(&x, &w.ffn_norm, s.eps);
            let gu = matvec(&w.w13, &xn, 2 * s.ffn);
            let h: Vec<f64> = (0..s.ffn).map(|i| silu(gu[i]) * gu[s.ffn + i]).collect();
            for (xi, oi) in x.iter_mut().zip(matvec(&w.w2, &h, d)) {
                *xi += oi;
            }
        }
        let xn = rmsnorm(&x, &self.final_norm, s.eps);
        matvec(&self.lm_head, &xn, s.vocab)
            .iter()
            .map(|&v| v as f32)
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// Training.

/// Where each layer's weight `[out, in]` and bias `[out]` live in one flat parameter buffer
/// of an MLP with widths `dims` (`dims[0]` inputs, `dims[last]` outputs): `W0, b0, W1, b1,
/// …`. Gradients and the optimizer's moments use the same layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    dims: Vec<usize>,
    starts: Vec<usize>,
    total: usize,
}

impl ParamLayout {
    /// The layout of an MLP with these widths.
    ///
    /// # Panics
    /// With fewer than two widths or a zero width.
    pub fn new(dims: &[usize]) -> Self {
        assert!(dims.len() >= 2, "an MLP needs an input and an output width");
        assert!(dims.iter().all(|&d| d > 0), "zero width in {dims:?}");
        let mut starts = Vec::new();
        let mut at = 0;
        for l in 0..dims.len() - 1 {
            starts.push(at);
            at += dims[l + 1] * dims[l] + dims[l + 1];
        }
        ParamLayout {
            dims: dims.to_vec(),
            starts,
            total: at,
        }
    }

    /// The widths.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Linear layers.
    pub fn layers(&self) -> usize {
        self.dims.len() - 1
    }

    /// `(in, out)` of layer `l`.
    pub fn shape(&self, l: usize) -> (usize, usize) {
        (self.dims[l], self.dims[l + 1])
    }

    /// The range of layer `l`'s weight.
    pub fn w(&self, l: usize) -> Range<usize> {
        let (i, o) = self.shape(l);
        self.starts[l]..self.starts[l] + o * i
    }

    /// The range of layer `l`'s bias.
    pub fn b(&self, l: usize) -> Range<usize> {
        let w = self.w(l);
        w.end..w.end + self.dims[l + 1]
    }

    /// Total parameters.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether there are no parameters (never: every layer has a bias).
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Parameters with PyTorch's default `Linear` initialisation (weights and biases
    /// uniform in `±1 / sqrt(fan_in)`).
    pub fn init(&self, rng: &mut SmallRng) -> Vec<f32> {
        let mut p = vec![0.0; self.total];
        for l in 0..self.layers() {
            let bound = 1.0 / (self.dims[l] as f32).sqrt();
            for i in self.w(l).chain(self.b(l)) {
                p[i] = rng.random_range(-bound..bound);
            }
        }
        p
    }
}

/// Dropout applied to the activation after one hidden layer.
#[derive(Debug, Clone, PartialEq)]
pub struct HostDropout {
    /// The layer whose GELU output is dropped (`0` is the first hidden layer).
    pub after_layer: usize,
    /// Kept elements (1), `[batch, width]`.
    pub mask: Vec<u8>,
    /// `1 - p`.
    pub keep_prob: f32,
}

/// What `graph_runtime`'s `Generator::dropout` keeps, computed on the host: element `i` is
/// kept when the generator's uniform value `i` is below `1 - p`. `offset` is the
/// generator's offset (in Philox counters) before the draw.
pub fn dropout_mask(seed: u64, offset: u64, n: usize, p: f32) -> Vec<u8> {
    let keep = 1.0 - p;
    (0..n as u64)
        .map(|i| u8::from(graph_runtime::rng::reference_uniform(seed, offset, i) < keep))
        .collect()
}

/// Philox counters one draw of `n` values consumes.
pub fn counters_for(n: usize) -> u64 {
    n.div_ceil(4) as u64
}

/// AdamW and gradient clipping settings (PyTorch's names and defaults where it has them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// The global gradient norm is clipped to this.
    pub max_norm: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_norm: 1.0,
        }
    }
}

/// The activations one forward pass keeps for the backward pass.
#[derive(Debug, Clone)]
pub struct Forward {
    /// The input of each linear layer (after GELU and dropout for the hidden ones).
    pub inputs: Vec<Vec<f64>>,
    /// The pre-activations of the hidden layers.
    pub z: Vec<Vec<f64>>,
    /// The network's output.
    pub out: Vec<f64>,
}

/// The forward pass of an MLP (`Linear`, then GELU on every hidden layer, optional dropout)
/// over `batch` rows of `x`.
pub fn forward(
    layout: &ParamLayout,
    params: &[f64],
    x: &[f32],
    batch: usize,
    dropout: Option<&HostDropout>,
) -> Forward {
    let mut a: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let (mut inputs, mut zs) = (Vec::new(), Vec::new());
    for l in 0..layout.layers() {
        let (inp, out) = layout.shape(l);
        let (w, b) = (&params[layout.w(l)], &params[layout.b(l)]);
        let mut h = vec![0.0; batch * out];
        for r in 0..batch {
            for o in 0..out {
                let dot: f64 = (0..inp).map(|i| a[r * inp + i] * w[o * inp + i]).sum();
                h[r * out + o] = dot + b[o];
            }
        }
        inputs.push(std::mem::take(&mut a));
        if l + 1 == layout.layers() {
            return Forward {
                inputs,
                z: zs,
                out: h,
            };
        }
        a = h.iter().map(|&v| gelu(v)).collect();
        if let Some(d) = dropout.filter(|d| d.after_layer == l) {
            let scale = (1.0f32 / d.keep_prob) as f64;
            for (v, m) in a.iter_mut().zip(&d.mask) {
                *v = if *m != 0 { *v * scale } else { 0.0 };
            }
        }
        zs.push(h);
    }
    unreachable!("the last layer returns")
}

/// Mean squared error and its gradient with respect to `out`.
pub fn mse(out: &[f64], target: &[f32]) -> (f64, Vec<f64>) {
    let n = out.len() as f64;
    let diff: Vec<f64> = out.iter().zip(target).map(|(o, t)| o - *t as f64).collect();
    let loss = diff.iter().map(|d| d * d).sum::<f64>() / n;
    (loss, diff.iter().map(|d| 2.0 * d / n).collect())
}

/// The gradient of the loss with respect to every parameter, given the forward pass and the
/// gradient at the output.
pub fn backward(
    layout: &ParamLayout,
    params: &[f64],
    fwd: &Forward,
    dout: &[f64],
    batch: usize,
    dropout: Option<&HostDropout>,
) -> Vec<f64> {
    let mut grads = vec![0.0; layout.len()];
    let mut dz = dout.to_vec();
    for l in (0..layout.layers()).rev() {
        let (inp, out) = layout.shape(l);
        let a = &fwd.inputs[l];
        let (wr, br) = (layout.w(l), layout.b(l));
        for o in 0..out {
            for i in 0..inp {
                grads[wr.start + o * inp + i] =
                    (0..batch).map(|r| dz[r * out + o] * a[r * inp + i]).sum();
            }
            grads[br.start + o] = (0..batch).map(|r| dz[r * out + o]).sum();
        }
        if l == 0 {
            break;
        }
        let w = &params[wr];
        let mut da = vec![0.0; batch * inp];
        for r in 0..batch {
            for i in 0..inp {
                da[r * inp + i] = (0..out).map(|o| dz[r * out + o] * w[o * inp + i]).sum();
            }
        }
        if let Some(d) = dropout.filter(|d| d.after_layer == l - 1) {
            let scale = (1.0f32 / d.keep_prob) as f64;
            for (v, m) in da.iter_mut().zip(&d.mask) {
                *v = if *m != 0 { *v * scale } else { 0.0 };
            }
        }
        dz = da
            .iter()
            .zip(&fwd.z[l - 1])
            .map(|(g, z)| g * gelu_grad(*z))
            .collect();
    }
    grads
}

/// An MLP trained on the host with the GPU examples' step: forward, MSE, backward, clip to
/// a global norm, AdamW.
#[derive(Debug, Clone)]
pub struct HostTrainer {
    /// The parameter layout.
    pub layout: ParamLayout,
    /// Parameters.
    pub params: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
    /// Steps taken.
    pub step: u32,
    /// Optimizer settings.
    pub opt: AdamW,
}

impl HostTrainer {
    /// A trainer starting from `params`, moments zero, step 0.
    pub fn new(layout: ParamLayout, params: &[f32], opt: AdamW) -> Self {
        assert_eq!(
            params.len(),
            layout.len(),
            "parameters do not fit the layout"
        );
        HostTrainer {
            m: vec![0.0; layout.len()],
            v: vec![0.0; layout.len()],
            params: params.iter().map(|&p| p as f64).collect(),
            layout,
            step: 0,
            opt,
        }
    }

    /// One step on `batch` rows of `x` and `target`; returns the loss before the update.
    pub fn step(
        &mut self,
        x: &[f32],
        target: &[f32],
        batch: usize,
        dropout: Option<&HostDropout>,
    ) -> f64 {
        let fwd = forward(&self.layout, &self.params, x, batch, dropout);
        let (loss, dout) = mse(&fwd.out, target);
        let mut g = backward(&self.layout, &self.params, &fwd, &dout, batch, dropout);
        let o = self.opt;
        let norm = g.iter().map(|v| v * v).sum::<f64>().sqrt();
        let coef = (o.max_norm as f64 / (norm + 1e-6)).min(1.0);
        g.iter_mut().for_each(|v| *v *= coef);
        let t = (self.step + 1) as f64;
        let (b1, b2) = (o.beta1 as f64, o.beta2 as f64);
        let (bc1, bc2) = (1.0 - b1.powf(t), 1.0 - b2.powf(t));
        let (lr, wd, eps) = (o.lr as f64, o.weight_decay as f64, o.eps as f64);
        let moments = self.m.iter_mut().zip(self.v.iter_mut());
        for ((p, (m, v)), g) in self.params.iter_mut().zip(moments).zip(&g) {
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            let decayed = *p * (1.0 - lr * wd);
            *p = decayed - lr * (*m / bc1) / ((*v / bc2).sqrt() + eps);
        }
        self.step += 1;
        loss
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{random_vec, seeded_rng};

    #[test]
    fn gelu_and_its_gradient() {
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(3.0) - 3.0).abs() < 0.01);
        assert!(gelu(-5.0).abs() < 1e-3);
        for v in [-3.0, -1.0, -0.2, 0.0, 0.3, 1.5, 4.0] {
            let h = 1e-6;
            let fd = (gelu(v + h) - gelu(v - h)) / (2.0 * h);
            assert!((fd - gelu_grad(v)).abs() < 1e-7, "gelu'({v})");
        }
        assert!((silu(1.0) - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-15);
    }

    #[test]
    fn the_mlp_reference_is_gelu_of_affine_layers() {
        let mut rng = seeded_rng(3);
        let (layers, dim) = (2, 3);
        let w = random_vec(&mut rng, layers * dim * dim);
        let b = random_vec(&mut rng, layers * dim);
        let x = random_vec(&mut rng, 2 * dim);
        let y = mlp_inference(&x, &w, &b, layers, dim);
        // By hand for row 1.
        let mut a: Vec<f64> = x[dim..].iter().map(|&v| v as f64).collect();
        for l in 0..layers {
            a = (0..dim)
                .map(|o| {
                    let s: f64 = (0..dim)
                        .map(|i| w[l * dim * dim + o * dim + i] as f64 * a[i])
                        .sum();
                    gelu(s + b[l * dim + o] as f64)
                })
                .collect();
        }
        for (g, w) in y[dim..].iter().zip(&a) {
            assert!((*g as f64 - w).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let mut v = vec![1.0, 0.0, 0.5, -0.5, 2.0, 1.0, 0.0, 1.0];
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>();
        let before = v.clone();
        rope(&mut v, 0, 4, 10_000.0);
        assert_eq!(v, before, "position 0 is the identity");
        rope(&mut v, 3, 4, 10_000.0);
        assert!((norm(&v) - norm(&before)).abs() < 1e-12);
        // Pair 0 of each head turns by 3 radians (frequency 1).
        assert!((v[0] - 3f64.cos()).abs() < 1e-12 && (v[1] - 3f64.sin()).abs() < 1e-12);
        // Pair 1 of each head turns by 3 / 100 radians (theta^(-2/4) = 1/100).
        let a = 0.03f64;
        assert!((v[2] - (0.5 * a.cos() + 0.5 * a.sin())).abs() < 1e-12);
    }

    #[test]
    fn attention_over_one_position_returns_its_value() {
        let (heads, dim) = (2, 4);
        let q = vec![0.3, -1.0, 2.0, 0.1];
        let k = vec![1.0, 2.0, 3.0, 4.0];
        let v = vec![5.0, 6.0, 7.0, 8.0];
        assert_eq!(attention(&q, &k, &v, 1, heads, dim), v);
        // Two positions with equal keys: the mean of the values.
        let k2 = [k.clone(), k].concat();
        let v2 = [v.clone(), vec![1.0, 2.0, 3.0, 4.0]].concat();
        let out = attention(&q, &k2, &v2, 2, heads, dim);
        assert!(out
            .iter()
            .zip([3.0, 4.0, 5.0, 6.0])
            .all(|(a, b)| (a - b).abs() < 1e-12));
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), 1);
        assert_eq!(argmax(&[-1.0]), 0);
        assert_eq!(argmax(&[0.0, -0.0]), 0);
    }

    #[test]
    fn rmsnorm_normalises() {
        let y = rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 0.0);
        let inv = 1.0 / 12.5f64.sqrt();
        assert!((y[0] - 3.0 * inv).abs() < 1e-12 && (y[1] - 8.0 * inv).abs() < 1e-12);
    }

    fn tiny_spec() -> DecoderSpec {
        DecoderSpec {
            dim: 8,
            heads: 2,
            layers: 2,
            ffn: 12,
            vocab: 16,
            max_seq: 6,
            theta: 10_000.0,
            eps: 1e-5,
        }
    }

    #[test]
    fn decoder_steps_use_the_cache() {
        let spec = tiny_spec();
        let dec = Decoder::random(spec, &mut seeded_rng(5));
        assert_eq!(
            dec.embed.len()
                + dec.lm_head.len()
                + dec.final_norm.len()
                + dec
                    .layers
                    .iter()
                    .map(|l| l.attn_norm.len()
                        + l.wqkv.len()
                        + l.wo.len()
                        + l.ffn_norm.len()
                        + l.w13.len()
                        + l.w2.len())
                    .sum::<usize>(),
            spec.parameters()
        );
        let mut cache = HostKvCache::new(&spec);
        let first = dec.step(&mut cache, 3, 0);
        assert_eq!(first.len(), spec.vocab);
        assert!(first.iter().all(|v| v.is_finite()));
        // Token 5 after token 3 attends to both: its logits differ from token 5 alone. (The
        // same token twice would not tell: equal values average to themselves.)
        let second = dec.step(&mut cache, 5, 1);
        let alone = dec.step(&mut HostKvCache::new(&spec), 5, 0);
        assert_ne!(second, alone);
        // Rerunning position 0 from an empty cache reproduces the first step.
        let again = dec.step(&mut HostKvCache::new(&spec), 3, 0);
        assert_eq!(first, again);
    }

    #[test]
    #[should_panic(expected = "position 6 past the cache")]
    fn decoder_refuses_positions_past_the_cache() {
        let spec = tiny_spec();
        let dec = Decoder::random(spec, &mut seeded_rng(5));
        dec.step(&mut HostKvCache::new(&spec), 0, 6);
    }

    #[test]
    fn param_layout_is_contiguous() {
        let l = ParamLayout::new(&[3, 5, 2]);
        assert_eq!(l.layers(), 2);
        assert_eq!(l.w(0), 0..15);
        assert_eq!(l.b(0), 15..20);
        assert_eq!(l.w(1), 20..30);
        assert_eq!(l.b(1), 30..32);
        assert_eq!(l.len(), 32);
        assert!(!l.is_empty());
        let p = l.init(&mut seeded_rng(1));
        let bound = 1.0 / 3f32.sqrt();
        assert!(p[..20].iter().all(|v| v.abs() <= bound));
        assert!(p.iter().any(|v| *v != 0.0));
    }

    fn loss_at(
        layout: &ParamLayout,
        p: &[f64],
        x: &[f32],
        t: &[f32],
        batch: usize,
        d: Option<&HostDropout>,
    ) -> f64 {
        mse(&forward(layout, p, x, batch, d).out, t).0
    }

    /// The backward pass against central finite differences, with and without dropout.
    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = seeded_rng(21);
        let layout = ParamLayout::new(&[4, 6, 5, 3]);
        let batch = 3;
        let params: Vec<f64> = layout.init(&mut rng).iter().map(|&v| v as f64).collect();
        let x = random_vec(&mut rng, batch * 4);
        let t = random_vec(&mut rng, batch * 3);
        let mask: Vec<u8> = (0..batch * 6).map(|i| u8::from(i % 3 != 0)).collect();
        let drop = HostDropout {
            after_layer: 0,
            mask,
            keep_prob: 0.75,
        };
        for d in [None, Some(&drop)] {
            let fwd = forward(&layout, &params, &x, batch, d);
            let (_, dout) = mse(&fwd.out, &t);
            let g = backward(&layout, &params, &fwd, &dout, batch, d);
            for i in 0..layout.len() {
                let h = 1e-6;
                let mut p = params.clone();
                p[i] += h;
                let up = loss_at(&layout, &p, &x, &t, batch, d);
                p[i] -= 2.0 * h;
                let down = loss_at(&layout, &p, &x, &t, batch, d);
                let fd = (up - down) / (2.0 * h);
                assert!(
                    (fd - g[i]).abs() < 1e-7 + 1e-5 * fd.abs(),
                    "parameter {i} (dropout {}): finite difference {fd}, backward {}",
                    d.is_some(),
                    g[i]
                );
            }
        }
    }

    #[test]
    fn one_adamw_step_by_hand() {
        // One weight, one bias, one sample: the first Adam step moves each parameter by
        // about lr against the sign of its (clipped) gradient, after the decay.
        let layout = ParamLayout::new(&[1, 1]);
        let opt = AdamW::default();
        let mut tr = HostTrainer::new(layout, &[0.5, 0.0], opt);
        let loss = tr.step(&[2.0], &[3.0], 1, None);
        // out = 1.0, loss = 4, dout = -4, dW = -8, db = -4: both negative, so both grow.
        assert!((loss - 4.0).abs() < 1e-12);
        let lr = opt.lr as f64;
        let want_w = 0.5 * (1.0 - lr * opt.weight_decay as f64) + lr;
        assert!((tr.params[0] - want_w).abs() < 1e-9, "{}", tr.params[0]);
        assert!((tr.params[1] - lr).abs() < 1e-9);
        assert_eq!(tr.step, 1);
    }

    #[test]
    fn training_reduces_the_loss() {
        let mut rng = seeded_rng(8);
        let layout = ParamLayout::new(&[8, 16, 4]);
        let p = layout.init(&mut rng);
        let x = random_vec(&mut rng, 16 * 8);
        let t = random_vec(&mut rng, 16 * 4);
        let opt = AdamW {
            lr: 1e-2,
            ..AdamW::default()
        };
        let mut tr = HostTrainer::new(layout, &p, opt);
        let first = tr.step(&x, &t, 16, None);
        let mut last = first;
        for _ in 0..100 {
            last = tr.step(&x, &t, 16, None);
        }
        assert!(last < 0.5 * first, "loss {first} → {last}");
    }

    #[test]
    fn dropout_masks_follow_the_generator() {
        let n = 4099;
        let a = dropout_mask(7, 0, n, 0.25);
        let kept = a.iter().filter(|&&m| m == 1).count() as f64 / n as f64;
        assert!((kept - 0.75).abs() < 0.03, "kept {kept}");
        // The next draw starts where this one stopped.
        let b = dropout_mask(7, counters_for(n), 8, 0.25);
        let c = dropout_mask(7, 0, n + 8 + 1, 0.25);
        assert_ne!(&a[..8], &b[..]);
        // Index 4100 of a draw at offset 0 is index 0 of a draw at offset 1025.
        assert_eq!(c[4100], b[0]);
        assert_eq!(counters_for(4099), 1025);
        assert_eq!(dropout_mask(7, 0, 16, 0.0), vec![1; 16]);
        assert_eq!(dropout_mask(7, 0, 16, 1.0), vec![0; 16]);
    }
}
