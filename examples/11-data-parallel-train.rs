//! # 11 — a data-parallel training step on two GPUs, one graph per rank
//!
//! Borrows from this workspace: `workloads` (the training step, the GEMM launcher, comparisons,
//! NCCL facts, timing, the GPUs or a skip) and `bench-report` (records, tables, PyTorch's
//! records).
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
//! The data set and initial weights come from `workloads::train::Problem` (the generator of
//! `06-train-step`: PyTorch's initialisation, a teacher four times as large), the kernels and
//! their launchers from `workloads::ops`, the optimizer's settings from
//! `workloads::train::OPTIMIZER`.
//!
//! Run: `bash scripts/with-nccl.sh cargo run --release --features nccl --example
//! 11-data-parallel-train [-- --batches 8,32,128 --iters 200 --torch --json]`. `--json`
//! prints one `bench_report::record::Record` per batch size (bench `ddp_train`), and with
//! `--torch` PyTorch's records of the same workloads.

use std::process::Command;
use std::sync::Arc;

use bench_report::record::{read_output, Record, Side};
use bench_report::table::{times, us, Table};
use clap::builder::RangedU64ValueParser;
use clap::Parser;
use graph_runtime::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp};
use graph_runtime::{cuda_graph, BoxError, DeviceState, GraphError, Runtime};
use workloads::check::{first_mismatch, same_training};
use workloads::machine::nccl_env;
use workloads::ops::blas::{matmul, MatMul};
use workloads::ops::train::{
    bias_add, bias_gelu_fwd, clip_adamw, col_sum, finish_step, gelu_bwd, mse_loss_into,
    select_rows, sumsq_partials, RankRows,
};
use workloads::reference::ParamLayout;
use workloads::testing::{exit_on_error, gpus_or_skip, seeded_rng};
use workloads::timing::EagerGraph;
use workloads::train::{Data, Problem, TrainSpec, NORM_BLOCKS, OPTIMIZER};

/// The MLP: 64 → 256 → 256 → 16.
const DIMS: &[usize] = &[64, 256, 256, 16];
/// Mini-batches in the data set; step `s` trains on mini-batch `s % BATCHES`.
const BATCHES: usize = 8;
/// Steps of the loss curves compared between eager and graph.
const STEPS: usize = 200;
/// The seed of the data set and the initial weights (the same on every rank).
const SEED: u64 = 11;

/// A data-parallel training step on two GPUs, one graph per rank, eager against graph (and
/// PyTorch DDP with `--torch`).
#[derive(Parser)]
struct Args {
    /// Batch sizes per rank, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = RangedU64ValueParser::<usize>::new().range(1..), default_values_t = [8, 32, 128])]
    batches: Vec<usize>,
    /// Back-to-back steps per timing.
    #[arg(long, default_value_t = 200, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    iters: usize,
    /// Run `scripts/torch_ddp.py` (PyTorch DDP, eager and graphed) and add its numbers.
    #[arg(long)]
    torch: bool,
    /// Print one JSON record per batch size after the table (`bench_report::record`).
    #[arg(long)]
    json: bool,
}

