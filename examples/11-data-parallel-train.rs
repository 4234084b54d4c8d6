//! # 11 — a data-parallel training step on two GPUs, one graph per rank
//!
//! An MLP 64 → 256 → 256 → 16 (GELU) learns to imitate a fixed random "teacher" MLP, mean
//! squared error, AdamW, gradients clipped to a global norm of 1. Each rank holds the whole
//! model and trains on its half of every mini-batch; one step is
//!
//! * pick this rank's rows of mini-batch `step % 8` (on the device, by the step counter);
//! * forward and backward (cuBLAS GEMMs, small kernels), the local loss written next to the
//!   gradients;
//! * **one all-reduce (average) of the gradients and the loss**: both ranks then hold the
//!   gradient of the global batch;
//! * clipping without a host sync, AdamW, the loss recorded, `step += 1`.
//!
//! Both ranks start from rank 0's weights (an eager broadcast before anything is captured)
//! and apply the same averaged gradients, so their weights stay bitwise equal. The step is
//! run 200 times eagerly, then captured with `comm.capture` on both ranks and replayed 200
//! times from the same start: the loss curves and the final weights must be bitwise equal,
//! between eager and graph and between the ranks.
//!
//! Timings per step: host wall clock (median of 7 runs of `--iters` steps, ranks aligned by
//! a host barrier; the slower rank) and GPU time from CUDA events. `--torch` runs
//! `scripts/torch_ddp.py` afterwards (PyTorch DDP, eager and with CUDA graphs, the same
//! model, optimizer and batch sizes) and adds its numbers to the table.
//!
//! Run: `bash scripts/with-nccl.sh cargo run --release --features nccl --example
//! 11-data-parallel-train [-- --batches 8,32,128 --iters 200 --torch --json]`.

mod common;

use std::sync::Arc;

use common::train::{col_sums, data_set, gelu_grad, hidden_fwd, run_torch, Layout, BATCHES, DIMS};
use common::{
    blocks, elems, first_difference, gemm, gpu_us, int, json_line, nccl_env, times, us, wall_us,
    Cli, Mm, Table, J, KERNELS,
};
use graph_runtime::cudarc::driver::{CudaContext, CudaSlice, CudaStream, PushKernelArg};
use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp};
use graph_runtime::{cuda_graph, driver_available, BoxError, DeviceState, GraphError, Runtime};

/// Steps of the loss curves compared between eager and graph.
const STEPS: usize = 200;
/// Blocks of the gradient-norm reduction (a fixed split: the same sum every time).
const NORM_BLOCKS: usize = 64;
const LR: f32 = 1e-3;
const BETAS: (f32, f32) = (0.9, 0.999);
const EPS: f32 = 1e-8;
const WEIGHT_DECAY: f32 = 0.01;
const MAX_NORM: f32 = 1.0;

/// The data set, identical on every rank: `BATCHES` mini-batches of `world × batch` rows.
#[derive(DeviceState)]
struct Data {
    xs: CudaSlice<f32>,
    ts: CudaSlice<f32>,
}

/// What a step reads and updates on one rank. `grads` has one more element than `params`:
/// the local loss, averaged over the ranks by the same all-reduce as the gradients.
#[derive(DeviceState)]
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
    z1: CudaSlice<f32>,
    a1: CudaSlice<f32>,
    z2: CudaSlice<f32>,
    a2: CudaSlice<f32>,
    y: CudaSlice<f32>,
    dy: CudaSlice<f32>,
    da: CudaSlice<f32>,
    dz: CudaSlice<f32>,
    batch: usize,
}

