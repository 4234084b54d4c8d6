//! # 04 — MLP inference: one graph per batch size
//!
//! Borrows from this workspace: `workloads` (the cuBLAS, cuBLASLt and fused layer launchers,
//! the f64 host model, comparisons, timing, the runtime or a skip) and `bench-report` (records,
//! tables).
//!
//! The model: 16 × (Linear 512→512 + bias + GELU). A graph's shapes are fixed at capture, so
//! the batch size is a `#[constant]` and each batch size gets its own graph from its own
//! `capture` call.
//!
//! A layer runs one of four ways, also a `#[constant]` (`--kernels`):
//! * `sgemm`: a cuBLAS GEMM, then the `bias_gelu` kernel: two launches per layer, the
//!   straightforward cudarc program;
//! * `lt`: cuBLASLt's GEMM with its bias epilogue, then a GELU kernel in place
//!   (`workloads::ops::lt`), FP32: two launches per layer, the kernels PyTorch runs;
//! * `fused`: the `linear_bias_gelu` kernel (`workloads::kernels::LINEAR`), one launch per
//!   layer, written for small batches;
//! * `early`: the same kernel started with [`Runtime::launch_early`]: each layer loads its
//!   weights while the layer before it finishes, and the graph keeps that overlap as
//!   programmatic edges.
//!
//! The default (`auto`) picks the fastest way measured on an H100: `early` up to batch
//! [`FUSED_MAX`], `sgemm` up to [`SGEMM_MAX`], `lt` above, where the GEMMs are large enough
//! for cuBLASLt's tiles.
//!
//! At batch 1024 and above the GEMMs set the time (FP32 without TF32, about 26 TFLOP/s), so
//! what matters is which kernels run. `lt` runs PyTorch's, kernel for kernel: cuBLASLt's
//! heuristic first pick, untimed, with the bias folded into the GEMM kernel
//! (`sm80_xmma_gemm_f32f32_…_tilesize64x64x8` at batch 1024, as PyTorch's profiler shows for
//! its `Linear`), then a GELU kernel. On an H200, two runs: 337.0 and 340.5 µs per replay
//! against 341.6 and 342.0 µs for PyTorch's graph; at batch 4096, 860.9 and 861.0 against
//! 884.3 and 882.3. With cuBLASLt's GELU_BIAS epilogue instead (`--lt-candidate 0
//! --lt-gelu-epilogue`) cuBLASLt runs the same GEMM and then a generic epilogue kernel of its
//! own: 340.1–342.1 µs at batch 1024, 874.0–875.6 at 4096 (PyTorch's own GELU_BIAS path,
//! `_addmm_activation`, is slower than its `addmm` + GELU too). The same kernels vary between
//! runs: 334 to 348 µs at batch 1024 in 19 runs on one H200 in one day, 361.9 in one run of
//! `08-report`; PyTorch's graph likewise (341.6 to 343.6 µs, and 360.9 in a run in which ours
//! took 335.1). Timing the candidates one layer at a
//! time picked a worse one (365 µs in the model, although it timed faster alone). The
//! example says on stderr which algorithm and which kernels each `lt` graph runs.
//! `--kernels all` runs and times every way.
//!
//! For every batch size the example
//! 1. runs the function eagerly and replays its graph on the same input, and checks that the
//!    outputs are equal bit for bit (same kernels, same order, same algorithms);
//! 2. checks three rows of the eager output against the host reference
//!    (`workloads::reference::mlp_inference`);
//! 3. times eager calls, replays (input copy + launch) and launches alone.
//!
//! The default sweep is the batch 1 to 64, then 256, 1024 and 4096: past 64 the
//! GEMMs, not the launches, set the time, which is where a graph stops helping.
//!
//! Run: `cargo run --release --example 04-mlp-inference` (add `-- --batches 1,8,64` to
//! choose, `-- --kernels all` to compare the four ways, `-- --json` for machine-readable
//! lines).

