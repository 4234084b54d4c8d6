//! # 10 — a tensor-parallel MLP forward on two GPUs, eager and as one graph per rank
//!
//! Borrows from this workspace: `workloads` (the GEMM and elementwise launchers, comparisons,
//! NCCL facts, timing, the GPUs or a skip) and `bench-report` (records, tables).
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
//! --json]`. `--json` prints one `bench_report::record::Record` per batch size (bench
//! `tp_mlp`).

use bench_report::record::{Record, Side};
use bench_report::table::{times, us, Table};
use clap::builder::RangedU64ValueParser;
use clap::Parser;
use graph_runtime::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp};
use graph_runtime::{cuda_graph, BoxError, DeviceState, GraphError, Runtime};
use workloads::check::first_mismatch;
use workloads::machine::nccl_env;
use workloads::ops::blas::{matmul, MatMul};
use workloads::ops::elementwise::{bias_gelu, bias_residual, init_uniform, BlockAt};
use workloads::testing::{exit_on_error, gpus_or_skip};
use workloads::timing::EagerGraph;

/// Outputs of one GPU and two agree when the largest difference, relative to the largest
/// output, is below this.
const TOLERANCE: f32 = 1e-4;

/// A tensor-parallel MLP forward on two GPUs, eager and as one graph per rank, against the
/// same MLP on one GPU.
#[derive(Parser, Debug, Clone)]
struct Config {
    /// Model width.
    #[arg(long, default_value_t = 2048, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    dim: usize,
    /// Hidden features of each block (split evenly over the two GPUs).
    #[arg(long, default_value_t = 8192, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    ffn: usize,
    /// MLP blocks.
    #[arg(long, default_value_t = 8, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    layers: usize,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = RangedU64ValueParser::<usize>::new().range(1..), default_values_t = [1, 2, 4, 8, 16, 32, 64])]
    batches: Vec<usize>,
    /// Back-to-back calls per timing.
    #[arg(long, default_value_t = 100, value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    iters: usize,
    /// Print one JSON record per batch size after the tables (`bench_report::record`).
    #[arg(long)]
    json: bool,
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
        // This rank's rows of W1 [f, d], its entries of b1 [f] and its columns of W2 [d, f].
        let rows_of_w1 = BlockAt {
            full_cols: d,
            row0: rank * local,
            col0: 0,
        };
        let cols_of_ffn = BlockAt {
            full_cols: f,
            row0: 0,
            col0: rank * local,
        };
        for l in 0..cfg.layers {
            let seed = 16 * l as u32;
            let mut w1 = s.alloc_zeros::<f32>(local * d)?;
            init_uniform(rt, &mut w1, local, d, rows_of_w1, seed, bound1)?;
            let mut b1 = s.alloc_zeros::<f32>(local)?;
            init_uniform(rt, &mut b1, 1, local, cols_of_ffn, seed + 1, bound1)?;
            let mut w2 = s.alloc_zeros::<f32>(d * local)?;
            init_uniform(rt, &mut w2, d, local, cols_of_ffn, seed + 2, bound2)?;
            let mut b2 = s.alloc_zeros::<f32>(d)?;
            init_uniform(rt, &mut b2, 1, d, BlockAt::whole(d), seed + 3, bound2)?;
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
        matmul(rt, src, &w.w1[l], hidden, MatMul::nt(batch, local, d))?;
        bias_gelu(rt, &*hidden, &w.b1[l], act, batch, local)?;
        // Row-parallel: a partial sum of the block's output, completed by the all-reduce.
        matmul(rt, &*act, &w.w2[l], partial, MatMul::nt(batch, d, local))?;
        if let Some(comm) = comm {
            comm.all_reduce_in_place(partial, ReduceOp::Sum)?;
        }
        // The bias once, after the all-reduce, and the residual.
        bias_residual(rt, &*partial, &w.b2[l], src, dst, batch, d)?;
    }
    Ok(())
}

/// What one batch size measured: on this rank, and (rank 0 only) on one GPU.
struct Row {
    batch: usize,
    nodes: usize,
    kernels: usize,
    t: EagerGraph,
    bitwise: bool,
    out: Vec<f32>,
    single: Option<Single>,
}

struct Single {
    t: EagerGraph,
    bitwise: bool,
    max_rel_diff: f32,
}

