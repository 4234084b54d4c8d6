//! # 07 — dropout in a captured training step
//!
//! The model: 64 → 256 (GELU, then dropout p = 0.2) → 16, MSE, clipping and AdamW as in
//! `06-train-step`. Dropout draws its mask from a `graph_runtime::Generator`: its seed and
//! offset live on the device and the dropout kernel moves the offset on by itself, so every
//! replay of the graph draws a fresh mask with no registration step (see
//! `graph_runtime::rng`).
//!
//! Eager and graphed training each get their own generator made from the same seed. The
//! capture's warmup draws from the graph's generator, and the runtime puts every generator
//! back afterwards (the rng module's warmup policy): the example checks that the graph's
//! generator is back at offset 0 after the capture, then trains 50 steps each way and checks
//!
//! * the loss curves and the last dropout masks are equal bit for bit;
//! * every eager loss matches the f64 host reference fed with the masks the host computes
//!   from the same seed (`graph_runtime::rng::reference_uniform`), and the last eager mask
//!   is that host mask exactly.
//!
//! Run: `cargo run --release --example 07-dropout-train` (`-- --json` for machine-readable
//! lines).

use std::sync::Arc;

use cuda_graphs::bench::blas::{matmul, MatMul};
use cuda_graphs::bench::json::Record;
use cuda_graphs::bench::reference::{
    counters_for, dropout_mask, forward, AdamW, HostDropout, HostTrainer, ParamLayout,
};
use cuda_graphs::bench::table::{times, us, Table};
use cuda_graphs::bench::{first_mismatch, wall_us, Cli};
use cuda_graphs::kernels::TRAIN;
use cuda_graphs::testing::{random_vec, runtime_or_skip, seeded_rng};
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, BoxError, Generator, GraphError, Runtime};

const DIMS: [usize; 3] = [64, 256, 16];
const BATCH: usize = 32;
const BATCHES: usize = 8;
const STEPS: usize = 50;
const P: f32 = 0.2;
const SEED: u64 = 2026;
const NORM_BLOCKS: usize = 64;
const OPT: AdamW = AdamW {
    lr: 1e-3,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.01,
    max_norm: 1.0,
};
const CPU_TOLERANCE: f64 = 1e-3;

struct Data {
    xs: CudaSlice<f32>,
    ts: CudaSlice<f32>,
}

/// Parameters, optimizer state, counter, losses, activations and the generator the
/// dropout draws from.
struct Trainer {
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
    z: CudaSlice<f32>,
    a: CudaSlice<f32>,
    dropped: CudaSlice<f32>,
    mask: CudaSlice<u8>,
    out: CudaSlice<f32>,
    dout: CudaSlice<f32>,
    da: CudaSlice<f32>,
    dz: CudaSlice<f32>,
    rng: Generator,
}

impl Trainer {
    fn new(rt: &Runtime, init: &[f32]) -> Result<Self, GraphError> {
        let s: &Arc<CudaStream> = rt.stream();
        let n = init.len();
        let [inp, hid, out] = DIMS;
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
            h: s.alloc_zeros(BATCH * hid)?,
            z: s.alloc_zeros(BATCH * hid)?,
            a: s.alloc_zeros(BATCH * hid)?,
            dropped: s.alloc_zeros(BATCH * hid)?,
            mask: s.alloc_zeros(BATCH * hid)?,
            out: s.alloc_zeros(BATCH * out)?,
            dout: s.alloc_zeros(BATCH * out)?,
            da: s.alloc_zeros(BATCH * hid)?,
            dz: s.alloc_zeros(BATCH * hid)?,
            // 1. Each trainer has its own generator, both from SEED.
            rng: rt.generator(SEED)?,
        })
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

