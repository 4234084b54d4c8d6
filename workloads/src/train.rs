//! The training step of `examples/06-train-step.rs` and `examples/07-dropout-train.rs`: an
//! MLP (GELU after every hidden layer, optional dropout after the first) learns to imitate a
//! random "teacher" MLP of the same shape, with mean squared error, clipping to a global
//! norm and AdamW.
//!
//! One [`Trainer::step`] is
//! * pick mini-batch `step % batches` of the data set (on the device, by the step counter);
//! * forward: cuBLAS GEMMs and bias + GELU kernels that keep the pre-activations, and the
//!   dropout drawn from the trainer's own graph-safe `Generator`;
//! * loss: MSE and its gradient, the loss written to `losses[step]` on the device;
//! * backward: GEMMs for weight and input gradients, column sums for bias gradients, GELU's
//!   and dropout's derivatives;
//! * gradient clipping **without a host sync**: partial sums of squares, then the optimizer
//!   kernel sums them and scales the gradient itself;
//! * AdamW ([`OPTIMIZER`]), its bias correction from the step counter; then `step += 1`.
//!
//! Nothing in a step is a host value that changes, so one captured graph replays every step.
//! [`Problem::host_losses`] runs the same steps on the host in `f64`.

use std::sync::Arc;

use graph_runtime::cudarc::driver::{CudaSlice, CudaStream};
use graph_runtime::{DeviceState, Generator, GraphError, Runtime};
use rand::rngs::SmallRng;

use crate::ops::blas::{matmul, MatMul};
use crate::ops::train::{
    bias_add, bias_gelu_fwd, clip_adamw, col_sum, dropout_bwd, gelu_bwd, mse_loss, select_batch,
    step_increment, sumsq_partials,
};
use crate::reference::{
    counters_for, dropout_mask, forward, AdamW, HostDropout, HostTrainer, ParamLayout,
};
use crate::testing::random_vec;

/// The optimizer of both training examples.
pub const OPTIMIZER: AdamW = AdamW::DEFAULT;

/// Blocks of the gradient-norm reduction: a fixed split, so the sum is always the same.
pub const NORM_BLOCKS: usize = 64;

/// Dropout after the first hidden layer's GELU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutSpec {
    /// The probability of dropping an activation.
    pub p: f32,
    /// The seed of the trainer's generator.
    pub seed: u64,
}

/// What is trained, on what, for how long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainSpec {
    /// Widths of the MLP: inputs, hidden layers, outputs.
    pub dims: &'static [usize],
    /// Rows per step.
    pub batch: usize,
    /// Mini-batches in the data set; step `s` trains on batch `s % batches`.
    pub batches: usize,
    /// Steps per run: the length of the loss curve.
    pub steps: usize,
    /// Dropout, if any.
    pub dropout: Option<DropoutSpec>,
}

impl TrainSpec {
    /// The parameter layout of the MLP.
    pub fn layout(&self) -> ParamLayout {
        ParamLayout::new(self.dims)
    }

    /// The widths as text: `64-256-16`.
    pub fn dims_text(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(ToString::to_string).collect();
        dims.join("-")
    }

    fn inputs(&self) -> usize {
        self.dims[0]
    }

    fn outputs(&self) -> usize {
        self.dims[self.dims.len() - 1]
    }

    /// Elements of the dropout mask of one step (the first hidden layer's activations).
    pub fn mask_len(&self) -> usize {
        self.batch * self.dims[1]
    }
}

/// A training problem on the host: initial weights, and a data set whose targets come from a
/// teacher network of the same shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// What is trained.
    pub spec: TrainSpec,
    /// The initial parameters (in [`ParamLayout`] order).
    pub init: Vec<f32>,
    /// Inputs, `[batches · batch, inputs]`.
    pub xs: Vec<f32>,
    /// Targets, `[batches · batch, outputs]`.
    pub ts: Vec<f32>,
}

/// The data set on the device.
#[derive(Debug, DeviceState)]
pub struct Data {
    /// Inputs, `[batches · batch, inputs]`.
    pub xs: CudaSlice<f32>,
    /// Targets, `[batches · batch, outputs]`.
    pub ts: CudaSlice<f32>,
}

impl Problem {
    /// Initial weights with PyTorch's default initialisation, a teacher with weights four
    /// times as large, inputs uniform in `[-1, 1)` and the teacher's outputs as targets.
    pub fn new(spec: TrainSpec, rng: &mut SmallRng) -> Self {
        let layout = spec.layout();
        let init = layout.init(rng);
        let teacher: Vec<f64> = layout.init(rng).iter().map(|&v| 4.0 * v as f64).collect();
        let rows = spec.batches * spec.batch;
        let xs = random_vec(rng, rows * spec.inputs());
        let ts = forward(&layout, &teacher, &xs, rows, None)
            .out
            .iter()
            .map(|&v| v as f32)
            .collect();
        Problem { spec, init, xs, ts }
    }

