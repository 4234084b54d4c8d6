//! # 18 — a candle-transformers ResNet-18 as a graph (the real-models tier)
//!
//! Borrows from this workspace: `workloads` (random inputs, timing, tracing) and
//! `bench-report` (records, tables); the measurement lives in `examples/common/real_models.rs`.
//!
//! candle-transformers' `resnet::resnet18` (1000 classes), random weights from a seeded
//! `VarMap`, no downloads, f32, batch 1, 224×224 images. What it returns is a
//! `candle_nn::Func<'static>`, a closure over its layers: the graph holds it as it is, through
//! `graph_runtime::candle::ModelState<Func<'static>>` (the closure plus every tensor of its
//! `VarMap`, checked by address).
//!
//! Prints candle eager µs, graph µs (input copy included), the first eager call and the first
//! replay timed alone, capture ms, node count, `GraphInfo`'s memory figures with the runtime's
//! graph pool and the free memory the capture took; and whether the graph equals candle eager
//! bit for bit on several new images and under `verify` (non-zero exit when not).
//!
//! Build with the candle tier (candle's kernels need nvcc: `bash scripts/candle-tier.sh`
//! sets it up), run: `cargo run --release --features candle --example 18-candle-resnet`
//! (`-- --json` for the report's records). PyTorch's figures for the same model:
//! `python3 scripts/torch_real_models.py --only resnet18`.

#[path = "common/real_models.rs"]
mod real_models;

use candle_transformers::models::resnet;
use clap::Parser;
use graph_runtime::candle::candle_core::{self as candle, DType, Device, Module, Tensor};
use graph_runtime::candle::candle_nn::{Func, VarBuilder, VarMap};
use graph_runtime::candle::ModelState;
use graph_runtime::{cuda_graph, BoxError, Tolerance};
use real_models::{finish, measure, Model};
use serde_json::json;
use workloads::testing::{init_tracing, random_vec, seeded_rng};

/// candle-transformers' ResNet-18, candle eager against the same forward as a graph.
#[derive(Parser)]
struct Args {
    /// Print the report's JSON record after the tables.
    #[arg(long)]
    json: bool,
    /// Images per forward.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Image height and width.
    #[arg(long, default_value_t = 224)]
    size: usize,
    /// New images on which the graph is compared with candle eager.
    #[arg(long, default_value_t = 6)]
    inputs: usize,
}

// The forward as a candle-transformers user calls it; the attribute makes `ResnetForwardGraph`.
#[cuda_graph(warmup = 2, verify = "never")]
fn resnet_forward(
    dev: &Device,
    images: &Tensor,
    #[state] net: &ModelState<Func<'static>>,
) -> candle::Result<Tensor> {
    let _ = dev;
    net.model().forward(images)
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    init_tracing();
    let Some((dev, rt, stream)) = real_models::device_or_skip("18-candle-resnet", 18)? else {
        return Ok(());
    };
    let varmap = VarMap::new();
    let func: Func<'static> =
        resnet::resnet18(1000, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    let net = ModelState::from_varmap(func, &varmap);
    let mut rng = seeded_rng(18);
    let (batch, size) = (args.batch, args.size);
    let dims = (batch, 3, size, size);
    let m = Model {
        input: || Tensor::from_vec(random_vec(&mut rng, batch * 3 * size * size), dims, &dev),
        eager: |x: &Tensor| net.model().forward(x),
        capture: |x: &Tensor| ResnetForwardGraph::capture(&rt, x, &net),
        replay: |g: &mut ResnetForwardGraph<'_>, x: &Tensor| Ok(g.replay(x)?.result.clone()),
        verify: |g: &mut ResnetForwardGraph<'_>, x: &Tensor| {
            Ok(g.verify(x, Tolerance::BITWISE)?.is_ok())
        },
        types: std::marker::PhantomData,
    };
    let row = measure(
        &rt,
        &stream,
        format!("resnet18/{batch}"),
        format!("ResNet-18, batch {batch}, {size}×{size}"),
        vec![("batch", json!(batch)), ("size", json!(size))],
        args.inputs,
        m,
        |g: &ResnetForwardGraph<'_>| g.info().clone(),
    )?;
    println!(
        "candle-transformers resnet18 (a Func<'static>, 1000 classes), random weights, f32, batch {batch}, \
         {size}×{size}: candle eager against one #[cuda_graph]\n"
    );
    finish(&[row], args.json)
}
