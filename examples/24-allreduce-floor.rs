//! # 24 — an all-reduce inside a graph, against NCCL eager and PyTorch's graphed all-reduce
//!
//! Borrows from this workspace: `workloads` (timing, NCCL facts, the GPUs or a skip) and
//! `bench-report` (records, tables, PyTorch's records).
//!
//! Tensor-parallel decoding spends its time in small all-reduces: two per layer, a few KiB
//! to a few MiB each, at batch 1. What one costs inside a graph is the floor of every
//! tensor-parallel step. For each message size (4 KiB to 16 MiB of `f32`), on every rank:
//!
//! * **NCCL eager**: `comm.all_reduce(x, y, Sum)` called directly;
//! * **graph**: the same call in a `#[cuda_graph]` body, captured on every rank with
//!   `comm.capture` and replayed;
//! * **graph, symmetric**: the same graph over [`SymmetricBuffer`]s (NCCL 2.27 and newer),
//!   memory every rank registered with NCCL as a symmetric window, so that NCCL runs its
//!   symmetric kernels, which read the peers' copies directly;
//! * **graph, one-shot**: the same graph with the runtime's one-shot all-reduce, which takes
//!   `f32` sums up to `CommGroup::one_shot_limit` (256 KiB by default) when the ranks are
//!   threads of one process with peer access: one kernel per rank copies its input where the
//!   peers can read it, meets them through flags in peer memory and sums in rank order.
//!
//! The first three run in a group whose one-shot limit is 0 (NCCL for everything), the last
//! in a group with the default limit.
//!
//! Each figure is the GPU time of one operation, over `--iters` operations the GPU runs back
//! to back (p50 and p99 of the time between CUDA events recorded after each; the stream is
//! held while the host queues each batch of 200, see `workloads::timing::per_call_gpu_us`,
//! so no operation waits for the host), and the host wall clock per operation of a loop of
//! them (what a caller that issues one after another sees, median of 7 loops). The ranks meet at a host barrier before each loop. Every rank checks the last
//! result against the exact sum (the inputs are small integers, so any order of summation
//! gives the same bits) and the ranks' results are compared.
//!
//! `--torch` runs `scripts/torch_allreduce.py` afterwards: PyTorch's `dist.all_reduce`
//! (NCCL backend, one process per GPU) eagerly and captured in a `torch.cuda.CUDAGraph`,
//! timed the same way, and adds its columns.
//!
//! Run on a machine with two or more GPUs and NCCL: `bash scripts/with-nccl.sh cargo run
//! --release --features nccl --example 24-allreduce-floor [-- --world 2 --iters 2000
//! --torch --json]`. `--json` prints one `bench_report::record::Record` per size (bench
//! `allreduce`; `eager_us` and `graph_us` are p50 GPU times).

use std::process::Command;

use bench_report::record::{read_output, Record, Side};
use bench_report::table::{us, Table};
use clap::builder::RangedU64ValueParser;
use clap::Parser;
use graph_runtime::cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp, SymmetricBuffer, MIN_NCCL_SYMMETRIC};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime};
use workloads::check::first_mismatch;
use workloads::machine::nccl_env;
use workloads::testing::{exit_on_error, gpus_or_skip};
use workloads::timing::{per_call_gpu_us, percentile, wall_us_aligned};

/// All-reduce inside a graph against NCCL eager and PyTorch's graphed all-reduce.
#[derive(Parser, Debug, Clone)]
struct Config {
    /// Ranks (GPUs); 0 takes every GPU of the machine.
    #[arg(long, default_value_t = 0)]
    world: usize,
    /// Message sizes in KiB, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = RangedU64ValueParser::<usize>::new().range(1..), default_values_t = [4, 16, 64, 256, 1024, 4096, 16384])]
    kib: Vec<usize>,
    /// Operations per loop (the p50 and p99 are over these).
    #[arg(long, default_value_t = 2000, value_parser = RangedU64ValueParser::<usize>::new().range(10..))]
    iters: usize,
    /// Run PyTorch's reference afterwards (`scripts/torch_allreduce.py`).
    #[arg(long)]
    torch: bool,
    /// Print one JSON record per size after the tables (`bench_report::record`).
    #[arg(long)]
    json: bool,
}