/// What is trained: `world × batch` rows per mini-batch, `BATCHES` of them.
fn spec(world: usize, batch: usize) -> TrainSpec {
    TrainSpec {
        dims: DIMS,
        batch: world * batch,
        batches: BATCHES,
        steps: STEPS,
        dropout: None,
    }
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
        let n = ParamLayout::new(DIMS).len();
        let [inp, h1, h2, out] = [DIMS[0], DIMS[1], DIMS[2], DIMS[3]];
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
    let [inp, h1, h2, out] = [DIMS[0], DIMS[1], DIMS[2], DIMS[3]];
    let l = ParamLayout::new(DIMS);
    let n = l.len();
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
    let rows = RankRows {
        batches: BATCHES,
        global_rows: world * b,
        row0: rank * b,
        rows: b,
        in_dim: inp,
        out_dim: out,
    };
    select_rows(rt, &data.xs, &data.ts, &*step, x, t, rows)?;

    // Forward: h = a · Wᵀ, then bias + GELU (keeping the pre-activation z).
    let w = |i: usize| params.slice(l.w(i));
    let bias = |i: usize| params.slice(l.b(i));
    matmul(rt, &*x, &w(0), h, MatMul::nt(b, h1, inp))?;
    bias_gelu_fwd(rt, &*h, &bias(0), z1, a1, b, h1)?;
    matmul(rt, &*a1, &w(1), h, MatMul::nt(b, h2, h1))?;
    bias_gelu_fwd(rt, &*h, &bias(1), z2, a2, b, h2)?;
    matmul(rt, &*a2, &w(2), h, MatMul::nt(b, out, h2))?;
    bias_add(rt, &*h, &bias(2), y, b, out)?;
    // Loss (one block): dy = 2 (y − t) / (b·out), the local loss into grads[n].
    mse_loss_into(rt, &*y, &*t, dy, &mut grads.slice_mut(n..n + 1), b * out)?;

    // Backward, last layer first: dW = dzᵀ · a, db = column sums, da = dz · W, dz' = da · gelu'(z).
    matmul(
        rt,
        &*dy,
        &*a2,
        &mut grads.slice_mut(l.w(2)),
        MatMul::tn(out, h2, b),
    )?;
    col_sum(rt, &*dy, &mut grads.slice_mut(l.b(2)), b, out)?;
    matmul(rt, &*dy, &w(2), da, MatMul::nn(b, h2, out))?;
    gelu_bwd(rt, &*da, &*z2, dz, b * h2)?;
    matmul(
        rt,
        &*dz,
        &*a1,
        &mut grads.slice_mut(l.w(1)),
        MatMul::tn(h2, h1, b),
    )?;
    col_sum(rt, &*dz, &mut grads.slice_mut(l.b(1)), b, h2)?;
    matmul(rt, &*dz, &w(1), da, MatMul::nn(b, h1, h2))?;
    gelu_bwd(rt, &*da, &*z1, dz, b * h1)?;
    matmul(
        rt,
        &*dz,
        &*x,
        &mut grads.slice_mut(l.w(0)),
        MatMul::tn(h1, inp, b),
    )?;
    col_sum(rt, &*dz, &mut grads.slice_mut(l.b(0)), b, h1)?;

    // 2. The gradients (and the loss) averaged over the ranks: the only collective.
    comm.all_reduce_in_place(grads, ReduceOp::Avg)?;

    // Clip and AdamW on the device (the norm from NORM_BLOCKS partial sums), then record
    // the loss and count the step.
    sumsq_partials(rt, &*grads, partials, n)?;
    clip_adamw(rt, params, &*grads, m, v, &*partials, &*step, &OPTIMIZER, n)?;
    finish_step(rt, losses, &grads.slice(n..n + 1), step)
}

/// What one batch size gave on one rank.
struct Row {
    batch: usize,
    nodes: usize,
    kernels: usize,
    t: EagerGraph,
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
        let problem = Problem::new(spec(comm.world_size(), batch), &mut seeded_rng(SEED));
        let data = problem.upload(s)?;
        let student = &problem.init;
        // Rank 0's initial weights reach every rank through an eager broadcast: a
        // collective outside any graph, on the stream the graphs will replay on.
        let mut init = match comm.rank() {
            0 => s.clone_htod(student)?,
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

        let t = EagerGraph::measure_aligned(
            s,
            iters,
            align,
            || dp_step(rt, comm, &data, &mut eager),
            || graph.launch().map(drop),
        )?;
        let info = graph.info();
        rows.push(Row {
            batch,
            nodes: info.nodes(),
            kernels: info.kinds.kernels,
            t,
            eager_losses,
            graph_losses,
            eager_params,
            graph_params,
        });
    }
    Ok(rows)
}

fn main() {
    exit_on_error(run());
}

