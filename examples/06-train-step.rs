//! # 06 — a whole training step as one graph
//!
//! An MLP 64 → 256 → 256 → 16 (GELU between layers) learns to imitate a random "teacher"
//! MLP of the same shape, batch 32, mean squared error. One training step is
//!
//! * pick mini-batch `step % 8` of the data set (on the device, by the step counter);
//! * forward: cuBLAS GEMMs and bias + GELU kernels that keep the pre-activations;
//! * loss: MSE and its gradient, the loss written to `losses[step]` on the device;
//! * backward: GEMMs for weight and input gradients, column sums for bias gradients,
//!   GELU's derivative;
//! * gradient clipping to a global norm of 1 **without a host sync**: partial sums of
//!   squares, then the optimizer kernel sums them and scales the gradient itself;
//! * AdamW, its bias correction from the step counter on the device; then `step += 1`.
//!
//! Nothing in the step is a host value that changes, so one graph replays every step.
//! 200 eager steps and 200 graphed steps from the same initial weights give loss curves
//! that are equal bit for bit (and so are the final weights); the first 10 losses are also
//! checked against the f64 host reference of the same step.
//!
//! Run: `cargo run --release --example 06-train-step` (`-- --json` for machine-readable
//! lines).

use std::sync::Arc;

use cuda_graphs::bench::blas::{matmul, MatMul};
use cuda_graphs::bench::json::Record;
use cuda_graphs::bench::reference::{forward, AdamW, HostTrainer, ParamLayout};
use cuda_graphs::bench::table::{times, us, Table};
use cuda_graphs::bench::{first_mismatch, gpu_us, wall_us, Cli};
use cuda_graphs::kernels::TRAIN;
use cuda_graphs::testing::{random_vec, runtime_or_skip, seeded_rng};
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime};

const DIMS: [usize; 4] = [64, 256, 256, 16];
const BATCH: usize = 32;
/// Mini-batches in the data set; step `s` trains on batch `s % BATCHES`.
const BATCHES: usize = 8;
const STEPS: usize = 200;
/// Blocks of the gradient-norm reduction: a fixed split, so the sum is always the same.
const NORM_BLOCKS: usize = 64;
const OPT: AdamW = AdamW {
    lr: 1e-3,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.01,
    max_norm: 1.0,
};
/// Losses checked against the host reference, and the tolerance.
const CPU_STEPS: usize = 10;
const CPU_TOLERANCE: f64 = 1e-3;

/// The data set on the device: inputs `[BATCHES · BATCH, 64]`, targets `[BATCHES · BATCH, 16]`.
struct Data {
    xs: CudaSlice<f32>,
    ts: CudaSlice<f32>,
}

/// Everything a step updates: parameters, gradients and Adam moments (one flat buffer
/// each, in `ParamLayout` order), the step counter and the loss curve, and activations.
struct Trainer {
    layout: ParamLayout,
    params: CudaSlice<f32>,
    grads: CudaSlice<f32>,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    step: CudaSlice<i32>,
    losses: CudaSlice<f32>,
    partials: CudaSlice<f32>,
    x: CudaSlice<f32>,
    t: CudaSlice<f32>,
    h: CudaSlice<f32>,
    z1: CudaSlice<f32>,
    a1: CudaSlice<f32>,
    z2: CudaSlice<f32>,
    a2: CudaSlice<f32>,
    out: CudaSlice<f32>,
    dout: CudaSlice<f32>,
    da: CudaSlice<f32>,
    dz: CudaSlice<f32>,
}

