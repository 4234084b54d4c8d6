//! Host reference implementations of the example models, in `f64`: what the GPU's eager
//! run is checked against (with a tolerance) before eager and graph are compared with each
//! other (bit for bit).
//!
//! * `examples/04-mlp-inference.rs`: [`mlp_inference`].
//! * `examples/05-decode-step.rs`: [`Decoder`] and [`Decoder::step`] ([`decoder`]).
//! * `examples/06-train-step.rs` and `examples/07-dropout-train.rs`: [`HostTrainer`], with
//!   [`dropout_mask`] for the second ([`train`]).
//!
//! The formulas are the ones of the kernels in [`crate::kernels`]: GELU is the tanh
//! approximation, RMSNorm has its weight, rotary embedding rotates interleaved pairs.

use rand::rngs::SmallRng;
use rand::Rng;

pub mod decoder;
pub mod train;

pub use decoder::{argmax, Decoder, DecoderLayer, DecoderSpec, HostKvCache};
pub use train::{
    backward, counters_for, dropout_mask, forward, mse, AdamW, Forward, HostDropout, HostTrainer,
    ParamLayout,
};

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
}
