//! The models of `20-candle-upload-cap` and of `tests/candle.rs`'s upload-cap test: three
//! candle-transformers 0.11 models that build a host tensor and upload it in every forward,
//! held as they are (random `VarMap` weights, f32, batch 1), one forward over a window of
//! tokens from position 0:
//!
//! * a T5 encoder (`t5::T5EncoderModel`): the relative-position buckets, `tokens²` u32;
//! * a Qwen2 (`qwen2::Model`, the hidden states): the causal mask, `tokens²` f32;
//! * a Phi (`phi::Model`, the last token's logits): the causal mask, `tokens²` u8.
//!
//! candle-core 0.11 serves an upload inside a capture only from a cache of the warmup's
//! uploads of at most 4096 bytes, so above 32 tokens (T5, Qwen2) and 64 tokens (Phi) these
//! cannot be captured with candle-core as published; `scripts/candle-upload-cap.sh` raises
//! the limit. [`upload_cap`] is the limit this program was built against.
//!
//! Qwen2's and Phi's `forward` takes `&mut self` and stores the window's keys and values in a
//! cache of its own (grown with `Tensor::cat` on the next call): the window step clears it
//! *after* the forward, so that what a call drops is what the call made (cleared before the
//! forward, the capture would free the previous call's tensors: `FreedInCapture`).

#![allow(dead_code)] // each program uses part of it

use candle_transformers::models::{phi, qwen2, t5};
use graph_runtime::candle::candle_core::{self as candle, DType, Device, Tensor};
use graph_runtime::candle::candle_nn::{Activation, VarBuilder, VarMap};
use graph_runtime::candle::ModelState;
use graph_runtime::cuda_graph;
use rand::Rng;

/// What candle-core 0.11 as published caches per upload inside a capture, in bytes
/// (`CUDA_GRAPH_HTOD_CACHE_MAX_BYTES`).
pub const STOCK_CAP: usize = 4096;

/// The environment variable that says, at build time, that candle-core was built with a
/// raised limit, and which: set by `scripts/candle-upload-cap-bundle.sh` to the bytes it gave
/// `scripts/candle-upload-cap.sh`. Unset: candle-core as published.
pub const CAP_ENV: &str = "CUDA_GRAPH_CANDLE_UPLOAD_CAP";

/// candle-core's capture upload limit this program was built against, in bytes: the value of
/// `CUDA_GRAPH_CANDLE_UPLOAD_CAP` when it was compiled, [`STOCK_CAP`] without it. A claim
/// about the build, which the captures check: a build that says so and was not patched
/// (or the other way round) fails them.
pub fn upload_cap() -> usize {
    match option_env!("CUDA_GRAPH_CANDLE_UPLOAD_CAP") {
        Some(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{CAP_ENV}={v:?} is not a number of bytes")),
        None => STOCK_CAP,
    }
}

/// Which of the three models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    T5,
    Qwen2,
    Phi,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::T5, Kind::Qwen2, Kind::Phi];

    /// Its name on the command line and in records.
    pub fn key(self) -> &'static str {
        match self {
            Kind::T5 => "t5",
            Kind::Qwen2 => "qwen2",
            Kind::Phi => "phi",
        }
    }

    /// The host tensor it uploads in every forward over `tokens` tokens, in bytes.
    pub fn upload_bytes(self, tokens: usize) -> usize {
        let square = tokens * tokens;
        match self {
            Kind::T5 => square * 4,    // relative-position buckets, u32
            Kind::Qwen2 => square * 4, // causal mask, f32
            Kind::Phi => square,       // causal mask, u8
        }
    }

    /// What that tensor is.
    pub fn upload_what(self) -> &'static str {
        match self {
            Kind::T5 => "relative-position buckets (u32)",
            Kind::Qwen2 => "causal mask (f32)",
            Kind::Phi => "causal mask (u8)",
        }
    }
}

