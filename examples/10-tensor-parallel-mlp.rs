//! # 10 — a tensor-parallel MLP forward on two GPUs, eager and as one graph per rank
//!
//! Eight transformer-style MLP blocks, `x ← x + W2 · gelu(W1 · x + b1) + b2` with
//! `W1: [ffn, dim]` and `W2: [dim, ffn]`, split Megatron-style over the two GPUs: `W1` by
//! rows (column-parallel: each rank computes half of the hidden features), `W2` by columns
//! (row-parallel: each rank's product is a partial sum of the output), then an all-reduce
//! of the partial sums, and the bias and residual on every rank. Per block and rank: two
//! cuBLAS GEMMs, two small kernels and one NCCL all-reduce.
//!
//! For each batch size (1 to 64), on every rank: the eager forward, then the same function
//! captured as one graph per rank with `comm.capture` (the ranks compare their collectives
//! before instantiating) and replayed. Checks:
//! * eager and graph outputs bitwise equal on each rank, and the two ranks' outputs bitwise
//!   equal (the all-reduce gives both the same sum);
//! * the two-GPU output against the same MLP on one GPU (the whole weights, no all-reduce)
//!   within float tolerance: splitting the hidden features changes the order of the sums.
//!
//! Timings: host wall clock per forward (median of 7 runs of `--iters` back-to-back calls,
//! the ranks aligned by a host barrier before each run; the slower rank is reported) and
//! GPU time from CUDA events, for eager and graph on two GPUs and on one.
//!
//! Run on a machine with two GPUs and NCCL (see `graph_runtime::nccl`, "Finding libnccl"):
//! `bash scripts/with-nccl.sh cargo run --release --features nccl --example
//! 10-tensor-parallel-mlp [-- --batches 1,8,64 --dim 2048 --ffn 8192 --layers 8 --iters 100
//! --json]`.

mod common;

use common::{
    elems, first_difference, gemm, gpu_us, init_uniform, int, json_line, nccl_env, times, us,
    wall_us, Cli, Mm, Table, J, KERNELS,
};
use graph_runtime::cudarc::driver::{CudaContext, CudaSlice, CudaStream, PushKernelArg};
use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp};
use graph_runtime::{cuda_graph, driver_available, BoxError, DeviceState, GraphError, Runtime};

/// Outputs of one GPU and two agree when the largest difference, relative to the largest
/// output, is below this.
const TOLERANCE: f32 = 1e-4;

#[derive(Debug, Clone)]
struct Config {
    dim: usize,
    ffn: usize,
    layers: usize,
    batches: Vec<usize>,
    iters: usize,
}

/// One rank's weights: of each block, its rows of `W1` and `b1`, its columns of `W2`, and
/// all of `b2` (added once, after the all-reduce). With one rank: the whole MLP.
#[derive(DeviceState)]
struct Weights {
    w1: Vec<CudaSlice<f32>>,
    b1: Vec<CudaSlice<f32>>,
    w2: Vec<CudaSlice<f32>>,
    b2: Vec<CudaSlice<f32>>,
    /// Hidden features on this rank (`ffn / world`).
    local: usize,
    dim: usize,
}

impl Weights {
    /// Rank `rank` of `world`'s part of the MLP every rank (and the one-GPU run) shares:
    /// entries are made on the device from their position in the whole matrix.
    fn new(rt: &Runtime, cfg: &Config, rank: usize, world: usize) -> Result<Self, GraphError> {
        let (d, f) = (cfg.dim, cfg.ffn);
        let local = f / world;
        let s = rt.stream();
        let (bound1, bound2) = (1.0 / (d as f32).sqrt(), 1.0 / (f as f32).sqrt());
        let mut w = Weights {
            w1: Vec::new(),
            b1: Vec::new(),
            w2: Vec::new(),
            b2: Vec::new(),
            local,
            dim: d,
        };
        for l in 0..cfg.layers {
            let seed = 16 * l as u32;
            let mut w1 = s.alloc_zeros::<f32>(local * d)?;
            init_uniform(rt, &mut w1, local, d, (rank * local, 0), d, seed, bound1)?;
            let mut b1 = s.alloc_zeros::<f32>(local)?;
            init_uniform(
                rt,
                &mut b1,
                1,
                local,
                (0, rank * local),
                f,
                seed + 1,
                bound1,
            )?;
            let mut w2 = s.alloc_zeros::<f32>(d * local)?;
            init_uniform(
                rt,
                &mut w2,
                d,
                local,
                (0, rank * local),
                f,
                seed + 2,
                bound2,
            )?;
            let mut b2 = s.alloc_zeros::<f32>(d)?;
            init_uniform(rt, &mut b2, 1, d, (0, 0), d, seed + 3, bound2)?;
            w.w1.push(w1);
            w.b1.push(b1);
            w.w2.push(w2);
            w.b2.push(b2);
        }
        Ok(w)
    }
}

