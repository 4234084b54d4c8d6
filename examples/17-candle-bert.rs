//! # 17 — a candle-transformers BERT as a graph (the real-models tier)
//!
//! Borrows from this workspace: `workloads` (random inputs, timing, tracing) and
//! `bench-report` (records, tables); the measurement lives in `examples/common/real_models.rs`.
//!
//! candle-transformers' `bert::BertModel` at MiniLM's size (hidden 384, 6 layers, 12 heads,
//! intermediate 1536, vocab 30522, 512 positions), random weights from a seeded `VarMap`, no
//! downloads, f32, sequence 128, at batch 1 and 8. The model is used as it is: held through
//! `graph_runtime::candle::ModelState` (the model plus every tensor of its `VarMap`, checked
//! by address), its `forward` called in a `#[cuda_graph]` function; one graph per batch size.
//!
//! Prints, per batch size: candle eager µs, graph µs (input copies included), the first eager
//! call and the first replay timed alone, capture ms, node count, `GraphInfo`'s memory figures
//! with the runtime's graph pool and the free memory the capture took; and whether the graph
//! equals candle eager bit for bit on several new inputs and under `verify` (non-zero exit
//! when not).
//!
//! Build with the candle tier (candle's kernels need nvcc: `bash scripts/candle-tier.sh`
//! sets it up), run: `cargo run --release --features candle --example 17-candle-bert`
//! (`-- --json` for the report's records). PyTorch's figures for the same model:
//! `python3 scripts/torch_real_models.py --only bert`.

#[path = "common/real_models.rs"]
mod real_models;

use candle_transformers::models::bert::{self, BertModel};
use clap::Parser;
use graph_runtime::candle::candle_core::{self as candle, DType, Device, Tensor};
use graph_runtime::candle::candle_nn::{VarBuilder, VarMap};
use graph_runtime::candle::ModelState;
use graph_runtime::{cuda_graph, BoxError, Tolerance};
use rand::Rng;
use real_models::{finish, measure, Model};
use serde_json::json;
use workloads::testing::{init_tracing, seeded_rng};

/// candle-transformers' BERT (MiniLM-sized), candle eager against the same forward as a graph.
#[derive(Parser)]
struct Args {
    /// Print the report's JSON records after the tables.
    #[arg(long)]
    json: bool,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8])]
    batches: Vec<usize>,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// New inputs on which the graph is compared with candle eager.
    #[arg(long, default_value_t = 6)]
    inputs: usize,
}

/// MiniLM-L6's shape (sentence-transformers' all-MiniLM-L6-v2) as a candle-transformers config.
fn minilm() -> bert::Config {
    bert::Config {
        vocab_size: 30522,
        hidden_size: 384,
        num_hidden_layers: 6,
        num_attention_heads: 12,
        intermediate_size: 1536,
        hidden_act: bert::HiddenAct::Gelu,
        max_position_embeddings: 512,
        type_vocab_size: 2,
        layer_norm_eps: 1e-12,
        ..bert::Config::default()
    }
}

// The forward as a candle-transformers user calls it; the attribute makes `BertForwardGraph`.
#[cuda_graph(warmup = 2, verify = "never")]
fn bert_forward(
    dev: &Device,
    ids: &Tensor,
    types: &Tensor,
    #[state] bert: &ModelState<BertModel>,
) -> candle::Result<Tensor> {
    let _ = dev;
    bert.model().forward(ids, types, None)
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    init_tracing();
    let Some((dev, rt, stream)) = real_models::device_or_skip("17-candle-bert", 17)? else {
        return Ok(());
    };
    let cfg = minilm();
    let varmap = VarMap::new();
    let model = BertModel::load(VarBuilder::from_varmap(&varmap, DType::F32, &dev), &cfg)?;
    let bert = ModelState::from_varmap(model, &varmap);
    let mut rng = seeded_rng(17);
    let seq = args.seq;

    let mut rows = Vec::new();
    for &batch in &args.batches {
        // Token ids and token types, drawn anew for every input.
        let input = || -> candle::Result<(Tensor, Tensor)> {
            let n = batch * seq;
            let ids: Vec<u32> = (0..n)
                .map(|_| rng.random_range(0..cfg.vocab_size as u32))
                .collect();
            let types: Vec<u32> = (0..n).map(|_| rng.random_range(0..2)).collect();
            Ok((
                Tensor::from_vec(ids, (batch, seq), &dev)?,
                Tensor::from_vec(types, (batch, seq), &dev)?,
            ))
        };
        let m = Model {
            input,
            eager: |(ids, types): &(Tensor, Tensor)| bert.model().forward(ids, types, None),
            capture: |(ids, types): &(Tensor, Tensor)| {
                BertForwardGraph::capture(&rt, ids, types, &bert)
            },
            replay: |g: &mut BertForwardGraph<'_>, (ids, types): &(Tensor, Tensor)| {
                Ok(g.replay(ids, types)?.result.clone())
            },
            verify: |g: &mut BertForwardGraph<'_>, (ids, types): &(Tensor, Tensor)| {
                Ok(g.verify(ids, types, Tolerance::BITWISE)?.is_ok())
            },
            types: std::marker::PhantomData,
        };
        rows.push(measure(
            &rt,
            &stream,
            format!("bert/{batch}"),
            format!("BERT MiniLM-sized (6 layers, hidden 384), batch {batch}, sequence {seq}"),
            vec![
                ("batch", json!(batch)),
                ("seq", json!(seq)),
                ("layers", json!(cfg.num_hidden_layers)),
                ("hidden", json!(cfg.hidden_size)),
            ],
            args.inputs,
            m,
            |g: &BertForwardGraph<'_>| g.info().clone(),
        )?);
    }
    println!(
        "candle-transformers BertModel, MiniLM-sized (hidden {}, {} layers, {} heads, intermediate {}, vocab {}), \
         random weights, f32, sequence {seq}: candle eager against one #[cuda_graph] per batch size\n",
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.intermediate_size,
        cfg.vocab_size
    );
    finish(&rows, args.json)
}