// 1. The graph: one all-reduce of `x` into `y`, on the communicator's ranks.
#[cuda_graph(warmup = 2)]
fn reduce(
    _rt: &Runtime,
    #[state] comm: &Communicator,
    #[state] x: &CudaSlice<f32>,
    #[state(no_restore)] y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, y, ReduceOp::Sum)
}

// The floor: a graph of one kernel that does nothing, timed the same way.
#[cuda_graph(warmup = 1)]
fn empty(rt: &Runtime) -> Result<(), GraphError> {
    let hold = rt.function(workloads::kernels::HOLD, "hold_for")?;
    let mut launch = rt.stream().launch_builder(&hold);
    let no_time = 0u64;
    launch.arg(&no_time);
    // SAFETY: `hold_for` takes one `unsigned long long` by value and touches no memory.
    unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;
    Ok(())
}

// 2. The same over symmetric buffers.
#[cuda_graph(warmup = 2)]
fn reduce_symmetric(
    _rt: &Runtime,
    #[state] comm: &Communicator,
    #[state] x: &SymmetricBuffer<f32>,
    #[state(no_restore)] y: &mut SymmetricBuffer<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, y, ReduceOp::Sum)
}

/// One way of all-reducing, timed on one rank.
#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    p50: f64,
    p99: f64,
    /// Wall clock per operation of a back-to-back loop.
    loop_us: f64,
}

impl Timing {
    fn slower(self, o: Timing) -> Timing {
        Timing {
            p50: self.p50.max(o.p50),
            p99: self.p99.max(o.p99),
            loop_us: self.loop_us.max(o.loop_us),
        }
    }
}

/// One size on one rank.
struct Row {
    bytes: usize,
    eager: Timing,
    graph: Timing,
    /// `Err(why)` when symmetric buffers could not be made.
    symmetric: Result<Timing, String>,
    /// The one-shot all-reduce in a graph, for sizes it takes.
    one_shot: Option<Timing>,
    /// This rank's last results (eager, graph, symmetric) equal the exact sum.
    exact: bool,
    out: Vec<f32>,
}

/// Rank `r`'s input: small integers, whose sum over any number of ranks is exact in `f32`
/// whatever the order.
fn input(n: usize, rank: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + rank * 13) % 61) as f32).collect()
}

fn exact_sum(n: usize, world: usize) -> Vec<f32> {
    let mut sum = vec![0.0f32; n];
    for r in 0..world {
        for (s, v) in sum.iter_mut().zip(input(n, r)) {
            *s += v;
        }
    }
    sum
}

fn time(
    comm: &Communicator,
    iters: usize,
    mut op: impl FnMut() -> Result<(), GraphError>,
) -> Result<Timing, GraphError> {
    let s = comm.runtime().stream();
    // Warm up NCCL's connections and the caches, then time.
    for _ in 0..20 {
        op()?;
    }
    let per = per_call_gpu_us(comm.runtime(), iters, || comm.barrier(), &mut op)?;
    let loop_us = wall_us_aligned(s, iters, || comm.barrier(), &mut op)?;
    Ok(Timing {
        p50: percentile(&per, 50.0),
        p99: percentile(&per, 99.0),
        loop_us,
    })
}

