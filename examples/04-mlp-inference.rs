//! # 04 — MLP inference: one graph per batch size
//!
//! The model: 16 × (Linear 512→512 + bias + GELU), the layer of `tests/replay_vs_eager.rs`
//! stacked: a cuBLAS GEMM and the `bias_gelu` kernel per layer, 32 launches per forward.
//! A graph's shapes are fixed at capture, so the batch size is a `#[constant]` and each
//! batch size gets its own graph from its own `capture` call.
//!
//! For every batch size the example
//! 1. runs the function eagerly and replays its graph on the same input, and checks that the
//!    outputs are equal bit for bit (same kernels, same order, same cuBLAS calls);
//! 2. checks three rows of the eager output against the host reference
//!    (`cuda_graphs::bench::reference::mlp_inference`);
//! 3. times eager calls, replays (input copy + launch) and launches alone.
//!
//! The default sweep is the batch 1 to 64, then 256, 1024 and 4096: past 64 the
//! GEMMs, not the launches, set the time, which is where a graph stops helping.
//!
//! Run: `cargo run --release --example 04-mlp-inference` (add `-- --batches 1,8,64` to
//! choose, `-- --json` for machine-readable lines).

use cuda_graphs::bench::blas::{matmul, MatMul};
use cuda_graphs::bench::json::Record;
use cuda_graphs::bench::reference::{mlp_inference, uniform};
use cuda_graphs::bench::table::{times, us, Table};
use cuda_graphs::bench::{first_mismatch, gpu_us, iters_for, max_scaled_diff, wall_us, Cli};
use cuda_graphs::kernels::ELEMENTWISE;
use cuda_graphs::testing::{random_vec, runtime_or_skip, seeded_rng};
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime};

const LAYERS: usize = 16;
const DIM: usize = 512;
const BATCHES: &[usize] = &[1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096];
/// Tolerance of the eager output against the f64 host reference (|Δ| / max(1, |ref|)).
const CPU_TOLERANCE: f32 = 1e-3;

// 1. The model. `x` is the input (copied into the graph on every replay), `y` the output;
//    the weights are state read in place. `scratch` holds each GEMM's result before
//    bias + GELU; it is state too, so the eager run launches exactly the kernels the graph
//    replays (a temporary would add an allocation to every eager call). Layer l reads `x`
//    (l = 0) or `y`, writes `scratch`, and bias + GELU writes `y` back.
#[cuda_graph(warmup = 2)]
fn mlp(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    #[state] scratch: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] batch: usize,
) -> Result<(), GraphError> {
    let bias_gelu = rt.function(ELEMENTWISE, "bias_gelu")?;
    let (rows, cols) = (batch as i32, DIM as i32);
    let cfg = LaunchConfig::for_num_elems((batch * DIM) as u32);
    // y = x · Wᵀ with W stored [out, in], as PyTorch's Linear.
    let mm = MatMul::nt(batch, DIM, DIM);
    for l in 0..LAYERS {
        let wl = w.slice(l * DIM * DIM..(l + 1) * DIM * DIM);
        let bl = b.slice(l * DIM..(l + 1) * DIM);
        if l == 0 {
            matmul(rt, x, &wl, scratch, mm)?;
        } else {
            matmul(rt, &*y, &wl, scratch, mm)?;
        }
        // SAFETY: `bias_gelu` reads rows·cols floats of `scratch` (it holds at least that:
        // `matmul` checked) and cols of `bl`, and writes rows·cols of `y`, which holds
        // batch·DIM.
        unsafe {
            rt.stream()
                .launch_builder(&bias_gelu)
                .arg(&*scratch)
                .arg(&bl)
                .arg(&mut *y)
                .arg(&rows)
                .arg(&cols)
                .launch(cfg)?;
        }
    }
    Ok(())
}

struct Row {
    batch: usize,
    nodes: usize,
    eager_us: f64,
    graph_us: f64,
    launch_us: f64,
    eager_gpu_us: f64,
    graph_gpu_us: f64,
    bitwise: bool,
    cpu_err: f32,
}