// 2. The step: as in 06 with one hidden layer, and `Generator::dropout` after its GELU.
#[cuda_graph(warmup = 2)]
fn dropout_step(
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
    let (gelu_bwd, col_sum, dropout_bwd, sumsq, adamw, inc) = (
        k("gelu_bwd")?,
        k("col_sum")?,
        k("dropout_bwd")?,
        k("sumsq_partials")?,
        k("clip_adamw")?,
        k("step_increment")?,
    );
    let [inp, hid, out] = DIMS;
    let b = BATCH;
    let i32s = |v: usize| v as i32;
    let l = ParamLayout::new(&DIMS);
    let keep = 1.0 - P;
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
        z,
        a,
        dropped,
        mask,
        out: y,
        dout,
        da,
        dz,
        rng,
    } = tr;

    // SAFETY: as in 06: one mini-batch of inputs and targets into `x` and `t`.
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
    matmul(
        rt,
        &*x,
        &params.slice(l.w(0)),
        &mut *h,
        MatMul::nt(b, hid, inp),
    )?;
    // SAFETY: b·hid elements of `h`, `z`, `a`; hid of the bias.
    unsafe {
        s.launch_builder(&bias_gelu)
            .arg(&*h)
            .arg(&params.slice(l.b(0)))
            .arg(&mut *z)
            .arg(&mut *a)
            .arg(&i32s(b))
            .arg(&i32s(hid))
            .launch(elems(b * hid))?;
    }
    // 3. Dropout: keeps each activation with probability 1 - P (scaled by 1 / (1 - P)) and
    //    records which it kept. The generator's offset moves on inside the kernel.
    rng.dropout(rt, &*a, &mut *dropped, &mut *mask, P)?;
    matmul(
        rt,
        &*dropped,
        &params.slice(l.w(1)),
        &mut *h,
        MatMul::nt(b, out, hid),
    )?;
    // SAFETY: b·out elements of `h` and `y`; out of the bias.
    unsafe {
        s.launch_builder(&bias_add)
            .arg(&*h)
            .arg(&params.slice(l.b(1)))
            .arg(&mut *y)
            .arg(&i32s(b))
            .arg(&i32s(out))
            .launch(elems(b * out))?;
    }
    // SAFETY: b·out elements; losses[*step] only while *step < STEPS.
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

    // Backward.
    matmul(
        rt,
        &*dout,
        &*dropped,
        &mut grads.slice_mut(l.w(1)),
        MatMul::tn(out, hid, b),
    )?;
    // SAFETY: reads b·out of `dout`, writes out bias gradients.
    unsafe {
        s.launch_builder(&col_sum)
            .arg(&*dout)
            .arg(&mut grads.slice_mut(l.b(1)))
            .arg(&i32s(b))
            .arg(&i32s(out))
            .launch(elems(out))?;
    }
    matmul(
        rt,
        &*dout,
        &params.slice(l.w(1)),
        &mut *da,
        MatMul::nn(b, hid, out),
    )?;
    // SAFETY: b·hid elements of `da`, `mask` and `dz` (the dropout gradient goes to `dz`,
    // then GELU's back to `da`).
    unsafe {
        s.launch_builder(&dropout_bwd)
            .arg(&*da)
            .arg(&*mask)
            .arg(&mut *dz)
            .arg(&keep)
            .arg(&i32s(b * hid))
            .launch(elems(b * hid))?;
        s.launch_builder(&gelu_bwd)
            .arg(&*dz)
            .arg(&*z)
            .arg(&mut *da)
            .arg(&i32s(b * hid))
            .launch(elems(b * hid))?;
    }
    matmul(
        rt,
        &*da,
        &*x,
        &mut grads.slice_mut(l.w(0)),
        MatMul::tn(hid, inp, b),
    )?;
    // SAFETY: reads b·hid of `da`, writes hid bias gradients.
    unsafe {
        s.launch_builder(&col_sum)
            .arg(&*da)
            .arg(&mut grads.slice_mut(l.b(0)))
            .arg(&i32s(b))
            .arg(&i32s(hid))
            .launch(elems(hid))?;
    }

    let n = i32s(l.len());
    let o = OPT;
    // SAFETY: as in 06: NORM_BLOCKS partials of the n gradients, then the optimizer over
    // the n elements of each buffer, then the counter.
    unsafe {
        s.launch_builder(&sumsq)
            .arg(&*grads)
            .arg(&mut *partials)
            .arg(&n)
            .launch(blocks(NORM_BLOCKS, 256))?;
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
        s.launch_builder(&inc)
            .arg(&mut *step)
            .launch(blocks(1, 32))?;
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let cli = Cli::from_env();
    let Some(rt) = runtime_or_skip("07-dropout-train") else {
        return Ok(());
    };
    let s = rt.stream().clone();
    let layout = ParamLayout::new(&DIMS);
    let [inp, hid, out] = DIMS;

    let mut rng = seeded_rng(7);
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

    // 4. Eager: 50 steps.
    let mut eager = Trainer::new(&rt, &init)?;
    for _ in 0..STEPS {
        dropout_step(&rt, &data, &mut eager)?;
    }
    let eager_losses = s.clone_dtoh(&eager.losses)?;
    let eager_mask = s.clone_dtoh(&eager.mask)?;

    // 5. Graph: capture (two warmup steps draw from the graph's generator; the runtime
    //    restores it), check the generator is back at the seed's start, restart the
    //    weights, then 50 launches.
    let mut graphed = Trainer::new(&rt, &init)?;
    let mut graph = DropoutStepGraph::capture(&rt, &data, &mut graphed)?;
    let nodes = graph.info().kinds.kernels;
    let after_capture = graph.state_mut().tr.rng.state(&rt)?;
    {
        let tr = graph.state_mut().tr;
        s.memcpy_htod(&init, &mut tr.params)?;
        s.memset_zeros(&mut tr.m)?;
        s.memset_zeros(&mut tr.v)?;
        s.memset_zeros(&mut tr.step)?;
        s.memset_zeros(&mut tr.losses)?;
    }
    for _ in 0..STEPS {
        graph.launch()?;
    }
    let graph_losses = s.clone_dtoh(&graph.state_mut().tr.losses)?;
    let graph_mask = s.clone_dtoh(&graph.state_mut().tr.mask)?;
    let graph_rng = graph.state_mut().tr.rng.state(&rt)?;
    let eager_rng = eager.rng.state(&rt)?;

    // 6. The host reference with the masks computed on the host from the same seed.
    let per_step = counters_for(BATCH * hid);
    let mut host = HostTrainer::new(layout.clone(), &init, OPT);
    let mut cpu_err = 0.0f64;
    let mut host_mask = Vec::new();
    for (k, &got) in eager_losses.iter().enumerate() {
        let batch = k % BATCHES;
        host_mask = dropout_mask(SEED, k as u64 * per_step, BATCH * hid, P);
        let drop = HostDropout {
            after_layer: 0,
            mask: host_mask.clone(),
            keep_prob: 1.0 - P,
        };
        let xr = &host_xs[batch * BATCH * inp..(batch + 1) * BATCH * inp];
        let tr = &host_ts[batch * BATCH * out..(batch + 1) * BATCH * out];
        let want = host.step(xr, tr, BATCH, Some(&drop));
        cpu_err = cpu_err.max((got as f64 - want).abs() / want.abs().max(1e-12));
    }
    let kept = eager_mask.iter().filter(|&&m| m == 1).count() as f64 / eager_mask.len() as f64;

    // 7. Step times.
    let eager_us = wall_us(&s, 200, || dropout_step(&rt, &data, &mut eager))?;
    let graph_us = wall_us(&s, 200, || graph.launch().map(|_| ()))?;

    let device = rt.context().name().unwrap_or_default();
    println!(
        "training with dropout p = {P}, MLP {DIMS:?}, batch {BATCH}, seed {SEED}, on {device}\n"
    );
    let mut curve = Table::new(&[">step", ">eager loss", ">graph loss"]);
    for k in [0, 1, 2, 9, 24, STEPS - 1] {
        curve.row(vec![
            (k + 1).to_string(),
            format!("{:.6}", eager_losses[k]),
            format!("{:.6}", graph_losses[k]),
        ]);
    }
    print!("{}", curve.to_markdown());
    println!();
    let mut t = Table::new(&["loop", ">kernels in graph", ">µs per step", ">speedup"]);
    t.row(vec![
        "eager".into(),
        "–".into(),
        us(eager_us),
        "1.00×".into(),
    ]);
    t.row(vec![
        "graph".into(),
        nodes.to_string(),
        us(graph_us),
        times(eager_us / graph_us),
    ]);
    print!("{}", t.to_markdown());
    println!("\ngraph generator after capture (seed, offset): {after_capture:?}; after {STEPS} steps: eager {eager_rng:?}, graph {graph_rng:?}");
    println!("last mask keeps {:.1}% (expected {:.0}%); eager losses vs f64 host with host-drawn masks: max relative error {cpu_err:.1e}", 100.0 * kept, 100.0 * (1.0 - P));

    let losses_equal = first_mismatch(&eager_losses, &graph_losses);
    let masks_equal = eager_mask == graph_mask;
    let host_mask_equal = eager_mask == host_mask;
    let restored = after_capture == (SEED, 0);
    // Each step draws one mask: both generators moved on by STEPS draws, on the device.
    let moved = eager_rng == (SEED, STEPS as u64 * per_step) && graph_rng == eager_rng;
    let agree = losses_equal.is_none()
        && masks_equal
        && host_mask_equal
        && restored
        && moved
        && cpu_err < CPU_TOLERANCE;
    if cli.json {
        let rec = Record::new("dropout_train", "ours")
            .set("batch", BATCH)
            .set("dims", "64-256-16")
            .set("p", P as f64)
            .set("steps", STEPS)
            .set("kernels", nodes)
            .set("eager_us", eager_us)
            .set("graph_us", graph_us)
            .set("check", "50-step loss curve and last mask bitwise, eager vs graph; losses and mask vs host with host-drawn masks")
            .set("agree", agree)
            .set("cpu_max_rel_err", cpu_err);
        println!("{}", rec.line());
    }

    if !restored {
        return Err(format!(
            "the graph's generator is at {after_capture:?} after the capture, not at (seed {SEED}, offset 0): the warmup's draws were not undone"
        )
        .into());
    }
    if !moved {
        return Err(format!(
            "after {STEPS} steps the generators are at eager {eager_rng:?}, graph {graph_rng:?}; expected offset {}",
            STEPS as u64 * per_step
        )
        .into());
    }
    if let Some(d) = losses_equal {
        return Err(format!(
            "loss curves differ first at step {}: eager {} graph {}",
            d.index + 1,
            d.a,
            d.b
        )
        .into());
    }
    if !masks_equal {
        return Err("the last dropout masks of eager and graph differ".into());
    }
    if !host_mask_equal {
        return Err("the last eager dropout mask differs from the one computed on the host".into());
    }
    if cpu_err >= CPU_TOLERANCE {
        return Err(format!("eager losses are off the host reference by {cpu_err:.1e}").into());
    }
    println!("eager and graph drew the same masks and produced bitwise identical losses");
    Ok(())
}