/// Activations of one batch size.
#[derive(DeviceState)]
struct Work {
    hidden: CudaSlice<f32>,
    act: CudaSlice<f32>,
    partial: CudaSlice<f32>,
    blocks: [CudaSlice<f32>; 2],
}

impl Work {
    fn new(s: &std::sync::Arc<CudaStream>, batch: usize, w: &Weights) -> Result<Self, GraphError> {
        Ok(Work {
            hidden: s.alloc_zeros(batch * w.local)?,
            act: s.alloc_zeros(batch * w.local)?,
            partial: s.alloc_zeros(batch * w.dim)?,
            blocks: [s.alloc_zeros(batch * w.dim)?, s.alloc_zeros(batch * w.dim)?],
        })
    }
}

// 1. The forward, on one rank. `x` is the input (replicated on every rank), `y` the output.
#[allow(clippy::too_many_arguments)] // the model's parts, one per role
#[cuda_graph(warmup = 2)]
fn tp_mlp(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    #[state] w: &Weights,
    #[state(no_restore)] work: &mut Work,
    y: &mut CudaSlice<f32>,
    #[constant] batch: usize,
) -> Result<(), GraphError> {
    forward(rt, Some(comm), x, w, work, y, batch)
}

// 2. The same MLP on one GPU: the whole weights, no collective.
#[cuda_graph(warmup = 2)]
fn mlp(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &Weights,
    #[state(no_restore)] work: &mut Work,
    y: &mut CudaSlice<f32>,
    #[constant] batch: usize,
) -> Result<(), GraphError> {
    forward(rt, None, x, w, work, y, batch)
}

fn forward(
    rt: &Runtime,
    comm: Option<&Communicator>,
    x: &CudaSlice<f32>,
    w: &Weights,
    work: &mut Work,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let (bias_gelu, bias_residual) = (
        rt.function(KERNELS, "bias_gelu")?,
        rt.function(KERNELS, "bias_residual")?,
    );
    let (d, local, layers) = (w.dim, w.local, w.w1.len());
    let Work {
        hidden,
        act,
        partial,
        blocks: [even, odd],
    } = work;
    for l in 0..layers {
        // Block l reads x, `even` or `odd` and writes `even`, `odd` or (the last) y.
        let (src, dst): (&CudaSlice<f32>, &mut CudaSlice<f32>) = match (l, l % 2) {
            (0, _) if layers == 1 => (x, &mut *y),
            (0, _) => (x, &mut *even),
            (l, _) if l + 1 == layers => (if l % 2 == 1 { &*even } else { &*odd }, &mut *y),
            (_, 1) => (&*even, &mut *odd),
            _ => (&*odd, &mut *even),
        };
        // Column-parallel: this rank's hidden features.
        gemm(rt, src, &w.w1[l], hidden, Mm::nt(batch, local, d))?;
        // SAFETY: reads batch·local of `hidden` and local of the bias, writes batch·local
        // of `act`; each holds exactly that.
        unsafe {
            rt.stream()
                .launch_builder(&bias_gelu)
                .arg(&*hidden)
                .arg(&w.b1[l])
                .arg(&mut *act)
                .arg(&int(batch))
                .arg(&int(local))
                .launch(elems(batch * local))?;
        }
        // Row-parallel: a partial sum of the block's output, completed by the all-reduce.
        gemm(rt, &*act, &w.w2[l], partial, Mm::nt(batch, d, local))?;
        if let Some(comm) = comm {
            comm.all_reduce_in_place(partial, ReduceOp::Sum)?;
        }
        // SAFETY: reads batch·d of `partial` and `src` and d of the bias, writes batch·d of
        // `dst`; `src` and `dst` are different buffers of batch·d.
        unsafe {
            rt.stream()
                .launch_builder(&bias_residual)
                .arg(&*partial)
                .arg(&w.b2[l])
                .arg(src)
                .arg(dst)
                .arg(&int(batch))
                .arg(&int(d))
                .launch(elems(batch * d))?;
        }
    }
    Ok(())
}

/// What one batch size measured: on this rank, and (rank 0 only) on one GPU.
struct Row {
    batch: usize,
    nodes: usize,
    eager_us: f64,
    graph_us: f64,
    eager_gpu_us: f64,
    graph_gpu_us: f64,
    bitwise: bool,
    out: Vec<f32>,
    single: Option<Single>,
}

struct Single {
    eager_us: f64,
    graph_us: f64,
    eager_gpu_us: f64,
    graph_gpu_us: f64,
    bitwise: bool,
    max_rel_diff: f32,
}

