//! The host model of `examples/05-decode-step.rs`: a small pre-norm transformer decoding
//! one token at a time against a KV cache.

use rand::rngs::SmallRng;
use rand::Rng;

use super::{matvec, silu, uniform};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::seeded_rng;
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
}