use bench_report::record::{Record, Side};
use bench_report::table::{times, us, Table};
use clap::{Parser, ValueEnum};
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, BoxError, DeviceState, GraphError, Runtime, Tolerance};
use workloads::check::{first_mismatch, max_scaled_diff, verified};
use workloads::ops::blas::{matmul, MatMul};
use workloads::ops::elementwise::bias_gelu;
use workloads::ops::linear::linear_bias_gelu;
use workloads::ops::lt::{LtEpilogue, LtLinear};
use workloads::reference::{mlp_inference, uniform};
use workloads::testing::{random_vec, runtime_or_skip, seeded_rng};
use workloads::timing::{gpu_us, iters_for, wall_us};

const LAYERS: usize = 16;
const DIM: usize = 512;
const BATCHES: &[usize] = &[1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096];
/// Largest batch that `auto` runs on the fused kernel.
const FUSED_MAX: usize = 64;
/// Largest batch that `auto` runs on cuBLAS's sgemm; cuBLASLt above.
const SGEMM_MAX: usize = 512;
/// Tolerance of the eager output against the f64 host reference (|Δ| / max(1, |ref|)).
const CPU_TOLERANCE: f32 = 1e-3;

/// MLP inference with one graph per batch size: eager against graph replay, each layer run one
/// of four ways.
#[derive(Parser)]
struct Args {
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = batch_size, default_values_t = BATCHES.to_vec())]
    batches: Vec<usize>,
    /// How each layer runs: the fastest way per batch size (auto), every way (all), or one.
    #[arg(long, value_enum, default_value_t = Ways::Auto)]
    kernels: Ways,
    /// Print one JSON line per measurement after the table (for the report).
    #[arg(long)]
    json: bool,
    /// Probe: run `lt` layers on this candidate of cuBLASLt's heuristic (0: its first pick),
    /// untimed, instead of `LtLinear::new`'s (the first pick with a 4 MiB workspace).
    #[arg(long, hide = true)]
    lt_candidate: Option<usize>,
    /// Probe: the cuBLASLt workspace of `--lt-candidate`, in MiB.
    #[arg(long, hide = true, default_value_t = 4)]
    lt_workspace_mib: usize,
    /// Probe: with `--lt-candidate`, cuBLASLt's GELU_BIAS epilogue instead of its BIAS
    /// epilogue and the GELU kernel.
    #[arg(long, hide = true)]
    lt_gelu_epilogue: bool,
}

/// `--kernels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Ways {
    Auto,
    All,
    Sgemm,
    Lt,
    Fused,
    Early,
}