fn input(rt: &Runtime, batch: usize, dim: usize) -> Result<CudaSlice<f32>, GraphError> {
    let mut x = rt.stream().alloc_zeros::<f32>(batch * dim)?;
    init_uniform(
        rt,
        &mut x,
        batch,
        dim,
        (0, 0),
        dim,
        1000 + batch as u32,
        1.0,
    )?;
    Ok(x)
}

// 3. One rank: every batch size, eager and graph, then (rank 0) the one-GPU run.
fn rank_main(comm: &Communicator, cfg: &Config) -> Result<Vec<Row>, GraphError> {
    let rt = comm.runtime();
    let s = rt.stream();
    let w = Weights::new(rt, cfg, comm.rank(), comm.world_size())?;
    let whole = match comm.rank() {
        0 => Some(Weights::new(rt, cfg, 0, 1)?),
        _ => None,
    };
    let align = || comm.barrier();
    let iters = cfg.iters;
    let mut rows = Vec::new();
    for &batch in &cfg.batches {
        let x = input(rt, batch, cfg.dim)?;
        let n = batch * cfg.dim;
        let mut eager_work = Work::new(s, batch, &w)?;
        let mut y = s.alloc_zeros::<f32>(n)?;
        tp_mlp(rt, &x, comm, &w, &mut eager_work, &mut y, batch)?;
        let eager = s.clone_dtoh(&y)?;

        let mut work = Work::new(s, batch, &w)?;
        let mut graph =
            comm.capture(|| TpMlpGraph::capture(rt, &x, comm, &w, &mut work, n, batch))?;
        let out = s.clone_dtoh(graph.replay(&x)?.y)?;
        let bitwise = first_difference(&eager, &out).is_none();

        let mut run_eager = || tp_mlp(rt, &x, comm, &w, &mut eager_work, &mut y, batch);
        let eager_us = wall_us(s, iters, align, &mut run_eager)?;
        let eager_gpu_us = gpu_us(s, iters, align, &mut run_eager)?;
        let graph_us = wall_us(s, iters, align, || graph.replay(&x).map(drop))?;
        let graph_gpu_us = gpu_us(s, iters, align, || graph.replay(&x).map(drop))?;
        let nodes = graph.info().nodes();
        drop(graph);

        // One GPU, on rank 0, while rank 1 waits at the barrier below.
        let single = match &whole {
            None => None,
            Some(whole) => Some(one_gpu(rt, whole, &x, batch, iters, &out)?),
        };
        comm.barrier()?;
        rows.push(Row {
            batch,
            nodes,
            eager_us,
            graph_us,
            eager_gpu_us,
            graph_gpu_us,
            bitwise,
            out,
            single,
        });
    }
    Ok(rows)
}