    /// The data set, copied to the device.
    pub fn upload(&self, s: &Arc<CudaStream>) -> Result<Data, GraphError> {
        Ok(Data {
            xs: s.clone_htod(&self.xs)?,
            ts: s.clone_htod(&self.ts)?,
        })
    }

    /// A trainer at the initial parameters, moments, counter and losses zero.
    pub fn trainer(&self, rt: &Runtime) -> Result<Trainer, GraphError> {
        Trainer::new(rt, self.spec, &self.init)
    }

    /// The dropout mask the device draws at step `k`, computed on the host from the seed
    /// (each step's draw starts where the previous one stopped).
    pub fn mask(&self, k: usize) -> Option<Vec<u8>> {
        let d = self.spec.dropout?;
        let n = self.spec.mask_len();
        Some(dropout_mask(d.seed, k as u64 * counters_for(n), n, d.p))
    }

    /// The loss of each of the first `steps` steps, trained on the host in `f64` from the
    /// same weights on the same mini-batches (with the masks of [`Problem::mask`]).
    pub fn host_losses(&self, steps: usize) -> Vec<f64> {
        let spec = &self.spec;
        let mut host = HostTrainer::new(spec.layout(), &self.init, OPTIMIZER);
        let (inp, out, b) = (spec.inputs(), spec.outputs(), spec.batch);
        (0..steps)
            .map(|k| {
                let batch = k % spec.batches;
                let drop = self.mask(k).map(|mask| HostDropout {
                    after_layer: 0,
                    mask,
                    keep_prob: 1.0 - spec.dropout.map_or(0.0, |d| d.p),
                });
                let x = &self.xs[batch * b * inp..(batch + 1) * b * inp];
                let t = &self.ts[batch * b * out..(batch + 1) * b * out];
                host.step(x, t, b, drop.as_ref())
            })
            .collect()
    }
}

/// The dropout layer's state: its generator and what it drew.
#[derive(Debug, DeviceState)]
pub struct Dropout {
    /// The probability of dropping an activation.
    pub p: f32,
    /// The generator the masks are drawn from (seed and offset on the device).
    pub rng: Generator,
    /// The activations after dropout.
    pub dropped: CudaSlice<f32>,
    /// The last mask: 1 where an activation was kept.
    pub mask: CudaSlice<u8>,
}

/// Everything a step updates: parameters, gradients and Adam moments (one flat buffer each,
/// in [`ParamLayout`] order), the step counter and the loss curve, and the activations.
#[derive(Debug, DeviceState)]
pub struct Trainer {
    #[device_state(skip)]
    spec: TrainSpec,
    #[device_state(skip)]
    layout: ParamLayout,
    /// Parameters.
    pub params: CudaSlice<f32>,
    grads: CudaSlice<f32>,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    /// The step counter, on the device.
    pub step: CudaSlice<i32>,
    /// The loss of each step.
    pub losses: CudaSlice<f32>,
    partials: CudaSlice<f32>,
    x: CudaSlice<f32>,
    t: CudaSlice<f32>,
    /// Each linear layer's product before its bias.
    h: CudaSlice<f32>,
    /// Pre-activations and activations of the hidden layers.
    z: Vec<CudaSlice<f32>>,
    a: Vec<CudaSlice<f32>>,
    out: CudaSlice<f32>,
    dout: CudaSlice<f32>,
    da: CudaSlice<f32>,
    dz: CudaSlice<f32>,
    /// The dropout layer, if the spec has one.
    pub dropout: Option<Dropout>,
}

/// Which buffer holds the gradient at a layer's output during the backward pass.
#[derive(Clone, Copy)]
enum Grad {
    Out,
    Da,
    Dz,
}

impl Trainer {
    /// Buffers for `spec`, parameters `init`, moments, counter and losses zero.
    pub fn new(rt: &Runtime, spec: TrainSpec, init: &[f32]) -> Result<Self, GraphError> {
        let s = rt.stream();
        let layout = spec.layout();
        assert_eq!(init.len(), layout.len(), "parameters do not fit the layout");
        let n = layout.len();
        let b = spec.batch;
        let hidden = &spec.dims[1..spec.dims.len() - 1];
        let wide = spec.dims[1..].iter().copied().max().unwrap_or(0);
        let zeros = |len: usize| s.alloc_zeros::<f32>(len);
        let dropout = match spec.dropout {
            None => None,
            Some(d) => Some(Dropout {
                p: d.p,
                rng: rt.generator(d.seed)?,
                dropped: zeros(spec.mask_len())?,
                mask: s.alloc_zeros(spec.mask_len())?,
            }),
        };
        Ok(Trainer {
            params: s.clone_htod(init)?,
            grads: zeros(n)?,
            m: zeros(n)?,
            v: zeros(n)?,
            step: s.alloc_zeros(1)?,
            losses: zeros(spec.steps)?,
            partials: zeros(NORM_BLOCKS)?,
            x: zeros(b * spec.inputs())?,
            t: zeros(b * spec.outputs())?,
            h: zeros(b * wide)?,
            z: hidden
                .iter()
                .map(|&w| zeros(b * w))
                .collect::<Result<_, _>>()?,
            a: hidden
                .iter()
                .map(|&w| zeros(b * w))
                .collect::<Result<_, _>>()?,
            out: zeros(b * spec.outputs())?,
            dout: zeros(b * spec.outputs())?,
            da: zeros(b * wide)?,
            dz: zeros(b * wide)?,
            dropout,
            spec,
            layout,
        })
    }