impl Trainer {
    fn new(s: &Arc<CudaStream>, init: &[f32]) -> Result<Self, GraphError> {
        let layout = ParamLayout::new(&DIMS);
        let n = layout.len();
        let [inp, h1, h2, out] = DIMS;
        let wide = h1.max(h2);
        Ok(Trainer {
            params: s.clone_htod(init)?,
            grads: s.alloc_zeros(n)?,
            m: s.alloc_zeros(n)?,
            v: s.alloc_zeros(n)?,
            step: s.alloc_zeros(1)?,
            losses: s.alloc_zeros(STEPS)?,
            partials: s.alloc_zeros(NORM_BLOCKS)?,
            x: s.alloc_zeros(BATCH * inp)?,
            t: s.alloc_zeros(BATCH * out)?,
            h: s.alloc_zeros(BATCH * wide)?,
            z1: s.alloc_zeros(BATCH * h1)?,
            a1: s.alloc_zeros(BATCH * h1)?,
            z2: s.alloc_zeros(BATCH * h2)?,
            a2: s.alloc_zeros(BATCH * h2)?,
            out: s.alloc_zeros(BATCH * out)?,
            dout: s.alloc_zeros(BATCH * out)?,
            da: s.alloc_zeros(BATCH * wide)?,
            dz: s.alloc_zeros(BATCH * wide)?,
            layout,
        })
    }

    /// Back to step 0 with weights `init` (host side, between runs).
    fn restart(&mut self, s: &Arc<CudaStream>, init: &[f32]) -> Result<(), GraphError> {
        s.memcpy_htod(init, &mut self.params)?;
        s.memset_zeros(&mut self.m)?;
        s.memset_zeros(&mut self.v)?;
        s.memset_zeros(&mut self.step)?;
        s.memset_zeros(&mut self.losses)?;
        Ok(())
    }
}