/// How large a model.
#[derive(Clone, Copy, Debug)]
pub enum Size {
    /// The published shape (t5-small, Qwen2-0.5B, Phi-1.5), with `layers` transformer layers
    /// when given (fewer for a quick run).
    Published { layers: Option<usize> },
    /// Two layers, width 64, vocabulary 256: for tests.
    Tiny,
}

/// A model's configuration.
#[derive(Clone, Debug)]
pub enum Config {
    T5(t5::Config),
    Qwen2(qwen2::Config),
    /// Phi's fields are private to candle-transformers: its vocabulary is kept beside it.
    Phi(phi::Config, usize),
}

impl Config {
    pub fn new(kind: Kind, size: Size) -> candle::Result<Self> {
        let tiny = matches!(size, Size::Tiny);
        let layers = |published: usize| match size {
            Size::Published { layers } => layers.unwrap_or(published).max(1),
            Size::Tiny => 2,
        };
        Ok(match kind {
            // t5-small's encoder: candle-transformers' default configuration.
            Kind::T5 => {
                let mut c = t5::Config::default();
                c.num_layers = layers(c.num_layers);
                c.is_decoder = false;
                if tiny {
                    (c.vocab_size, c.d_model, c.d_kv, c.d_ff, c.num_heads) = (256, 64, 16, 128, 4);
                }
                Config::T5(c)
            }
            // Qwen2-0.5B.
            Kind::Qwen2 => {
                let (vocab, hidden, inter, heads, kv) = if tiny {
                    (256, 64, 128, 4, 2)
                } else {
                    (151_936, 896, 4864, 14, 2)
                };
                Config::Qwen2(qwen2::Config {
                    vocab_size: vocab,
                    hidden_size: hidden,
                    intermediate_size: inter,
                    num_hidden_layers: layers(24),
                    num_attention_heads: heads,
                    num_key_value_heads: kv,
                    max_position_embeddings: if tiny { 1024 } else { 32_768 },
                    sliding_window: 32_768,
                    max_window_layers: 21,
                    tie_word_embeddings: true,
                    rope_theta: 1_000_000.0,
                    rms_norm_eps: 1e-6,
                    use_sliding_window: false,
                    hidden_act: Activation::Silu,
                })
            }
            // Phi-1.5 (its fields are the crate's own: read from its config.json form).
            Kind::Phi => {
                let (hidden, inter, heads) = if tiny { (64, 128, 4) } else { (2048, 8192, 32) };
                let vocab = if tiny { 256 } else { 51_200 };
                let json = serde_json::json!({
                    "vocab_size": vocab,
                    "hidden_size": hidden,
                    "intermediate_size": inter,
                    "num_hidden_layers": layers(24),
                    "num_attention_heads": heads,
                    "num_key_value_heads": null,
                    "hidden_act": "gelu_new",
                    "max_position_embeddings": 2048,
                    "layer_norm_eps": 1e-5,
                    "tie_word_embeddings": false,
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5,
                    "qk_layernorm": false,
                });
                Config::Phi(
                    serde_json::from_value(json).map_err(candle::Error::wrap)?,
                    vocab,
                )
            }
        })
    }

    pub fn vocab(&self) -> usize {
        match self {
            Config::T5(c) => c.vocab_size,
            Config::Qwen2(c) => c.vocab_size,
            Config::Phi(_, vocab) => *vocab,
        }
    }
}

/// The model in words, for `kind` of `size`.
pub fn describe(kind: Kind, size: Size) -> String {
    let layers = |published: usize| match size {
        Size::Published { layers } => layers.unwrap_or(published).max(1),
        Size::Tiny => 2,
    };
    let tiny = matches!(size, Size::Tiny);
    match (kind, tiny) {
        (Kind::T5, false) => format!(
            "T5 encoder, t5-small-shaped (d_model 512, {} layers, 8 heads, vocab 32128)",
            layers(6)
        ),
        (Kind::Qwen2, false) => format!(
            "Qwen2, 0.5B-shaped (hidden 896, {} layers, 14 heads / 2 KV heads, vocab 151936)",
            layers(24)
        ),
        (Kind::Phi, false) => format!(
            "Phi, 1.5-shaped (hidden 2048, {} layers, 32 heads, vocab 51200)",
            layers(24)
        ),
        (kind, true) => format!("{} (2 layers, width 64, vocab 256)", kind.key()),
    }
}