// 3. One rank of the NCCL group: every size, eager, graph, symmetric graph.
fn rank_main(comm: &Communicator, cfg: &Config) -> Result<Vec<Row>, GraphError> {
    let rt = comm.runtime();
    let s = rt.stream();
    let world = comm.world_size();
    let symmetric_ok = comm.group().nccl_version() >= MIN_NCCL_SYMMETRIC;
    let mut rows = Vec::new();
    for &kib in &cfg.kib {
        let bytes = kib * 1024;
        let n = bytes / 4;
        let host = input(n, comm.rank());
        let want = exact_sum(n, world);
        let x = s.clone_htod(&host)?;
        let mut y = s.alloc_zeros::<f32>(n)?;
        let eager = time(comm, cfg.iters, || {
            comm.all_reduce(&x, &mut y, ReduceOp::Sum)
        })?;
        let mut exact = first_mismatch(&want, &s.clone_dtoh(&y)?).is_none();

        let mut y = s.alloc_zeros::<f32>(n)?;
        let mut graph = comm.capture(|| ReduceGraph::capture(rt, comm, &x, &mut y))?;
        let timing = time(comm, cfg.iters, || graph.replay().map(drop))?;
        drop(graph);
        let out = s.clone_dtoh(&y)?;
        exact &= first_mismatch(&want, &out).is_none();

        let symmetric = if symmetric_ok {
            match symmetric_run(comm, cfg.iters, &host) {
                Ok((t, got)) => {
                    exact &= first_mismatch(&want, &got).is_none();
                    Ok(t)
                }
                Err(e) => Err(e.to_string()),
            }
        } else {
            Err(format!("needs NCCL {MIN_NCCL_SYMMETRIC}"))
        };
        comm.barrier()?;
        rows.push(Row {
            bytes,
            eager,
            graph: timing,
            symmetric,
            one_shot: None,
            exact,
            out,
        });
    }
    Ok(rows)
}

/// What one rank of the one-shot group measured: the one-shot graph for the sizes it takes,
/// and the floor.
type OneShotRank = (Vec<Option<(Timing, Vec<f32>)>>, Timing);

// 4. One rank of the group with the one-shot all-reduce: the graph, for the sizes it takes,
// and a graph of one empty kernel (the floor of this way of timing).
fn one_shot_main(comm: &Communicator, cfg: &Config) -> Result<OneShotRank, GraphError> {
    let rt = comm.runtime();
    let s = rt.stream();
    let limit = comm.group().one_shot_limit();
    let mut floor = EmptyGraph::capture(rt)?;
    let floor = time(comm, cfg.iters, || floor.replay().map(drop))?;
    let mut rows = Vec::new();
    for &kib in &cfg.kib {
        let bytes = kib * 1024;
        if bytes > limit {
            rows.push(None);
            continue;
        }
        let x = s.clone_htod(&input(bytes / 4, comm.rank()))?;
        let mut y = s.alloc_zeros::<f32>(bytes / 4)?;
        let mut graph = comm.capture(|| ReduceGraph::capture(rt, comm, &x, &mut y))?;
        let t = time(comm, cfg.iters, || graph.replay().map(drop))?;
        drop(graph);
        rows.push(Some((t, s.clone_dtoh(&y)?)));
        comm.barrier()?;
    }
    Ok((rows, floor))
}

fn symmetric_run(
    comm: &Communicator,
    iters: usize,
    host: &[f32],
) -> Result<(Timing, Vec<f32>), GraphError> {
    let s = comm.runtime().stream();
    let mut x = comm.symmetric_buffer::<f32>(host.len())?;
    s.memcpy_htod(host, &mut x.as_view_mut())?;
    let mut y = comm.symmetric_buffer::<f32>(host.len())?;
    let mut graph =
        comm.capture(|| ReduceSymmetricGraph::capture(comm.runtime(), comm, &x, &mut y))?;
    let t = time(comm, iters, || graph.replay().map(drop))?;
    drop(graph);
    Ok((t, s.clone_dtoh(&y.as_view())?))
}

fn main() {
    exit_on_error(run());
}

fn cell(t: &Timing) -> String {
    format!("{} / {}", us(t.p50), us(t.p99))
}

/// PyTorch's figures for one size: eager and graph (p50, p99, loop).
struct Torch {
    eager: Timing,
    graph: Timing,
}

/// PyTorch's figures by message size, and its records.
type TorchRows = (Vec<(usize, Torch)>, Vec<Record>);