fn main() -> Result<(), BoxError> {
    let cli = Cli::from_env();
    let batches = cli.usize_list("batches", BATCHES)?;
    if batches.is_empty() || batches.contains(&0) {
        return Err("--batches: give batch sizes of at least 1".into());
    }
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

    // 3. One graph per batch size: `batch` is a constant, so each `capture` records the
    //    shapes of its own batch. Each graph borrows its own scratch buffer for its life.
    let mut scratches = batches
        .iter()
        .map(|&n| s.alloc_zeros::<f32>(n * DIM))
        .collect::<Result<Vec<_>, _>>()?;
    let mut graphs = Vec::with_capacity(batches.len());
    for ((&n, x), scratch) in batches.iter().zip(&xs).zip(scratches.iter_mut()) {
        graphs.push(MlpGraph::capture(&rt, x, &w, &b, scratch, n * DIM, n)?);
    }

    // The eager calls share one scratch buffer of the largest size.
    let largest = batches.iter().copied().max().unwrap_or(1);
    let mut eager_scratch = s.alloc_zeros::<f32>(largest * DIM)?;
    let mut rows = Vec::new();
    for (i, graph) in graphs.iter_mut().enumerate() {
        let (n, x) = (batches[i], &xs[i]);
        let mut y = s.alloc_zeros::<f32>(n * DIM)?;

        // 4. Eager and graph on the same input: bitwise equal.
        mlp(&rt, x, &w, &b, &mut eager_scratch, &mut y, n)?;
        let eager = s.clone_dtoh(&y)?;
        let graphed = s.clone_dtoh(graph.replay(x)?.y)?;
        let bitwise = first_mismatch(&eager, &graphed).is_none();

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
            cpu_err = cpu_err.max(max_scaled_diff(&eager[r * DIM..(r + 1) * DIM], &want));
        }

        // 6. Timings: about 50 ms of back-to-back calls per measurement.
        let estimate = wall_us(&s, 3, || mlp(&rt, x, &w, &b, &mut eager_scratch, &mut y, n))?;
        let iters = iters_for(estimate, 50_000.0, 5, 2_000);
        let eager_us = wall_us(&s, iters, || {
            mlp(&rt, x, &w, &b, &mut eager_scratch, &mut y, n)
        })?;
        let graph_us = wall_us(&s, iters, || graph.replay(x).map(|_| ()))?;
        let launch_us = wall_us(&s, iters, || graph.launch().map(|_| ()))?;
        let eager_gpu_us = gpu_us(&s, iters, || {
            mlp(&rt, x, &w, &b, &mut eager_scratch, &mut y, n)
        })?;
        let graph_gpu_us = gpu_us(&s, iters, || graph.replay(x).map(|_| ()))?;
        rows.push(Row {
            batch: n,
            nodes: graph.info().kinds.kernels,
            eager_us,
            graph_us,
            launch_us,
            eager_gpu_us,
            graph_gpu_us,
            bitwise,
            cpu_err,
        });
    }

    // 7. The table (and JSON lines for the report).
    let device = rt.context().name().unwrap_or_default();
    println!(
        "MLP {LAYERS} × (Linear {DIM}→{DIM} + bias + GELU) on {device}; µs per forward, median of 7\n"
    );
    let mut t = Table::new(&[
        ">batch",
        ">kernels in graph",
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
            r.nodes.to_string(),
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
    if cli.json {
        for r in &rows {
            let rec = Record::new("mlp", "ours")
                .set("batch", r.batch)
                .set("layers", LAYERS)
                .set("dim", DIM)
                .set("kernels", r.nodes)
                .set("eager_us", r.eager_us)
                .set("graph_us", r.graph_us)
                .set("graph_launch_us", r.launch_us)
                .set("eager_gpu_us", r.eager_gpu_us)
                .set("graph_gpu_us", r.graph_gpu_us)
                .set("check", "output bitwise eager vs graph; 3 rows vs f64 host")
                .set("agree", r.bitwise && r.cpu_err < CPU_TOLERANCE)
                .set("cpu_max_err", r.cpu_err as f64);
            println!("{}", rec.line());
        }
    }

    let differ: Vec<usize> = rows
        .iter()
        .filter(|r| !r.bitwise)
        .map(|r| r.batch)
        .collect();
    if !differ.is_empty() {
        return Err(format!("eager and graph outputs differ at batch sizes {differ:?}").into());
    }
    let off: Vec<usize> = rows
        .iter()
        .filter(|r| r.cpu_err >= CPU_TOLERANCE)
        .map(|r| r.batch)
        .collect();
    if !off.is_empty() {
        return Err(format!(
            "the eager output is off the host reference by {CPU_TOLERANCE} or more at batch sizes {off:?}"
        )
        .into());
    }
    println!(
        "eager and graph agree bit for bit at every batch size; eager matches the host reference"
    );
    Ok(())
}
