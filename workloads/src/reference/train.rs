//! The host model of the training examples (`06-train-step`, `07-dropout-train`): an MLP
//! trained with MSE, clipping to a global norm and AdamW, with optional dropout.

use std::ops::Range;

use rand::rngs::SmallRng;
use rand::Rng;

use super::{gelu, gelu_grad};

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

impl AdamW {
    /// PyTorch's AdamW defaults with weight decay 0.01, and clipping to norm 1: what the
    /// training examples use.
    pub const DEFAULT: AdamW = AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        max_norm: 1.0,
    };
}

impl Default for AdamW {
    fn default() -> Self {
        Self::DEFAULT
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