fn input(rt: &Runtime, batch: usize, dim: usize) -> Result<CudaSlice<f32>, GraphError> {
    let mut x = rt.stream().alloc_zeros::<f32>(batch * dim)?;
    let seed = 1000 + batch as u32;
    init_uniform(rt, &mut x, batch, dim, BlockAt::whole(dim), seed, 1.0)?;
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
        let bitwise = first_mismatch(&eager, &out).is_none();

        let t = EagerGraph::measure_aligned(
            s,
            iters,
            align,
            || tp_mlp(rt, &x, comm, &w, &mut eager_work, &mut y, batch),
            || graph.replay(&x).map(drop),
        )?;
        let info = graph.info();
        let (nodes, kernels) = (info.nodes(), info.kinds.kernels);
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
            kernels,
            t,
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
    Ok(Single {
        t: EagerGraph::measure(
            s,
            iters,
            || mlp(rt, x, w, &mut eager_work, &mut y, batch),
            || graph.replay(x).map(drop),
        )?,
        bitwise: first_mismatch(&eager, &out).is_none(),
        max_rel_diff,
    })
}

fn main() {
    exit_on_error(run());
}

fn run() -> Result<(), BoxError> {
    let cfg = Config::parse();
    if cfg.ffn % 2 == 1 {
        return Err("--ffn must split evenly over 2 GPUs".into());
    }
    if !gpus_or_skip("10-tensor-parallel-mlp", 2) {
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
        // The slower rank's figures: a step takes as long as its slowest rank.
        let slow = r0.t.slower(&r1.t);
        let (eager_us, graph_us) = (slow.eager_us, slow.graph_us);
        let (eager_gpu, graph_gpu) = (slow.eager_gpu_us, slow.graph_gpu_us);
        let bitwise = r0.bitwise && r1.bitwise && single.bitwise;
        let ranks_equal = first_mismatch(&r0.out, &r1.out).is_none();
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
            us(single.t.eager_us),
            us(single.t.graph_us),
            us(eager_us),
            us(graph_us),
            times(eager_us / graph_us),
            times(single.t.graph_us / graph_us),
        ]);
        gpu.row(vec![
            r0.batch.to_string(),
            r0.nodes.to_string(),
            us(single.t.eager_gpu_us),
            us(single.t.graph_gpu_us),
            us(eager_gpu),
            us(graph_gpu),
            if bitwise { "bitwise" } else { "DIFFERENT" }.into(),
            if ranks_equal { "bitwise" } else { "DIFFERENT" }.into(),
            format!("{:.1e}", single.max_rel_diff),
        ]);
        let what = format!(
            "tensor-parallel MLP {} × ({} → {} → {}), batch {}, 2 GPUs",
            cfg.layers, cfg.dim, cfg.ffn, cfg.dim, r0.batch
        );
        let record = Record::new(
            "tp_mlp",
            Side::Ours,
            format!("tp_mlp/{}", r0.batch),
            what,
            eager_us,
            graph_us,
        )
        .shape("world", 2)
        .shape("batch", r0.batch)
        .shape("dim", cfg.dim)
        .shape("ffn", cfg.ffn)
        .shape("layers", cfg.layers)
        .kernels(r0.kernels)
        .check(
            format!("eager = graph bitwise on both ranks, ranks bitwise equal, 2 GPUs = 1 GPU within {TOLERANCE:.0e}"),
            bitwise && ranks_equal && close,
        )
        .with("nodes", r0.nodes)
        .with("eager_gpu_us", eager_gpu)
        .with("graph_gpu_us", graph_gpu)
        .with("one_gpu_eager_us", single.t.eager_us)
        .with("one_gpu_graph_us", single.t.graph_us)
        .with("one_gpu_eager_gpu_us", single.t.eager_gpu_us)
        .with("one_gpu_graph_gpu_us", single.t.graph_gpu_us)
        .with("max_rel_diff_vs_one_gpu", f64::from(single.max_rel_diff));
        json.push(record.line());
    }
    println!(
        "Host wall clock per forward (median of 7 × {} calls; the slower rank):\n",
        cfg.iters
    );
    print!("{}", wall.to_markdown());
    println!("\nGPU time per forward (CUDA events) and checks:\n");
    print!("{}", gpu.to_markdown());
    if cfg.json {
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