    /// One training step on the runtime's stream (capturable: see the module docs).
    pub fn step(&mut self, rt: &Runtime, data: &Data) -> Result<(), GraphError> {
        let Trainer {
            spec,
            layout,
            params,
            grads,
            m,
            v,
            step,
            losses,
            partials,
            x,
            t,
            h,
            z,
            a,
            out,
            dout,
            da,
            dz,
            dropout,
        } = self;
        let (b, layers) = (spec.batch, layout.layers());
        let (inp, n_out) = (spec.inputs(), spec.outputs());
        select_batch(
            rt,
            &data.xs,
            &data.ts,
            step,
            x,
            t,
            spec.batches,
            b * inp,
            b * n_out,
        )?;

        // Forward. Each layer: h = input · Wᵀ (cuBLAS), then bias + GELU (hidden) or bias.
        for l in 0..layers {
            let (i, o) = layout.shape(l);
            let (w, bias) = (params.slice(layout.w(l)), params.slice(layout.b(l)));
            matmul(
                rt,
                layer_input(l, x, a, dropout),
                &w,
                h,
                MatMul::nt(b, o, i),
            )?;
            if l + 1 == layers {
                bias_add(rt, h, &bias, out, b, o)?;
                break;
            }
            bias_gelu_fwd(rt, h, &bias, &mut z[l], &mut a[l], b, o)?;
            if let (0, Some(d)) = (l, dropout.as_mut()) {
                // Keeps each activation with probability 1 - p (scaled by 1 / (1 - p)) and
                // records which it kept; the generator's offset moves on inside the kernel.
                d.rng.dropout(rt, &a[0], &mut d.dropped, &mut d.mask, d.p)?;
            }
        }

        // Loss: losses[*step] = mean((y - t)²), dout = 2 (y - t) / n.
        mse_loss(rt, out, t, dout, losses, step, b * n_out)?;

        // Backward, last layer first: dW = gᵀ · input, db = column sums of g, da = g · W, and
        // through dropout and GELU to the previous layer's g (in `dz`, or in `da` behind the
        // dropout).
        let mut g = Grad::Out;
        for l in (0..layers).rev() {
            let (i, o) = layout.shape(l);
            let (wr, br) = (layout.w(l), layout.b(l));
            let gl = match g {
                Grad::Out => &*dout,
                Grad::Da => &*da,
                Grad::Dz => &*dz,
            };
            let input = layer_input(l, x, a, dropout);
            matmul(
                rt,
                gl,
                input,
                &mut grads.slice_mut(wr.clone()),
                MatMul::tn(o, i, b),
            )?;
            col_sum(rt, gl, &mut grads.slice_mut(br), b, o)?;
            if l == 0 {
                break;
            }
            let gl = match g {
                Grad::Out => &*dout,
                Grad::Dz => &*dz,
                Grad::Da => unreachable!("only the first hidden layer has dropout"),
            };
            matmul(rt, gl, &params.slice(wr), da, MatMul::nn(b, i, o))?;
            g = match (l, dropout.as_ref()) {
                (1, Some(d)) => {
                    dropout_bwd(rt, da, &d.mask, dz, 1.0 - d.p, b * i)?;
                    gelu_bwd(rt, dz, &z[0], da, b * i)?;
                    Grad::Da
                }
                _ => {
                    gelu_bwd(rt, da, &z[l - 1], dz, b * i)?;
                    Grad::Dz
                }
            };
        }

        // Clip by global norm and AdamW, on the device; then the counter moves on, after
        // every kernel that read it.
        let n = layout.len();
        sumsq_partials(rt, grads, partials, n)?;
        clip_adamw(rt, params, grads, m, v, partials, step, &OPTIMIZER, n)?;
        step_increment(rt, step)
    }
}

/// The input of linear layer `l`: the mini-batch, or the previous layer's activations (after
/// the dropout, behind the first hidden layer).
fn layer_input<'a>(
    l: usize,
    x: &'a CudaSlice<f32>,
    a: &'a [CudaSlice<f32>],
    dropout: &'a Option<Dropout>,
) -> &'a CudaSlice<f32> {
    match (l, dropout) {
        (0, _) => x,
        (1, Some(d)) => &d.dropped,
        _ => &a[l - 1],
    }
}