fn one_gpu(
    rt: &Runtime,
    w: &Weights,
    x: &CudaSlice<f32>,
    batch: usize,
    iters: usize,
    two_gpus: &[f32],
) -> Result<Single, GraphError> {
    let s = rt.stream();
    let n = x.len();
    let mut eager_work = Work::new(s, batch, w)?;
    let mut y = s.alloc_zeros::<f32>(n)?;
    mlp(rt, x, w, &mut eager_work, &mut y, batch)?;
    let eager = s.clone_dtoh(&y)?;
    let mut work = Work::new(s, batch, w)?;
    let mut graph = MlpGraph::capture(rt, x, w, &mut work, n, batch)?;
    let out = s.clone_dtoh(graph.replay(x)?.y)?;
    let scale = out.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    let max_rel_diff = out
        .iter()
        .zip(two_gpus)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs() / scale));
    let none = || -> Result<(), GraphError> { Ok(()) };
    let mut run_eager = || mlp(rt, x, w, &mut eager_work, &mut y, batch);
    Ok(Single {
        eager_us: wall_us(s, iters, none, &mut run_eager)?,
        eager_gpu_us: gpu_us(s, iters, none, &mut run_eager)?,
        graph_us: wall_us(s, iters, none, || graph.replay(x).map(drop))?,
        graph_gpu_us: gpu_us(s, iters, none, || graph.replay(x).map(drop))?,
        bitwise: first_difference(&eager, &out).is_none(),
        max_rel_diff,
    })
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
    let cfg = Config {
        dim: cli.usize("dim", 2048)?,
        ffn: cli.usize("ffn", 8192)?,
        layers: cli.usize("layers", 8)?,
        batches: cli.usizes("batches", &[1, 2, 4, 8, 16, 32, 64])?,
        iters: cli.usize("iters", 100)?,
    };
    if cfg.ffn % 2 == 1 {
        return Err("--ffn must split evenly over 2 GPUs".into());
    }
    if !driver_available() {
        println!("skipped 10-tensor-parallel-mlp: no CUDA driver on this machine");
        return Ok(());
    }
    let gpus = CudaContext::device_count()?;
    if gpus < 2 {
        println!("skipped 10-tensor-parallel-mlp: it needs 2 GPUs, this machine has {gpus}");
        return Ok(());
    }
    // Without a loadable libnccl this is a typed error that says how to make it loadable.
    let group = CommGroup::new(2)?;
    let ranks = group.run(&[0, 1], |comm| rank_main(comm, &cfg))?;
    let device = CudaContext::new(0)?.name().unwrap_or_default();
    println!(
        "tensor-parallel MLP forward: {} blocks of {} → {} → {} (GELU, residual), fp32, on 2 × {device}; \
         NCCL {}, {}\n",
        cfg.layers,
        cfg.dim,
        cfg.ffn,
        cfg.dim,
        group.nccl_version(),
        nccl_env()
    );

    let mut wall = Table::new(&[
        ">batch",
        ">1 GPU eager µs",
        ">1 GPU graph µs",
        ">2 GPU eager µs",
        ">2 GPU graph µs",
        ">graph speedup (2 GPU)",
        ">2 GPU graph vs 1 GPU graph",
    ]);
    let mut gpu = Table::new(&[
        ">batch",
        ">nodes per rank",
        ">1 GPU eager GPU µs",
        ">1 GPU graph GPU µs",
        ">2 GPU eager GPU µs",
        ">2 GPU graph GPU µs",
        "eager = graph",
        "ranks equal",
        ">max rel. diff vs 1 GPU",
    ]);
    let mut failures = Vec::new();
    let mut json = Vec::new();
    for (i, r0) in ranks[0].iter().enumerate() {
        let r1 = &ranks[1][i];
        let single = r0.single.as_ref().expect("rank 0 measures one GPU");
        let two = |f: fn(&Row) -> f64| f(r0).max(f(r1));
        let (eager_us, graph_us) = (two(|r| r.eager_us), two(|r| r.graph_us));
        let (eager_gpu, graph_gpu) = (two(|r| r.eager_gpu_us), two(|r| r.graph_gpu_us));
        let bitwise = r0.bitwise && r1.bitwise && single.bitwise;
        let ranks_equal = first_difference(&r0.out, &r1.out).is_none();
        let close = single.max_rel_diff <= TOLERANCE;
        if !bitwise {
            failures.push(format!(
                "batch {}: eager and graph outputs differ",
                r0.batch
            ));
        }
        if !ranks_equal {
            failures.push(format!("batch {}: the ranks' outputs differ", r0.batch));
        }
        if !close {
            failures.push(format!(
                "batch {}: 2 GPUs differ from 1 GPU by {:.2e} (relative)",
                r0.batch, single.max_rel_diff
            ));
        }
        wall.row(vec![
            r0.batch.to_string(),
            us(single.eager_us),
            us(single.graph_us),
            us(eager_us),
            us(graph_us),
            times(eager_us / graph_us),
            times(single.graph_us / graph_us),
        ]);
        gpu.row(vec![
            r0.batch.to_string(),
            r0.nodes.to_string(),
            us(single.eager_gpu_us),
            us(single.graph_gpu_us),
            us(eager_gpu),
            us(graph_gpu),
            if bitwise { "bitwise" } else { "DIFFERENT" }.into(),
            if ranks_equal { "bitwise" } else { "DIFFERENT" }.into(),
            format!("{:.1e}", single.max_rel_diff),
        ]);
        json.push(json_line(&[
            ("example", J::S("10-tensor-parallel-mlp".into())),
            ("impl", J::S("ours".into())),
            ("world", J::N(2.0)),
            ("batch", J::N(r0.batch as f64)),
            ("dim", J::N(cfg.dim as f64)),
            ("ffn", J::N(cfg.ffn as f64)),
            ("layers", J::N(cfg.layers as f64)),
            ("nodes", J::N(r0.nodes as f64)),
            ("one_gpu_eager_us", J::N(single.eager_us)),
            ("one_gpu_graph_us", J::N(single.graph_us)),
            ("eager_us", J::N(eager_us)),
            ("graph_us", J::N(graph_us)),
            ("one_gpu_eager_gpu_us", J::N(single.eager_gpu_us)),
            ("one_gpu_graph_gpu_us", J::N(single.graph_gpu_us)),
            ("eager_gpu_us", J::N(eager_gpu)),
            ("graph_gpu_us", J::N(graph_gpu)),
            ("max_rel_diff_vs_one_gpu", J::N(single.max_rel_diff as f64)),
            ("agree", J::B(bitwise && ranks_equal && close)),
        ]));
    }
    println!(
        "Host wall clock per forward (median of 7 × {} calls; the slower rank):\n",
        cfg.iters
    );
    print!("{}", wall.markdown());
    println!("\nGPU time per forward (CUDA events) and checks:\n");
    print!("{}", gpu.markdown());
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
        "\neager = graph bitwise on both ranks, both ranks bitwise equal, 2 GPUs = 1 GPU within {TOLERANCE:.0e}"
    );
    Ok(())
}
