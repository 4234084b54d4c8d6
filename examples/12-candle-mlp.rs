//! # 12 — candle code as a graph: an MLP
//!
//! Borrows from this workspace: `workloads` (comparisons, random inputs, timing, tracing) and
//! `bench-report` (records, tables); the model lives in `examples/common/`.
//!
//! An MLP written with candle-nn (`Linear` + GELU, 16 layers of width 512, random weights)
//! runs at batch 1 as candle runs it (one launch per op, each a few µs of host time) and as
//! a graph made from the same function by `#[cuda_graph]`: the input is copied into a static
//! tensor, every op's output becomes a graph temporary at a fixed address, candle's cuBLAS
//! calls are recorded like any kernel, and the returned tensor is copied into a static
//! output tensor inside the graph.
//!
//! Checks: the graph's output equals candle eager's bit for bit on 8 fresh random inputs,
//! replayed one after the other; `verify` agrees.
//!
//! Build with the candle tier (candle's kernels need nvcc: `bash scripts/candle-tier.sh`
//! sets it up), run: `cargo run --release --features candle --example 12-candle-mlp`
//! (`-- --json` for machine-readable lines).

#[path = "common/candle_models.rs"]
mod candle_models;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use candle_models::Mlp;
use clap::Parser;
use graph_runtime::candle::candle_core::{self as candle, Device, Tensor};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime, Tolerance};
use workloads::check::first_mismatch;
use workloads::testing::{gpu_required, init_tracing, random_vec, seeded_rng};
use workloads::timing::{iters_for, wall_us};

/// candle eager against the same candle function as a CUDA graph: an MLP at batch 1.
#[derive(Parser)]
struct Args {
    /// Print one JSON line for the report after the table.
    #[arg(long)]
    json: bool,
    /// Layers of the MLP.
    #[arg(long, default_value_t = 16)]
    layers: usize,
    /// Width of every layer.
    #[arg(long, default_value_t = 512)]
    dim: usize,
}

// The function, as a candle user writes it; the attribute makes `MlpForwardGraph`.
#[cuda_graph(warmup = 2, verify = "never")]
fn mlp_forward(dev: &Device, x: &Tensor, #[state] mlp: &Mlp) -> candle::Result<Tensor> {
    let _ = dev;
    mlp.forward(x)
}

fn host(t: &Tensor) -> Result<Vec<f32>, candle::Error> {
    t.flatten_all()?.to_vec1::<f32>()
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    init_tracing();
    let dev = match Device::new_cuda(0) {
        Ok(dev) => dev,
        Err(e) if !gpu_required() => {
            eprintln!("skipped 12-candle-mlp: no usable GPU ({e})");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let rt = Runtime::from_candle(&dev)?;
    let stream = dev.as_cuda_device()?.cuda_stream();
    let mut rng = seeded_rng(12);
    let mlp = Mlp::new(&dev, args.layers, args.dim)?;
    let input = |rng: &mut _| Tensor::from_vec(random_vec(rng, args.dim), (1, args.dim), &dev);

    // Capture: 2 eager warmup runs, then one recorded run.
    let mut graph = MlpForwardGraph::capture(&rt, &input(&mut rng)?, &mlp)?;

    // Eager and graph on the same fresh inputs, one replay after the other.
    let mut identical = true;
    for _ in 0..8 {
        let x = input(&mut rng)?;
        let eager = host(&mlp.forward(&x)?)?;
        let ours = host(graph.replay(&x)?.result)?;
        identical &= first_mismatch(&eager, &ours).is_none();
    }
    let verified = graph
        .verify(&input(&mut rng)?, Tolerance::BITWISE)?
        .into_result()
        .is_ok();

    // Timing: host wall clock per call, the stream synchronized around each batch of calls.
    let x = input(&mut rng)?;
    let sync = |r: candle::Result<Tensor>| r.map(drop).map_err(|e| GraphError::User(e.into()));
    let probe = wall_us(&stream, 5, || sync(mlp.forward(&x)))?;
    let iters = iters_for(probe, 300_000.0, 20, 2000);
    let eager_us = wall_us(&stream, iters, || sync(mlp.forward(&x)))?;
    let graph_us = wall_us(&stream, iters, || graph.replay(&x).map(drop))?;

    let info = graph.info();
    println!(
        "candle MLP {}×(Linear {}→{} + GELU), batch 1, f32: graph of {} nodes ({} kernels, {} temporaries)\n",
        args.layers,
        args.dim,
        args.dim,
        info.nodes(),
        info.kinds.kernels,
        info.kinds.allocs
    );
    let mut t = Table::new(&["how", ">µs per call", ">speedup"]);
    t.row(vec!["candle eager".into(), us(eager_us), "1.00×".into()]);
    t.row(vec![
        "#[cuda_graph] replay (input copy included)".into(),
        us(graph_us),
        format!("{:.2}×", eager_us / graph_us),
    ]);
    print!("{}", t.to_markdown());
    println!(
        "\noutput, 8 fresh inputs: graph {} candle eager bitwise; verify: {}",
        if identical { "=" } else { "!=" },
        if verified { "bitwise" } else { "FAILED" }
    );
    if args.json {
        let what = format!(
            "candle MLP {}×(Linear {}→{} + GELU), batch 1",
            args.layers, args.dim, args.dim
        );
        let rec = Record::new(
            "candle",
            Side::Ours,
            "candle_mlp/1",
            what,
            eager_us,
            graph_us,
        )
        .shape("batch", 1)
        .shape("layers", args.layers)
        .shape("dim", args.dim)
        .kernels(info.kinds.kernels)
        .check(
            "output bitwise, candle eager vs graph, 8 inputs; verify",
            identical && verified,
        )
        .with("nodes", info.nodes());
        println!("{}", rec.line());
    }
    if !(identical && verified) {
        return Err("the graph's output differs from candle eager".into());
    }
    Ok(())
}