/// One of the three models, loaded from a `VarMap`.
pub enum Window {
    T5(t5::T5EncoderModel),
    Qwen2(qwen2::Model),
    Phi(phi::Model),
}

impl Window {
    /// One forward over `tokens` (`(1, n)` u32) from position 0: T5's and Qwen2's hidden
    /// states, Phi's last-token logits. The decoders' own KV caches are cleared after the
    /// forward (see the module docs).
    pub fn forward(&mut self, tokens: &Tensor) -> candle::Result<Tensor> {
        match self {
            Window::T5(m) => m.forward(tokens),
            Window::Qwen2(m) => {
                let out = m.forward(tokens, 0, None);
                m.clear_kv_cache();
                out
            }
            Window::Phi(m) => {
                let out = m.forward(tokens);
                m.clear_kv_cache();
                out
            }
        }
    }
}

/// One window forward as a graph (`WindowStepGraph`): the model held as it is, `&mut` because
/// its `forward` takes `&mut self`, in a `ModelState` that lists its `VarMap`'s tensors as
/// read (nothing snapshotted, nothing compared by `verify` but the output).
#[cuda_graph(warmup = 2, verify = "never")]
pub fn window_step(
    dev: &Device,
    tokens: &Tensor,
    #[state] model: &mut ModelState<Window>,
) -> candle::Result<Tensor> {
    let _ = dev;
    model.model_mut().forward(tokens)
}

/// A model's weights (random, seeded by the device's seed) and configuration: load it as many
/// times as needed, every copy reading the same tensors.
pub struct Family {
    pub kind: Kind,
    pub config: Config,
    pub varmap: VarMap,
}

impl Family {
    /// Creates the weights. candle-nn's initialisers leave norm scales and biases constant
    /// (T5's norm scales at zero, which would zero every output): every variable of rank 1 is
    /// then drawn again, norm scales ("…weight") from N(1, 0.1), biases from N(0, 0.1).
    pub fn new(kind: Kind, size: Size, dev: &Device) -> candle::Result<Self> {
        let config = Config::new(kind, size)?;
        let family = Family {
            kind,
            config,
            varmap: VarMap::new(),
        };
        drop(family.load(dev)?);
        let data = family
            .varmap
            .data()
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut vars: Vec<_> = data.iter().collect();
        vars.sort_by(|a, b| a.0.cmp(b.0));
        for (name, var) in vars {
            if var.as_tensor().rank() == 1 {
                let mean = if name.ends_with("weight") { 1f32 } else { 0f32 };
                var.set(&Tensor::randn(mean, 0.1f32, var.dims(), dev)?)?;
            }
        }
        drop(data);
        Ok(family)
    }

    /// A model reading this family's weights.
    pub fn load(&self, dev: &Device) -> candle::Result<Window> {
        let vb = VarBuilder::from_varmap(&self.varmap, DType::F32, dev);
        Ok(match &self.config {
            Config::T5(c) => Window::T5(t5::T5EncoderModel::load(vb, c)?),
            Config::Qwen2(c) => Window::Qwen2(qwen2::Model::new(c, vb)?),
            Config::Phi(c, _) => Window::Phi(phi::Model::new(c, vb)?),
        })
    }

    /// A model reading this family's weights as a graph's state, every variable listed as
    /// read.
    pub fn state(&self, dev: &Device) -> candle::Result<ModelState<Window>> {
        Ok(ModelState::from_varmap(self.load(dev)?, &self.varmap))
    }

    /// `n` random token ids, `(1, n)` u32.
    pub fn tokens(&self, rng: &mut impl Rng, n: usize, dev: &Device) -> candle::Result<Tensor> {
        let vocab = self.config.vocab() as u32;
        let ids: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab)).collect();
        Tensor::from_vec(ids, (1, n), dev)
    }
}