fn torch_rows(world: usize, cfg: &Config) -> Result<TorchRows, BoxError> {
    let out = Command::new("python3")
        .arg("scripts/torch_allreduce.py")
        .arg("--world")
        .arg(world.to_string())
        .arg("--kib")
        .arg(
            cfg.kib
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        )
        .arg("--iters")
        .arg(cfg.iters.to_string())
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "scripts/torch_allreduce.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let parsed = read_output(&String::from_utf8_lossy(&out.stdout))?;
    let mut rows = Vec::new();
    for r in &parsed.records {
        let t = |k: &str| r.num(k).unwrap_or(f64::NAN);
        let bytes = r.shape_num("bytes").unwrap_or(0.0) as usize;
        rows.push((
            bytes,
            Torch {
                eager: Timing {
                    p50: t("eager_p50_us"),
                    p99: t("eager_p99_us"),
                    loop_us: t("eager_loop_us"),
                },
                graph: Timing {
                    p50: t("graph_p50_us"),
                    p99: t("graph_p99_us"),
                    loop_us: t("graph_loop_us"),
                },
            },
        ));
    }
    Ok((rows, parsed.records))
}

fn run() -> Result<(), BoxError> {
    let cfg = Config::parse();
    if !gpus_or_skip("24-allreduce-floor", cfg.world.max(2)) {
        return Ok(());
    }
    let world = match cfg.world {
        0 => CudaContext::device_count()? as usize,
        w => w,
    };
    let group = CommGroup::new(world)?;
    group.set_one_shot_limit(0);
    let devices: Vec<usize> = (0..world).collect();
    let mut ranks = group.run(&devices, |comm| rank_main(comm, &cfg))?;
    let one_shot_group = CommGroup::new(world)?;
    let one_shot = one_shot_group.run(&devices, |comm| one_shot_main(comm, &cfg))?;
    let floor = one_shot
        .iter()
        .map(|(_, f)| *f)
        .fold(Timing::default(), Timing::slower);
    for (rows, (theirs, _)) in ranks.iter_mut().zip(one_shot) {
        for (row, t) in rows.iter_mut().zip(theirs) {
            if let Some((t, out)) = t {
                row.exact &= first_mismatch(&exact_sum(row.bytes / 4, world), &out).is_none();
                row.one_shot = Some(t);
            }
        }
    }
    let device = CudaContext::new(0)?.name().unwrap_or_default();
    println!(
        "all-reduce (sum, f32) on {world} × {device}; NCCL {}, {}\n",
        group.nccl_version(),
        nccl_env()
    );
    let torch = if cfg.torch {
        match torch_rows(world, &cfg) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("PyTorch's reference did not run: {e}");
                None
            }
        }
    } else {
        None
    };

    let mut gpu = Table::new(&[
        ">size",
        ">NCCL eager p50 / p99 µs",
        ">graph p50 / p99 µs",
        ">graph, symmetric p50 / p99 µs",
        ">graph, one-shot p50 / p99 µs",
        ">PyTorch eager p50 / p99 µs",
        ">PyTorch graph p50 / p99 µs",
        "exact, ranks equal",
    ]);
    let mut wall = Table::new(&[
        ">size",
        ">NCCL eager µs",
        ">graph µs",
        ">graph, symmetric µs",
        ">graph, one-shot µs",
        ">PyTorch eager µs",
        ">PyTorch graph µs",
    ]);
    let mut failures = Vec::new();
    let mut json = Vec::new();
    let mut symmetric_notes = Vec::new();
    for (i, r0) in ranks[0].iter().enumerate() {
        let others = ranks.iter().map(|r| &r[i]);
        let slow = |f: &dyn Fn(&Row) -> Timing| {
            others
                .clone()
                .map(f)
                .fold(Timing::default(), Timing::slower)
        };
        let eager = slow(&|r| r.eager);
        let graph = slow(&|r| r.graph);
        let symmetric = match ranks
            .iter()
            .map(|r| r[i].symmetric.clone())
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(all) => Some(all.into_iter().fold(Timing::default(), Timing::slower)),
            Err(why) => {
                if !symmetric_notes.contains(&why) {
                    symmetric_notes.push(why);
                }
                None
            }
        };
        let one_shot = ranks
            .iter()
            .map(|r| r[i].one_shot)
            .collect::<Option<Vec<_>>>()
            .map(|all| all.into_iter().fold(Timing::default(), Timing::slower));
        let exact = others.clone().all(|r| r.exact);
        let equal = others
            .clone()
            .all(|r| first_mismatch(&r0.out, &r.out).is_none());
        if !(exact && equal) {
            failures.push(format!(
                "{} bytes: a result differs from the exact sum or between ranks",
                r0.bytes
            ));
        }
        let size = if r0.bytes >= 1 << 20 {
            format!("{} MiB", r0.bytes >> 20)
        } else {
            format!("{} KiB", r0.bytes >> 10)
        };
        let theirs = torch
            .as_ref()
            .and_then(|(rows, _)| rows.iter().find(|(b, _)| *b == r0.bytes).map(|(_, t)| t));
        let dash = || "—".to_owned();
        gpu.row(vec![
            size.clone(),
            cell(&eager),
            cell(&graph),
            symmetric.as_ref().map_or_else(dash, cell),
            one_shot.as_ref().map_or_else(dash, cell),
            theirs.map_or_else(dash, |t| cell(&t.eager)),
            theirs.map_or_else(dash, |t| cell(&t.graph)),
            if exact && equal { "yes" } else { "NO" }.into(),
        ]);
        wall.row(vec![
            size,
            us(eager.loop_us),
            us(graph.loop_us),
            symmetric.as_ref().map_or_else(dash, |t| us(t.loop_us)),
            one_shot.as_ref().map_or_else(dash, |t| us(t.loop_us)),
            theirs.map_or_else(dash, |t| us(t.eager.loop_us)),
            theirs.map_or_else(dash, |t| us(t.graph.loop_us)),
        ]);
        let best = [symmetric, one_shot]
            .into_iter()
            .flatten()
            .fold(graph, |b, t| if t.p50 < b.p50 { t } else { b });
        let mut record = Record::new(
            "allreduce",
            Side::Ours,
            format!("allreduce/{world}/{}", r0.bytes),
            format!(
                "all-reduce of {} bytes (f32, sum) on {world} GPUs",
                r0.bytes
            ),
            eager.p50,
            best.p50,
        )
        .shape("world", world)
        .shape("bytes", r0.bytes)
        .check(
            "every rank's result equals the exact sum, ranks bitwise equal",
            exact && equal,
        )
        .with("eager_p99_us", eager.p99)
        .with("graph_p50_us", graph.p50)
        .with("graph_p99_us", graph.p99)
        .with("eager_loop_us", eager.loop_us)
        .with("graph_loop_us", graph.loop_us);
        if let Some(t) = one_shot {
            record = record
                .with("one_shot_p50_us", t.p50)
                .with("one_shot_p99_us", t.p99)
                .with("one_shot_loop_us", t.loop_us);
        }
        if let Some(s) = symmetric {
            record = record
                .with("symmetric_p50_us", s.p50)
                .with("symmetric_p99_us", s.p99)
                .with("symmetric_loop_us", s.loop_us);
        }
        json.push(record.line());
    }
    println!(
        "GPU time per all-reduce, {} operations the GPU runs back to back (time between CUDA \
         events after each; the slower rank):\n",
        cfg.iters
    );
    print!("{}", gpu.to_markdown());
    println!(
        "\nHost wall clock per all-reduce in a loop of {} (median of 7 loops; the slower rank):\n",
        cfg.iters
    );
    print!("{}", wall.to_markdown());
    println!(
        "\nThe floor of these figures, a graph of one empty kernel timed the same way: {} µs \
         p50, {} µs p99 (GPU), {} µs per launch (host loop)",
        us(floor.p50),
        us(floor.p99),
        us(floor.loop_us)
    );
    for why in &symmetric_notes {
        println!("\nsymmetric buffers: {why}");
    }
    if cfg.json {
        println!();
        for line in json {
            println!("{line}");
        }
        if let Some((_, records)) = &torch {
            for r in records {
                println!("{}", r.line());
            }
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    println!("\nevery result equals the exact sum on every rank, and the ranks agree bitwise");
    Ok(())
}