impl Trainer {
    fn new(s: &Arc<CudaStream>, batch: usize, init: &CudaSlice<f32>) -> Result<Self, GraphError> {
        let n = Layout::new().len;
        let [inp, h1, h2, out] = DIMS;
        let wide = h1.max(h2);
        let mut params = s.alloc_zeros(n)?;
        s.memcpy_dtod(init, &mut params)?;
        Ok(Trainer {
            params,
            grads: s.alloc_zeros(n + 1)?,
            m: s.alloc_zeros(n)?,
            v: s.alloc_zeros(n)?,
            step: s.alloc_zeros(1)?,
            losses: s.alloc_zeros(STEPS)?,
            partials: s.alloc_zeros(NORM_BLOCKS)?,
            x: s.alloc_zeros(batch * inp)?,
            t: s.alloc_zeros(batch * out)?,
            h: s.alloc_zeros(batch * wide)?,
            z1: s.alloc_zeros(batch * h1)?,
            a1: s.alloc_zeros(batch * h1)?,
            z2: s.alloc_zeros(batch * h2)?,
            a2: s.alloc_zeros(batch * h2)?,
            y: s.alloc_zeros(batch * out)?,
            dy: s.alloc_zeros(batch * out)?,
            da: s.alloc_zeros(batch * wide)?,
            dz: s.alloc_zeros(batch * wide)?,
            batch,
        })
    }

    /// Back to step 0 with weights `init`.
    fn restart(&mut self, s: &Arc<CudaStream>, init: &CudaSlice<f32>) -> Result<(), GraphError> {
        s.memcpy_dtod(init, &mut self.params)?;
        s.memset_zeros(&mut self.m)?;
        s.memset_zeros(&mut self.v)?;
        s.memset_zeros(&mut self.step)?;
        s.memset_zeros(&mut self.losses)?;
        Ok(())
    }
}