fn run() -> Result<(), BoxError> {
    let args = Args::parse();
    let (batches, iters) = (&args.batches, args.iters);
    if !gpus_or_skip("11-data-parallel-train", 2) {
        return Ok(());
    }
    // Without a loadable libnccl this is a typed error that says how to make it loadable.
    let group = CommGroup::new(2)?;
    let ranks = group.run(&[0, 1], |comm| rank_main(comm, batches, iters))?;
    let torch = match args.torch {
        false => None,
        true => match torch_records(batches, iters) {
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
    print!("{}", curve.to_markdown());

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
        // The slower rank's figures: a step takes as long as its slowest rank.
        let slow = r0.t.slower(&r1.t);
        let (eager_us, graph_us) = (slow.eager_us, slow.graph_us);
        let (eager_gpu, graph_gpu) = (slow.eager_gpu_us, slow.graph_gpu_us);
        let mut problems = Vec::new();
        for (rank, r) in [r0, r1].into_iter().enumerate() {
            if let Err(e) = same_training(
                (&r.eager_losses, &r.graph_losses),
                Some((&r.eager_params, &r.graph_params)),
            ) {
                problems.push(format!("rank {rank}: {e}"));
            }
        }
        if first_mismatch(&r0.graph_params, &r1.graph_params).is_some() {
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
        let workload = format!("ddp_train/{}", r0.batch);
        if let Some(torch) = &torch {
            match torch.iter().find(|t| t.workload == workload) {
                Some(t) => cells.extend([
                    us(t.eager_us),
                    us(t.graph_us),
                    us(t.num("graph_gpu_us").unwrap_or(f64::NAN)),
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
        let dims = spec(2, r0.batch).dims_text();
        let what = format!(
            "data-parallel train step MLP {dims}, batch {} per rank, 2 GPUs",
            r0.batch
        );
        let record = Record::new("ddp_train", Side::Ours, workload, what, eager_us, graph_us)
            .shape("world", 2)
            .shape("batch", r0.batch)
            .shape("global_batch", 2 * r0.batch)
            .shape("dims", dims)
            .shape("steps", STEPS)
            .kernels(r0.kernels)
            .check(
                format!(
                    "{STEPS}-step losses and final weights bitwise, eager = graph, rank 0 = rank 1"
                ),
                agree,
            )
            .with("nodes", r0.nodes)
            .with("eager_gpu_us", eager_gpu)
            .with("graph_gpu_us", graph_gpu)
            .with("loss_first", f64::from(r0.eager_losses[0]))
            .with("loss_last", f64::from(r0.eager_losses[STEPS - 1]));
        json.push(record.line());
        failures.extend(
            problems
                .into_iter()
                .map(|p| format!("batch {}: {p}", r0.batch)),
        );
    }
    println!(
        "\nStep time (host wall clock: median of 7 × {iters} steps, the slower rank; GPU: CUDA events):\n"
    );
    print!("{}", table.to_markdown());
    if args.json {
        println!();
        for line in json {
            println!("{line}");
        }
        for record in torch.iter().flatten() {
            println!("{}", record.line());
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

/// PyTorch DDP's records of the same workloads (eager and graphed step times), from
/// `scripts/torch_ddp.py` with these batch sizes.
fn torch_records(batches: &[usize], iters: usize) -> Result<Vec<Record>, String> {
    let script = "scripts/torch_ddp.py";
    if !std::path::Path::new(script).exists() {
        return Err(format!("{script} not found (run from the repository root)"));
    }
    let list: Vec<String> = batches.iter().map(usize::to_string).collect();
    let out = Command::new("python3")
        .arg(script)
        .args(["--batches", &list.join(","), "--iters", &iters.to_string()])
        .output()
        .map_err(|e| format!("python3 {script}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 {script} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    read_output(&String::from_utf8_lossy(&out.stdout))
        .map(|o| o.records)
        .map_err(|e| format!("{script}: {e}"))
}
