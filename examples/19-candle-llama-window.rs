//! # 19 — a candle-transformers Llama over a fixed window as a graph (the real-models tier)
//!
//! Borrows from this workspace: `workloads` (random inputs, timing, tracing) and
//! `bench-report` (records, tables); the measurement lives in `examples/common/real_models.rs`.
//!
//! candle-transformers' `llama::Llama`, SmolLM2-135M-shaped (hidden 576, 30 layers, 9 heads,
//! 3 KV heads, MLP 1536, vocab 49152, rope theta 100000, tied embeddings), random weights from
//! a seeded `VarMap`, no downloads, f32, batch 1: one forward over a fixed window of 128
//! tokens from position 0, returning the last token's logits (what a prefill, or a
//! sliding-window scorer, runs). The cache does not grow: a `llama::Cache` made with
//! `use_kv_cache = false`, which keeps only the rotary tables and the causal mask (built by
//! the warmup, reused by the capture). Model and cache are used as they are, through
//! `graph_runtime::candle::ModelState`: the model by `&` (its `VarMap`'s tensors checked by
//! address), the cache by `&mut` (`forward` takes `&mut Cache`; lent back between replays
//! only as `&Cache`).
//!
//! Prints candle eager µs, graph µs (input copy included), the first eager call and the first
//! replay timed alone, capture ms, node count, `GraphInfo`'s memory figures with the runtime's
//! graph pool and the free memory the capture took; and whether the graph equals candle eager
//! bit for bit on several new windows and under `verify` (non-zero exit when not).
//!
//! Build with the candle tier (candle's kernels need nvcc: `bash scripts/candle-tier.sh`
//! sets it up), run: `cargo run --release --features candle --example 19-candle-llama-window`
//! (`-- --json` for the report's records, `-- --layers 4` for a quick run). PyTorch's figures
//! for the same model: `python3 scripts/torch_real_models.py --only llama_window`.

#[path = "common/real_models.rs"]
mod real_models;

use candle_transformers::models::llama::{self, LlamaEosToks};
use clap::Parser;
use graph_runtime::candle::candle_core::{self as candle, DType, Device, Tensor};
use graph_runtime::candle::candle_nn::{VarBuilder, VarMap};
use graph_runtime::candle::ModelState;
use graph_runtime::{cuda_graph, BoxError, Tolerance};
use rand::Rng;
use real_models::{finish, measure, Model};
use serde_json::json;
use workloads::testing::{init_tracing, seeded_rng};

/// candle-transformers' Llama over a 128-token window, candle eager against one graph.
#[derive(Parser)]
struct Args {
    /// Print the report's JSON record after the tables.
    #[arg(long)]
    json: bool,
    /// Tokens in the window.
    #[arg(long, default_value_t = 128)]
    window: usize,
    /// Transformer layers (SmolLM2-135M has 30; fewer for a quick run).
    #[arg(long, default_value_t = 30)]
    layers: usize,
    /// New windows on which the graph is compared with candle eager.
    #[arg(long, default_value_t = 6)]
    inputs: usize,
}

/// SmolLM2-135M's shape, as a candle-transformers config.
fn smollm2_135m(layers: usize) -> llama::Config {
    llama::Config {
        hidden_size: 576,
        intermediate_size: 1536,
        vocab_size: 49152,
        num_hidden_layers: layers,
        num_attention_heads: 9,
        num_key_value_heads: 3,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 100_000.0,
        bos_token_id: Some(1),
        eos_token_id: Some(LlamaEosToks::Single(2)),
        rope_scaling: None,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
    }
}

// The forward as a candle-transformers user calls it; the attribute makes
// `LlamaWindowGraph`. The window starts at position 0, so nothing depends on a position.
#[cuda_graph(warmup = 2, verify = "never")]
fn llama_window(
    dev: &Device,
    tokens: &Tensor,
    #[state] model: &ModelState<llama::Llama>,
    #[state] cache: &mut ModelState<llama::Cache>,
) -> candle::Result<Tensor> {
    let _ = dev;
    model.model().forward(tokens, 0, cache.model_mut())
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    init_tracing();
    let Some((dev, rt, stream)) = real_models::device_or_skip("19-candle-llama-window", 19)? else {
        return Ok(());
    };
    let cfg = smollm2_135m(args.layers.max(1));
    let varmap = VarMap::new();
    let model = llama::Llama::load(VarBuilder::from_varmap(&varmap, DType::F32, &dev), &cfg)?;
    let model = ModelState::from_varmap(model, &varmap);
    // No KV cache: rotary tables and the causal mask only, one cache for eager, one for the
    // graph.
    let new_cache = || llama::Cache::new(false, DType::F32, &cfg, &dev);
    let mut eager_cache = new_cache()?;
    let graph_cache = ModelState::new(new_cache()?, []);
    let mut rng = seeded_rng(19);
    let window = args.window;
    let m = Model {
        input: || {
            let ids: Vec<u32> = (0..window)
                .map(|_| rng.random_range(0..cfg.vocab_size as u32))
                .collect();
            Tensor::from_vec(ids, (1, window), &dev)
        },
        eager: |x: &Tensor| model.model().forward(x, 0, &mut eager_cache),
        capture: |x: &Tensor| LlamaWindowGraph::capture(&rt, x, &model, graph_cache),
        replay: |g: &mut LlamaWindowGraph<'_>, x: &Tensor| Ok(g.replay(x)?.result.clone()),
        verify: |g: &mut LlamaWindowGraph<'_>, x: &Tensor| {
            Ok(g.verify(x, Tolerance::BITWISE)?.is_ok())
        },
        types: std::marker::PhantomData,
    };
    let row = measure(
        &rt,
        &stream,
        format!("llama_window/{window}"),
        format!(
            "Llama SmolLM2-135M-shaped ({} layers), {window}-token window, batch 1",
            cfg.num_hidden_layers
        ),
        vec![
            ("batch", json!(1)),
            ("window", json!(window)),
            ("layers", json!(cfg.num_hidden_layers)),
            ("hidden", json!(cfg.hidden_size)),
        ],
        args.inputs,
        m,
        |g: &LlamaWindowGraph<'_>| g.info().clone(),
    )?;
    println!(
        "candle-transformers Llama, SmolLM2-135M-shaped ({} layers, hidden {}, {} heads / {} KV heads, vocab {}), \
         random weights, f32, batch 1, one forward over a {window}-token window (no KV cache): candle eager \
         against one #[cuda_graph]\n",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.vocab_size
    );
    finish(&[row], args.json)
}