// 1. One training step on one rank: a single all-reduce carries the gradients and the loss.
#[cuda_graph(warmup = 2)]
fn dp_step(
    rt: &Runtime,
    #[state] comm: &Communicator,
    #[state] data: &Data,
    #[state] tr: &mut Trainer,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let k = |name: &str| rt.function(KERNELS, name);
    let (select, fwd, bias_add, mse) = (
        k("select_rows")?,
        k("bias_gelu_fwd")?,
        k("bias_add")?,
        k("mse_loss")?,
    );
    let (gelu_bwd, col_sum, sumsq, adamw, finish) = (
        k("gelu_bwd")?,
        k("col_sum")?,
        k("sumsq_partials")?,
        k("clip_adamw")?,
        k("finish_step")?,
    );
    let [inp, h1, h2, out] = DIMS;
    let l = Layout::new();
    let n = l.len;
    let (b, rank, world) = (tr.batch, comm.rank(), comm.world_size());
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
        y,
        dy,
        da,
        dz,
        ..
    } = tr;

    // This rank's rows of mini-batch `step % BATCHES`.
    // SAFETY: copies b·inp inputs and b·out targets from rows rank·b.. of one mini-batch of
    // world·b rows (inside the BATCHES mini-batches of `xs`, `ts`) into `x` and `t`.
    unsafe {
        s.launch_builder(&select)
            .arg(&data.xs)
            .arg(&data.ts)
            .arg(&*step)
            .arg(&mut *x)
            .arg(&mut *t)
            .arg(&int(BATCHES))
            .arg(&int(world * b))
            .arg(&int(rank * b))
            .arg(&int(b))
            .arg(&int(inp))
            .arg(&int(out))
            .launch(elems(b * inp.max(out)))?;
    }

    // Forward: h = a · Wᵀ, then bias + GELU (keeping the pre-activation z).
    let w = |i: usize| params.slice(l.w[i].clone());
    let bias = |i: usize| params.slice(l.b[i].clone());
    gemm(rt, &*x, &w(0), h, Mm::nt(b, h1, inp))?;
    hidden_fwd(rt, &fwd, h, &bias(0), z1, a1, b, h1)?;
    gemm(rt, &*a1, &w(1), h, Mm::nt(b, h2, h1))?;
    hidden_fwd(rt, &fwd, h, &bias(1), z2, a2, b, h2)?;
    gemm(
        rt,
        &*a2,
        &params.slice(l.w[2].clone()),
        h,
        Mm::nt(b, out, h2),
    )?;
    // SAFETY: reads b·out of `h` and out of the bias, writes b·out of `y`.
    unsafe {
        s.launch_builder(&bias_add)
            .arg(&*h)
            .arg(&params.slice(l.b[2].clone()))
            .arg(&mut *y)
            .arg(&int(b))
            .arg(&int(out))
            .launch(elems(b * out))?;
    }
    // Loss (one block): dy = 2 (y − t) / (b·out), the local loss into grads[n].
    // SAFETY: reads b·out of `y`, `t`, writes b·out of `dy` and the one float grads[n].
    unsafe {
        s.launch_builder(&mse)
            .arg(&*y)
            .arg(&*t)
            .arg(&mut *dy)
            .arg(&mut grads.slice_mut(n..n + 1))
            .arg(&int(b * out))
            .launch(blocks(1, 1024))?;
    }

    // Backward, last layer first: dW = dzᵀ · a, db = column sums, da = dz · W, dz' = da · gelu'(z).
    gemm(
        rt,
        &*dy,
        &*a2,
        &mut grads.slice_mut(l.w[2].clone()),
        Mm::tn(out, h2, b),
    )?;
    col_sums(
        rt,
        &col_sum,
        &*dy,
        &mut grads.slice_mut(l.b[2].clone()),
        b,
        out,
    )?;
    gemm(
        rt,
        &*dy,
        &params.slice(l.w[2].clone()),
        da,
        Mm::nn(b, h2, out),
    )?;
    gelu_grad(rt, &gelu_bwd, da, z2, dz, b * h2)?;
    gemm(
        rt,
        &*dz,
        &*a1,
        &mut grads.slice_mut(l.w[1].clone()),
        Mm::tn(h2, h1, b),
    )?;
    col_sums(
        rt,
        &col_sum,
        &*dz,
        &mut grads.slice_mut(l.b[1].clone()),
        b,
        h2,
    )?;
    gemm(
        rt,
        &*dz,
        &params.slice(l.w[1].clone()),
        da,
        Mm::nn(b, h1, h2),
    )?;
    gelu_grad(rt, &gelu_bwd, da, z1, dz, b * h1)?;
    gemm(
        rt,
        &*dz,
        &*x,
        &mut grads.slice_mut(l.w[0].clone()),
        Mm::tn(h1, inp, b),
    )?;
    col_sums(
        rt,
        &col_sum,
        &*dz,
        &mut grads.slice_mut(l.b[0].clone()),
        b,
        h1,
    )?;

    // 2. The gradients (and the loss) averaged over the ranks: the only collective.
    comm.all_reduce_in_place(grads, ReduceOp::Avg)?;

    // Clip and AdamW on the device, then record the loss and count the step.
    // SAFETY: NORM_BLOCKS blocks read n gradients (grid-stride) and write one partial each.
    unsafe {
        s.launch_builder(&sumsq)
            .arg(&*grads)
            .arg(&mut *partials)
            .arg(&int(n))
            .launch(blocks(NORM_BLOCKS, 256))?;
    }
    // SAFETY: grid-stride over the n elements of `params`, `grads`, `m`, `v` (at least n
    // each); reads NORM_BLOCKS partials and the step counter.
    unsafe {
        s.launch_builder(&adamw)
            .arg(&mut *params)
            .arg(&*grads)
            .arg(&mut *m)
            .arg(&mut *v)
            .arg(&*partials)
            .arg(&int(NORM_BLOCKS))
            .arg(&*step)
            .arg(&LR)
            .arg(&BETAS.0)
            .arg(&BETAS.1)
            .arg(&EPS)
            .arg(&WEIGHT_DECAY)
            .arg(&MAX_NORM)
            .arg(&int(n))
            .launch(blocks(n.div_ceil(256).min(256), 256))?;
    }
    // SAFETY: one thread writes losses[*step] (if below STEPS, the buffer's length) from
    // grads[n] and increments the counter, after every kernel that read it.
    unsafe {
        s.launch_builder(&finish)
            .arg(&mut *losses)
            .arg(&grads.slice(n..n + 1))
            .arg(&mut *step)
            .arg(&int(STEPS))
            .launch(blocks(1, 32))?;
    }
    Ok(())
}

/// What one batch size gave on one rank.
struct Row {
    batch: usize,
    nodes: usize,
    eager_us: f64,
    graph_us: f64,
    eager_gpu_us: f64,
    graph_gpu_us: f64,
    eager_losses: Vec<f32>,
    graph_losses: Vec<f32>,
    eager_params: Vec<f32>,
    graph_params: Vec<f32>,
}