/// A batch size: a whole number of at least 1.
fn batch_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("a batch holds at least one row".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{s}` is not a batch size: {e}")),
    }
}

/// How a layer runs (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernels {
    Sgemm,
    Lt,
    Fused,
    Early,
}

impl Kernels {
    const ALL: [Kernels; 4] = [Kernels::Sgemm, Kernels::Lt, Kernels::Fused, Kernels::Early];

    /// The fastest way for `batch` on an H100 (the `--kernels all` table): the fused kernel
    /// while the weights dominate, cuBLAS's sgemm around batch 256, cuBLASLt above.
    fn auto(batch: usize) -> Self {
        if batch <= FUSED_MAX {
            Kernels::Early
        } else if batch <= SGEMM_MAX {
            Kernels::Sgemm
        } else {
            Kernels::Lt
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kernels::Sgemm => "sgemm",
            Kernels::Lt => "lt",
            Kernels::Fused => "fused",
            Kernels::Early => "early",
        }
    }
}

/// The buffers a forward pass works in: two activations it alternates between (a layer
/// cannot overwrite the input it is still reading), and the cuBLASLt plan for `lt`.
#[derive(DeviceState)]
struct Work {
    h: [CudaSlice<f32>; 2],
    lt: Option<LtLinear>,
}

impl Work {
    fn new(
        rt: &Runtime,
        batch: usize,
        kernels: Kernels,
        probe: Option<(usize, usize, LtEpilogue)>,
    ) -> Result<Self, GraphError> {
        let lt = match (kernels, probe) {
            (Kernels::Lt, None) => Some(LtLinear::new(rt, batch, DIM, DIM)?),
            (Kernels::Lt, Some((index, ws, epilogue))) => Some(
                LtLinear::with_candidate(rt, (batch, DIM, DIM), ws, epilogue, index)?.ok_or_else(
                    || GraphError::User(format!("cuBLASLt proposes no candidate {index}").into()),
                )?,
            ),
            _ => None,
        };
        if let Some(plan) = &lt {
            eprintln!(
                "04-mlp-inference: batch {batch}: cuBLASLt candidate {} ({}), workspace {} MiB: {}",
                plan.candidate(),
                if probe.is_some() {
                    "asked for"
                } else {
                    "LtLinear::new"
                },
                plan.workspace_bytes() >> 20,
                plan.algorithm()
            );
        }
        Self::with_plan(rt, batch, lt)
    }

    /// Buffers of the same size and the same cuBLASLt algorithm: the eager twin of a graph's
    /// `Work`, so that both run exactly the same kernels.
    fn twin(&self, rt: &Runtime) -> Result<Self, GraphError> {
        let lt = self.lt.as_ref().map(|p| p.duplicate(rt)).transpose()?;
        Self::with_plan(rt, self.h[0].len() / DIM, lt)
    }

    fn with_plan(rt: &Runtime, batch: usize, lt: Option<LtLinear>) -> Result<Self, GraphError> {
        let s = rt.stream();
        Ok(Work {
            h: [s.alloc_zeros(batch * DIM)?, s.alloc_zeros(batch * DIM)?],
            lt,
        })
    }
}

// 1. The model. `x` is the input (copied into the graph on every replay), `y` the output;
//    the weights are state read in place, and so is `work`: the eager run launches exactly
//    the kernels the graph replays (temporaries would add allocations to every eager call).
#[allow(clippy::too_many_arguments)] // the model's parameters, one per role
#[cuda_graph(warmup = 2)]
fn mlp(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    #[state] work: &mut Work,
    y: &mut CudaSlice<f32>,
    #[constant] batch: usize,
    #[constant] kernels: Kernels,
) -> Result<(), GraphError> {
    let Work { h, lt } = work;
    let [h0, h1] = h;
    for l in 0..LAYERS {
        let wl = w.slice(l * DIM * DIM..(l + 1) * DIM * DIM);
        let bl = b.slice(l * DIM..(l + 1) * DIM);
        if kernels == Kernels::Sgemm {
            // `y` holds the activations, `h0` each GEMM's result before bias + GELU.
            let src = if l == 0 { x } else { &*y };
            matmul(rt, src, &wl, h0, MatMul::nt(batch, DIM, DIM))?;
            bias_gelu(rt, &*h0, &bl, y, batch, DIM)?;
            continue;
        }
        // Layer l reads x, h0 or h1 and writes h0, h1 or (last) y.
        let (src, dst) = if l % 2 == 0 {
            (&*h1, &mut *h0)
        } else {
            (&*h0, &mut *h1)
        };
        let src = if l == 0 { x } else { src };
        let dst = if l + 1 == LAYERS { &mut *y } else { dst };
        match kernels {
            Kernels::Lt => lt
                .as_mut()
                .expect("an `lt` forward needs its plan")
                .forward(rt, src, &wl, &bl, dst)?,
            _ => linear_bias_gelu(
                rt,
                kernels == Kernels::Early,
                src,
                &wl,
                &bl,
                dst,
                batch,
                DIM,
                DIM,
            )?,
        }
    }
    Ok(())
}

struct Row {
    batch: usize,
    kernels: Kernels,
    nodes: usize,
    early_edges: usize,
    eager_us: f64,
    graph_us: f64,
    launch_us: f64,
    eager_gpu_us: f64,
    graph_gpu_us: f64,
    bitwise: bool,
    cpu_err: f32,
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let batches = args.batches;
    let ways: Vec<Option<Kernels>> = match args.kernels {
        Ways::Auto => vec![None],
        Ways::All => Kernels::ALL.into_iter().map(Some).collect(),
        Ways::Sgemm => vec![Some(Kernels::Sgemm)],
        Ways::Lt => vec![Some(Kernels::Lt)],
        Ways::Fused => vec![Some(Kernels::Fused)],
        Ways::Early => vec![Some(Kernels::Early)],
    };
    let Some(rt) = runtime_or_skip("04-mlp-inference") else {
        return Ok(());
    };
    let s = rt.stream().clone();

    // 2. Weights with PyTorch's default Linear initialisation, one input per batch size.
    let mut rng = seeded_rng(4);
    let bound = 1.0 / (DIM as f32).sqrt();
    let host_w = uniform(&mut rng, LAYERS * DIM * DIM, bound);
    let host_b = uniform(&mut rng, LAYERS * DIM, bound);
    let (w, b) = (s.clone_htod(&host_w)?, s.clone_htod(&host_b)?);
    let host_x: Vec<Vec<f32>> = batches
        .iter()
        .map(|&n| random_vec(&mut rng, n * DIM))
        .collect();
    let xs = host_x
        .iter()
        .map(|h| s.clone_htod(h))
        .collect::<Result<Vec<_>, _>>()?;

    // 3. One graph per batch size (and way of running the layers): `batch` and `kernels` are
    //    constants, so each `capture` records its own shapes and kernels. The graph borrows
    //    its `Work` for its life; the eager calls get their own.
    let mut rows = Vec::new();
    let mut verifications = 0;
    for (i, &n) in batches.iter().enumerate() {
        for way in &ways {
            let kernels = way.unwrap_or(Kernels::auto(n));
            let x = &xs[i];
            let epilogue = if args.lt_gelu_epilogue {
                LtEpilogue::GeluBias
            } else {
                LtEpilogue::BiasThenGelu
            };
            let probe = args
                .lt_candidate
                .map(|i| (i, args.lt_workspace_mib << 20, epilogue));
            let mut graph_work = Work::new(&rt, n, kernels, probe)?;
            let mut eager_work = graph_work.twin(&rt)?;
            let mut graph =
                MlpGraph::capture(&rt, x, &w, &b, &mut graph_work, n * DIM, n, kernels)?;
            verified(graph.verify(x, Tolerance::BITWISE)?)?;
            verifications += 1;
            if kernels == Kernels::Lt {
                // Which kernels cuBLASLt's algorithm launches: what to compare with PyTorch's
                // profiler.
                for (name, count) in graph.graph().kernel_counts()? {
                    eprintln!("04-mlp-inference: batch {n}: {count} × {name}");
                }
            }
            let mut y = s.alloc_zeros::<f32>(n * DIM)?;
            let mut eager =
                |y: &mut CudaSlice<f32>| mlp(&rt, x, &w, &b, &mut eager_work, y, n, kernels);

            // 4. Eager and graph on the same input: bitwise equal.
            eager(&mut y)?;
            let eager_out = s.clone_dtoh(&y)?;
            let graphed = s.clone_dtoh(graph.replay(x)?.y)?;
            let bitwise = first_mismatch(&eager_out, &graphed).is_none();

            // 5. And eager against the host on the first, middle and last rows.
            let mut cpu_err = 0.0f32;
            let mut picked = vec![0, n / 2, n - 1];
            picked.dedup();
            for r in picked {
                let want = mlp_inference(
                    &host_x[i][r * DIM..(r + 1) * DIM],
                    &host_w,
                    &host_b,
                    LAYERS,
                    DIM,
                );
                cpu_err = cpu_err.max(max_scaled_diff(&eager_out[r * DIM..(r + 1) * DIM], &want));
            }

            // 6. Timings: about 50 ms of back-to-back calls per measurement.
            let estimate = wall_us(&s, 3, || eager(&mut y))?;
            let iters = iters_for(estimate, 50_000.0, 5, 2_000);
            let eager_us = wall_us(&s, iters, || eager(&mut y))?;
            let graph_us = wall_us(&s, iters, || graph.replay(x).map(|_| ()))?;
            let launch_us = wall_us(&s, iters, || graph.launch().map(|_| ()))?;
            let eager_gpu_us = gpu_us(&s, iters, || eager(&mut y))?;
            let graph_gpu_us = gpu_us(&s, iters, || graph.replay(x).map(|_| ()))?;
            rows.push(Row {
                batch: n,
                kernels,
                nodes: graph.info().kinds.kernels,
                early_edges: graph.info().early_edges,
                eager_us,
                graph_us,
                launch_us,
                eager_gpu_us,
                graph_gpu_us,
                bitwise,
                cpu_err,
            });
        }
    }

    // 7. The table (and JSON lines for the report).
    let device = rt.context().name().unwrap_or_default();
    println!(
        "MLP {LAYERS} × (Linear {DIM}→{DIM} + bias + GELU) on {device}; µs per forward, median of 7\n"
    );
    let mut t = Table::new(&[
        ">batch",
        "layers run as",
        ">kernels in graph",
        ">early edges",
        ">eager µs",
        ">graph replay µs",
        ">graph launch-only µs",
        ">speedup",
        ">eager GPU µs",
        ">graph GPU µs",
        "eager = graph",
        ">max err vs CPU",
    ]);
    for r in &rows {
        t.row(vec![
            r.batch.to_string(),
            r.kernels.name().to_owned(),
            r.nodes.to_string(),
            r.early_edges.to_string(),
            us(r.eager_us),
            us(r.graph_us),
            us(r.launch_us),
            times(r.eager_us / r.graph_us),
            us(r.eager_gpu_us),
            us(r.graph_gpu_us),
            if r.bitwise { "bitwise" } else { "DIFFER" }.to_owned(),
            format!("{:.1e}", r.cpu_err),
        ]);
    }
    print!("{}", t.to_markdown());
    println!(
        "\nSpeedup = eager µs / graph replay µs. Where the eager GPU time approaches the eager wall time, the GPU is busy with the GEMMs and a graph has little launch cost left to remove."
    );
    if args.json {
        for r in &rows {
            let what = format!("MLP {LAYERS}×(Linear {DIM}→{DIM}+GELU), batch {}", r.batch);
            let workload = format!("mlp/{}", r.batch);
            let rec = Record::new("mlp", Side::Ours, workload, what, r.eager_us, r.graph_us)
                .shape("batch", r.batch)
                .shape("layers", LAYERS)
                .shape("dim", DIM)
                .kernels(r.nodes)
                .check(
                    "output bitwise eager vs graph; 3 rows vs f64 host",
                    r.bitwise && r.cpu_err < CPU_TOLERANCE,
                )
                .with("layer_kernels", r.kernels.name())
                .with("graph_launch_us", r.launch_us)
                .with("eager_gpu_us", r.eager_gpu_us)
                .with("graph_gpu_us", r.graph_gpu_us)
                .with("cpu_max_err", r.cpu_err as f64);
            println!("{}", rec.line());
        }
    }

    let differ: Vec<(usize, &str)> = rows
        .iter()
        .filter(|r| !r.bitwise)
        .map(|r| (r.batch, r.kernels.name()))
        .collect();
    if !differ.is_empty() {
        return Err(format!("eager and graph outputs differ at batch sizes {differ:?}").into());
    }
    let off: Vec<(usize, &str)> = rows
        .iter()
        .filter(|r| r.cpu_err >= CPU_TOLERANCE)
        .map(|r| (r.batch, r.kernels.name()))
        .collect();
    if !off.is_empty() {
        return Err(format!(
            "the eager output is off the host reference by {CPU_TOLERANCE} or more at batch sizes {off:?}"
        )
        .into());
    }
    println!(
        "eager and graph agree bit for bit at every batch size; eager matches the host reference; \
         `verify` found replay = eager (bitwise) for all {verifications} graphs"
    );
    Ok(())
}