fn elems(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

fn blocks(grid: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

// 1. The training step. `tr` is mutable state: the graph updates the weights, moments and
//    counter in place, and reads the counter on the device, so each replay is the next step.
#[cuda_graph(warmup = 2)]
fn train_step(
    rt: &Runtime,
    #[state] data: &Data,
    #[state] tr: &mut Trainer,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let k = |name: &str| rt.function(TRAIN, name);
    let (select, bias_gelu, bias_add, mse) = (
        k("select_batch")?,
        k("bias_gelu_fwd")?,
        k("bias_add")?,
        k("mse_loss")?,
    );
    let (gelu_bwd, col_sum, sumsq, adamw, inc) = (
        k("gelu_bwd")?,
        k("col_sum")?,
        k("sumsq_partials")?,
        k("clip_adamw")?,
        k("step_increment")?,
    );
    let [inp, h1, h2, out] = DIMS;
    let b = BATCH;
    let i32s = |v: usize| v as i32;
    let l = tr.layout.clone();
    let Trainer {
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
        z1,
        a1,
        z2,
        a2,
        out: y,
        dout,
        da,
        dz,
        ..
    } = tr;

    // Mini-batch `step % BATCHES`.
    // SAFETY: copies b·inp inputs and b·out targets of batch (*step % BATCHES), inside the
    // BATCHES·b rows of `xs` and `ts`, into `x` and `t`, which hold exactly that.
    unsafe {
        s.launch_builder(&select)
            .arg(&data.xs)
            .arg(&data.ts)
            .arg(&*step)
            .arg(&mut *x)
            .arg(&mut *t)
            .arg(&i32s(BATCHES))
            .arg(&i32s(b * inp))
            .arg(&i32s(b * out))
            .launch(elems(b * inp.max(out)))?;
    }

    // Forward. Each hidden layer: h = a · Wᵀ (cuBLAS), z = h + bias, a' = gelu(z).
    matmul(
        rt,
        &*x,
        &params.slice(l.w(0)),
        &mut *h,
        MatMul::nt(b, h1, inp),
    )?;
    // SAFETY: reads b·h1 of `h` and h1 of the bias, writes b·h1 of `z1` and `a1`.
    unsafe {
        s.launch_builder(&bias_gelu)
            .arg(&*h)
            .arg(&params.slice(l.b(0)))
            .arg(&mut *z1)
            .arg(&mut *a1)
            .arg(&i32s(b))
            .arg(&i32s(h1))
            .launch(elems(b * h1))?;
    }
    matmul(
        rt,
        &*a1,
        &params.slice(l.w(1)),
        &mut *h,
        MatMul::nt(b, h2, h1),
    )?;
    // SAFETY: as above with h2.
    unsafe {
        s.launch_builder(&bias_gelu)
            .arg(&*h)
            .arg(&params.slice(l.b(1)))
            .arg(&mut *z2)
            .arg(&mut *a2)
            .arg(&i32s(b))
            .arg(&i32s(h2))
            .launch(elems(b * h2))?;
    }
    matmul(
        rt,
        &*a2,
        &params.slice(l.w(2)),
        &mut *h,
        MatMul::nt(b, out, h2),
    )?;
    // SAFETY: reads b·out of `h` and out of the bias, writes b·out of `y`.
    unsafe {
        s.launch_builder(&bias_add)
            .arg(&*h)
            .arg(&params.slice(l.b(2)))
            .arg(&mut *y)
            .arg(&i32s(b))
            .arg(&i32s(out))
            .launch(elems(b * out))?;
    }

    // Loss: one block; losses[*step] = mean((y - t)²), dout = 2 (y - t) / n.
    // SAFETY: reads and writes b·out floats of `y`, `t` and `dout`; writes losses[*step]
    // only while *step < STEPS, the buffer's length.
    unsafe {
        s.launch_builder(&mse)
            .arg(&*y)
            .arg(&*t)
            .arg(&mut *dout)
            .arg(&mut *losses)
            .arg(&*step)
            .arg(&i32s(b * out))
            .arg(&i32s(STEPS))
            .launch(blocks(1, 1024))?;
    }

    // Backward, last layer first: dW = dzᵀ · a, db = column sums of dz, da = dz · W, and
    // through GELU: dz' = da · gelu'(z).
    matmul(
        rt,
        &*dout,
        &*a2,
        &mut grads.slice_mut(l.w(2)),
        MatMul::tn(out, h2, b),
    )?;
    // SAFETY: reads b·out of `dout`, writes `out` bias gradients.
    unsafe {
        s.launch_builder(&col_sum)
            .arg(&*dout)
            .arg(&mut grads.slice_mut(l.b(2)))
            .arg(&i32s(b))
            .arg(&i32s(out))
            .launch(elems(out))?;
    }
    matmul(
        rt,
        &*dout,
        &params.slice(l.w(2)),
        &mut *da,
        MatMul::nn(b, h2, out),
    )?;
    // SAFETY: b·h2 elements of `da`, `z2` and `dz`, which hold at least that.
    unsafe {
        s.launch_builder(&gelu_bwd)
            .arg(&*da)
            .arg(&*z2)
            .arg(&mut *dz)
            .arg(&i32s(b * h2))
            .launch(elems(b * h2))?;
    }
    matmul(
        rt,
        &*dz,
        &*a1,
        &mut grads.slice_mut(l.w(1)),
        MatMul::tn(h2, h1, b),
    )?;
    // SAFETY: reads b·h2 of `dz`, writes h2 bias gradients.
    unsafe {
        s.launch_builder(&col_sum)
            .arg(&*dz)
            .arg(&mut grads.slice_mut(l.b(1)))
            .arg(&i32s(b))
            .arg(&i32s(h2))
            .launch(elems(h2))?;
    }
    matmul(
        rt,
        &*dz,
        &params.slice(l.w(1)),
        &mut *da,
        MatMul::nn(b, h1, h2),
    )?;
    // SAFETY: b·h1 elements of `da`, `z1` and `dz`.
    unsafe {
        s.launch_builder(&gelu_bwd)
            .arg(&*da)
            .arg(&*z1)
            .arg(&mut *dz)
            .arg(&i32s(b * h1))
            .launch(elems(b * h1))?;
    }
    matmul(
        rt,
        &*dz,
        &*x,
        &mut grads.slice_mut(l.w(0)),
        MatMul::tn(h1, inp, b),
    )?;
    // SAFETY: reads b·h1 of `dz`, writes h1 bias gradients.
    unsafe {
        s.launch_builder(&col_sum)
            .arg(&*dz)
            .arg(&mut grads.slice_mut(l.b(0)))
            .arg(&i32s(b))
            .arg(&i32s(h1))
            .launch(elems(h1))?;
    }

    // Clip by global norm and AdamW, on the device: partial sums of squares, then the
    // optimizer kernel adds them up (same order in every block) and scales the gradient.
    let n = i32s(l.len());
    // SAFETY: NORM_BLOCKS blocks read the n gradients (grid-stride) and write one partial
    // each into `partials`, which holds NORM_BLOCKS.
    unsafe {
        s.launch_builder(&sumsq)
            .arg(&*grads)
            .arg(&mut *partials)
            .arg(&n)
            .launch(blocks(NORM_BLOCKS, 256))?;
    }
    let o = OPT;
    // SAFETY: grid-stride over the n elements of `params`, `grads`, `m`, `v` (all n long);
    // reads NORM_BLOCKS partials and the step counter.
    unsafe {
        s.launch_builder(&adamw)
            .arg(&mut *params)
            .arg(&*grads)
            .arg(&mut *m)
            .arg(&mut *v)
            .arg(&*partials)
            .arg(&i32s(NORM_BLOCKS))
            .arg(&*step)
            .arg(&o.lr)
            .arg(&o.beta1)
            .arg(&o.beta2)
            .arg(&o.eps)
            .arg(&o.weight_decay)
            .arg(&o.max_norm)
            .arg(&n)
            .launch(blocks(l.len().div_ceil(256).min(256), 256))?;
        // 2. Last: the step counter moves on, after every kernel that read it.
        s.launch_builder(&inc)
            .arg(&mut *step)
            .launch(blocks(1, 32))?;
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let cli = Cli::from_env();
    let Some(rt) = runtime_or_skip("06-train-step") else {
        return Ok(());
    };
    let s = rt.stream().clone();
    let layout = ParamLayout::new(&DIMS);
    let [inp, _, _, out] = DIMS;

    // 3. Initial weights, a data set and its targets from a teacher network.
    let mut rng = seeded_rng(6);
    let init = layout.init(&mut rng);
    let teacher: Vec<f64> = layout
        .init(&mut rng)
        .iter()
        .map(|&v| 4.0 * v as f64)
        .collect();
    let host_xs = random_vec(&mut rng, BATCHES * BATCH * inp);
    let host_ts: Vec<f32> = forward(&layout, &teacher, &host_xs, BATCHES * BATCH, None)
        .out
        .iter()
        .map(|&v| v as f32)
        .collect();
    let data = Data {
        xs: s.clone_htod(&host_xs)?,
        ts: s.clone_htod(&host_ts)?,
    };

    // 4. 200 eager steps: the function called directly, one synchronize at the end.
    let mut eager = Trainer::new(&s, &init)?;
    for _ in 0..STEPS {
        train_step(&rt, &data, &mut eager)?;
    }
    let eager_losses = s.clone_dtoh(&eager.losses)?;
    let eager_params = s.clone_dtoh(&eager.params)?;

    // 5. 200 graphed steps from the same weights. The warmup trained two steps on the
    //    graph's state, so restart it after the capture; then one launch per step.
    let mut graphed = Trainer::new(&s, &init)?;
    let mut graph = TrainStepGraph::capture(&rt, &data, &mut graphed)?;
    let nodes = graph.info().kinds.kernels;
    graph.state_mut().tr.restart(&s, &init)?;
    for _ in 0..STEPS {
        graph.launch()?;
    }
    let graph_losses = s.clone_dtoh(&graph.state_mut().tr.losses)?;
    let graph_params = s.clone_dtoh(&graph.state_mut().tr.params)?;

    // 6. Bit for bit: the loss curves and the final weights.
    let loss_diff = first_mismatch(&eager_losses, &graph_losses);
    let param_diff = first_mismatch(&eager_params, &graph_params);

    // 7. The eager curve against the host reference for the first steps.
    let mut host = HostTrainer::new(layout.clone(), &init, OPT);
    let mut cpu_err = 0.0f64;
    for (k, &got) in eager_losses.iter().enumerate().take(CPU_STEPS) {
        let batch = k % BATCHES;
        let xr = &host_xs[batch * BATCH * inp..(batch + 1) * BATCH * inp];
        let tr = &host_ts[batch * BATCH * out..(batch + 1) * BATCH * out];
        let want = host.step(xr, tr, BATCH, None);
        cpu_err = cpu_err.max((got as f64 - want).abs() / want.abs().max(1e-12));
    }

    // 8. Step time: more steps of both (the curves are already read).
    let iters = 200;
    let eager_us = wall_us(&s, iters, || train_step(&rt, &data, &mut eager))?;
    let graph_us = wall_us(&s, iters, || graph.launch().map(|_| ()))?;
    let eager_gpu_us = gpu_us(&s, iters, || train_step(&rt, &data, &mut eager))?;
    let graph_gpu_us = gpu_us(&s, iters, || graph.launch().map(|_| ()))?;

    let device = rt.context().name().unwrap_or_default();
    println!(
        "training step of an MLP {DIMS:?}, batch {BATCH}, MSE, clip 1.0, AdamW, on {device}\n"
    );
    let mut curve = Table::new(&[">step", ">eager loss", ">graph loss"]);
    for k in [0, 1, 9, 49, 99, 149, STEPS - 1] {
        curve.row(vec![
            (k + 1).to_string(),
            format!("{:.6}", eager_losses[k]),
            format!("{:.6}", graph_losses[k]),
        ]);
    }
    print!("{}", curve.to_markdown());
    println!();
    let mut t = Table::new(&[
        "loop",
        ">kernels in graph",
        ">µs per step",
        ">GPU µs per step",
        ">speedup",
    ]);
    t.row(vec![
        "eager".into(),
        "–".into(),
        us(eager_us),
        us(eager_gpu_us),
        "1.00×".into(),
    ]);
    t.row(vec![
        "graph".into(),
        nodes.to_string(),
        us(graph_us),
        us(graph_gpu_us),
        times(eager_us / graph_us),
    ]);
    print!("{}", t.to_markdown());
    println!("\nfirst {CPU_STEPS} eager losses vs f64 host: max relative error {cpu_err:.1e}");
    let identical = loss_diff.is_none() && param_diff.is_none();
    if cli.json {
        let rec = Record::new("train", "ours")
            .set("batch", BATCH)
            .set("dims", "64-256-256-16")
            .set("steps", STEPS)
            .set("kernels", nodes)
            .set("eager_us", eager_us)
            .set("graph_us", graph_us)
            .set("eager_gpu_us", eager_gpu_us)
            .set("graph_gpu_us", graph_gpu_us)
            .set("loss_first", eager_losses[0] as f64)
            .set("loss_last", eager_losses[STEPS - 1] as f64)
            .set("check", "200-step loss curve and final weights bitwise, eager vs graph; 10 losses vs f64 host")
            .set("agree", identical && cpu_err < CPU_TOLERANCE)
            .set("cpu_max_rel_err", cpu_err);
        println!("{}", rec.line());
    }

    if let Some(d) = loss_diff {
        return Err(format!(
            "loss curves differ first at step {}: eager {} graph {}",
            d.index + 1,
            d.a,
            d.b
        )
        .into());
    }
    if let Some(d) = param_diff {
        return Err(format!(
            "final weights differ first at parameter {}: eager {} graph {}",
            d.index, d.a, d.b
        )
        .into());
    }
    if cpu_err >= CPU_TOLERANCE {
        return Err(format!("eager losses are off the host reference by {cpu_err:.1e}").into());
    }
    println!(
        "the {STEPS}-step loss curves and final weights of eager and graph are bitwise identical"
    );
    Ok(())
}