// 3. One rank: for each batch size, 200 eager steps, then the graph, then the timings.
fn rank_main(comm: &Communicator, batches: &[usize], iters: usize) -> Result<Vec<Row>, GraphError> {
    let rt = comm.runtime();
    let s = rt.stream();
    let align = || comm.barrier();
    let mut rows = Vec::new();
    for &batch in batches {
        let (xs, ts, student) = data_set(comm.world_size(), batch);
        let data = Data {
            xs: s.clone_htod(&xs)?,
            ts: s.clone_htod(&ts)?,
        };
        // Rank 0's initial weights reach every rank through an eager broadcast: a
        // collective outside any graph, on the stream the graphs will replay on.
        let mut init = match comm.rank() {
            0 => s.clone_htod(&student)?,
            _ => s.alloc_zeros::<f32>(student.len())?,
        };
        comm.broadcast(&mut init, 0)?;

        let mut eager = Trainer::new(s, batch, &init)?;
        for _ in 0..STEPS {
            dp_step(rt, comm, &data, &mut eager)?;
        }
        let eager_losses = s.clone_dtoh(&eager.losses)?;
        let eager_params = s.clone_dtoh(&eager.params)?;

        let mut graphed = Trainer::new(s, batch, &init)?;
        let mut graph = comm.capture(|| DpStepGraph::capture(rt, comm, &data, &mut graphed))?;
        graph.state_mut().tr.restart(s, &init)?;
        for _ in 0..STEPS {
            graph.launch()?;
        }
        let graph_losses = s.clone_dtoh(&graph.state_mut().tr.losses)?;
        let graph_params = s.clone_dtoh(&graph.state_mut().tr.params)?;

        let mut run_eager = || dp_step(rt, comm, &data, &mut eager);
        let eager_us = wall_us(s, iters, align, &mut run_eager)?;
        let eager_gpu_us = gpu_us(s, iters, align, &mut run_eager)?;
        let graph_us = wall_us(s, iters, align, || graph.launch().map(drop))?;
        let graph_gpu_us = gpu_us(s, iters, align, || graph.launch().map(drop))?;
        rows.push(Row {
            batch,
            nodes: graph.info().nodes(),
            eager_us,
            graph_us,
            eager_gpu_us,
            graph_gpu_us,
            eager_losses,
            graph_losses,
            eager_params,
            graph_params,
        });
    }
    Ok(rows)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BoxError> {
    common::init_tracing();
    let cli = Cli::from_env();
    let batches = cli.usizes("batches", &[8, 32, 128])?;
    let iters = cli.usize("iters", 200)?;
    if !driver_available() {
        println!("skipped 11-data-parallel-train: no CUDA driver on this machine");
        return Ok(());
    }
    let gpus = CudaContext::device_count()?;
    if gpus < 2 {
        println!("skipped 11-data-parallel-train: it needs 2 GPUs, this machine has {gpus}");
        return Ok(());
    }
    // Without a loadable libnccl this is a typed error that says how to make it loadable.
    let group = CommGroup::new(2)?;
    let ranks = group.run(&[0, 1], |comm| rank_main(comm, &batches, iters))?;
    let torch = match cli.flag("torch") {
        false => None,
        true => match run_torch(&batches, iters) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("PyTorch reference not run: {e}");
                None
            }
        },
    };

    let device = CudaContext::new(0)?.name().unwrap_or_default();
    println!(
        "data-parallel training step of an MLP {DIMS:?}, MSE, clip 1.0, AdamW, on 2 × {device}; \
         NCCL {}, {}\n",
        group.nccl_version(),
        nccl_env()
    );
    let first = &ranks[0][0];
    let mut curve = Table::new(&[">step", ">eager loss", ">graph loss"]);
    for k in [0, 1, 9, 49, 99, 149, STEPS - 1] {
        curve.row(vec![
            (k + 1).to_string(),
            format!("{:.6}", first.eager_losses[k]),
            format!("{:.6}", first.graph_losses[k]),
        ]);
    }
    println!(
        "Loss (averaged over the ranks), batch {} per rank:\n",
        first.batch
    );
    print!("{}", curve.markdown());

    let mut headers = vec![
        ">batch per rank",
        ">global batch",
        ">nodes",
        ">eager µs/step",
        ">graph µs/step",
        ">graph speedup",
        ">eager GPU µs",
        ">graph GPU µs",
    ];
    if torch.is_some() {
        headers.extend([
            ">PyTorch DDP eager µs",
            ">PyTorch DDP graph µs",
            ">PyTorch graph GPU µs",
            ">ours vs PyTorch graph",
        ]);
    }
    headers.push("checks");
    let mut table = Table::new(&headers);
    let (mut failures, mut json) = (Vec::new(), Vec::new());
    for (i, r0) in ranks[0].iter().enumerate() {
        let r1 = &ranks[1][i];
        let two = |f: fn(&Row) -> f64| f(r0).max(f(r1));
        let (eager_us, graph_us) = (two(|r| r.eager_us), two(|r| r.graph_us));
        let (eager_gpu, graph_gpu) = (two(|r| r.eager_gpu_us), two(|r| r.graph_gpu_us));
        let mut problems = Vec::new();
        for (rank, r) in [r0, r1].into_iter().enumerate() {
            if let Some((k, a, b)) = first_difference(&r.eager_losses, &r.graph_losses) {
                problems.push(format!(
                    "rank {rank}: losses differ at step {}: eager {a} graph {b}",
                    k + 1
                ));
            }
            if let Some((k, a, b)) = first_difference(&r.eager_params, &r.graph_params) {
                problems.push(format!(
                    "rank {rank}: final weights differ at {k}: eager {a} graph {b}"
                ));
            }
        }
        if first_difference(&r0.graph_params, &r1.graph_params).is_some() {
            problems.push("the ranks' final weights differ".to_owned());
        }
        let agree = problems.is_empty();
        let mut cells = vec![
            r0.batch.to_string(),
            (2 * r0.batch).to_string(),
            r0.nodes.to_string(),
            us(eager_us),
            us(graph_us),
            times(eager_us / graph_us),
            us(eager_gpu),
            us(graph_gpu),
        ];
        if let Some(torch) = &torch {
            match torch.iter().find(|t| t.batch == r0.batch) {
                Some(t) => cells.extend([
                    us(t.eager_us),
                    us(t.graph_us),
                    us(t.graph_gpu_us),
                    times(t.graph_us / graph_us),
                ]),
                None => cells.extend([
                    "–".to_owned(),
                    "–".to_owned(),
                    "–".to_owned(),
                    "–".to_owned(),
                ]),
            }
        }
        cells.push(if agree {
            "losses + weights bitwise (eager = graph, rank 0 = rank 1)".to_owned()
        } else {
            "MISMATCH".to_owned()
        });
        table.row(cells);
        json.push(json_line(&[
            ("example", J::S("11-data-parallel-train".into())),
            ("impl", J::S("ours".into())),
            ("world", J::N(2.0)),
            ("batch", J::N(r0.batch as f64)),
            ("global_batch", J::N(2.0 * r0.batch as f64)),
            ("dims", J::S("64-256-256-16".into())),
            ("steps", J::N(STEPS as f64)),
            ("eager_us", J::N(eager_us)),
            ("graph_us", J::N(graph_us)),
            ("eager_gpu_us", J::N(eager_gpu)),
            ("graph_gpu_us", J::N(graph_gpu)),
            ("loss_first", J::N(r0.eager_losses[0] as f64)),
            ("loss_last", J::N(r0.eager_losses[STEPS - 1] as f64)),
            ("agree", J::B(agree)),
        ]));
        failures.extend(
            problems
                .into_iter()
                .map(|p| format!("batch {}: {p}", r0.batch)),
        );
    }
    println!(
        "\nStep time (host wall clock: median of 7 × {iters} steps, the slower rank; GPU: CUDA events):\n"
    );
    print!("{}", table.markdown());
    if cli.flag("json") {
        println!();
        for line in json {
            println!("{line}");
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    println!(
        "\nthe {STEPS}-step loss curves and final weights are bitwise equal between eager and graph, and between the ranks"
    );
    Ok(())
}
