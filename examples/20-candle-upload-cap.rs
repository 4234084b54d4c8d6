//! # 20 — models that upload a host tensor in every forward, at their usual lengths
//!
//! Borrows from this workspace: `workloads` (random inputs, timing, tracing) and
//! `bench-report` (records, tables); the measurement lives in `examples/common/real_models.rs`,
//! the models in `examples/common/upload_cap.rs`.
//!
//! candle-transformers 0.11's T5 encoder (t5-small's shape), Qwen2 (0.5B's shape) and Phi
//! (1.5's shape), random weights from a seeded `VarMap`, no downloads, f32, batch 1: one
//! forward over a window of 64, 128 and 512 tokens from position 0 (what an encoder, a prefill
//! or a window scorer runs), each held as it is through `ModelState` (`&mut`, since their
//! `forward` takes `&mut self`; the weights are listed as read, so nothing is snapshotted).
//! Each builds a host tensor in every forward and uploads it (T5's relative-position
//! buckets, Qwen2's and Phi's causal masks), and candle-core 0.11 serves an upload inside a
//! capture only from a cache of the warmup's uploads of at most 4096 bytes.
//!
//! So with candle-core as published the longer windows cannot be captured: the example
//! reports the runtime's typed error (`GraphError::HostUploadInCapture`, naming the limit and,
//! with `RUST_BACKTRACE=1`, the call) for them and measures the ones that fit. Built against
//! candle-core with a raised limit (`bash scripts/candle-upload-cap-bundle.sh`, which patches
//! it with `scripts/candle-upload-cap.sh` in a copy of the workspace and sets
//! `CUDA_GRAPH_CANDLE_UPLOAD_CAP` for the build) every window captures.
//!
//! For each model and length it prints: the bytes uploaded per forward, whether the capture
//! succeeded (or the error), candle eager µs, graph µs (input copy included), the speedup,
//! and whether the graph equalled candle eager bit for bit on several new token windows, one
//! replay after the other, and under `verify`. Exit status non-zero when a graph disagreed
//! with candle eager, or when a capture's outcome contradicts the limit the build claims (a
//! window under the limit refused, or one above it captured).
//!
//! Build with the candle tier (`bash scripts/candle-tier.sh` sets nvcc up), run:
//! `cargo run --release --features candle --example 20-candle-upload-cap`
//! (`-- --layers 2` for a quick run, `-- --only qwen2 --tokens 32,64`, `-- --json` for the
//! report's records of the captured windows).

#[path = "common/real_models.rs"]
mod real_models;
#[path = "common/upload_cap.rs"]
mod upload_cap;

use bench_report::table::{us, Table};
use clap::Parser;
use graph_runtime::candle::candle_core::{Device, Tensor};
use graph_runtime::{BoxError, GraphError, Tolerance};
use real_models::{measure, Figures, Model};
use serde_json::json;
use upload_cap::{describe, upload_cap, window_step, Family, Kind, Size, WindowStepGraph};
use workloads::testing::{init_tracing, seeded_rng};
use workloads::timing::{iters_for, wall_us};

/// T5, Qwen2 and Phi windows, candle eager against one graph per window length.
#[derive(Parser)]
struct Args {
    /// Print the report's JSON records (captured windows) after the tables.
    #[arg(long)]
    json: bool,
    /// Window lengths, in tokens.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 128, 512])]
    tokens: Vec<usize>,
    /// Transformer layers of every model (default: the published count, 6 / 24 / 24).
    #[arg(long)]
    layers: Option<usize>,
    /// Only these models (t5, qwen2, phi).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// New windows on which each graph is compared with candle eager.
    #[arg(long, default_value_t = 4)]
    inputs: usize,
}

/// One model at one length.
struct Row {
    kind: Kind,
    tokens: usize,
    upload: usize,
    outcome: Outcome,
}

enum Outcome {
    /// Captured: the index of its figures.
    Captured(usize),
    /// The capture was refused with the typed error; candle eager µs.
    Refused { error: GraphError, eager_us: f64 },
}

/// The upload error, under the capture's wrapping.
fn upload_refusal(e: &GraphError) -> Option<&GraphError> {
    match e {
        GraphError::HostUploadInCapture { .. } => Some(e),
        GraphError::Body { source, .. } => upload_refusal(source),
        _ => None,
    }
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    init_tracing();
    let Some((dev, rt, stream)) = real_models::device_or_skip("20-candle-upload-cap", 20)? else {
        return Ok(());
    };
    let cap = upload_cap();
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| args.only.is_empty() || args.only.iter().any(|o| o == k.key()))
        .collect();
    let size = Size::Published {
        layers: args.layers,
    };
    let mut rng = seeded_rng(20);
    let mut rows = Vec::new();
    let mut figures = Vec::new();
    for &kind in &kinds {
        let family = Family::new(kind, size, &dev)?;
        for &tokens in &args.tokens {
            let mut eager_state = family.state(&dev)?;
            let graph_state = family.state(&dev)?;
            let m = Model {
                input: || family.tokens(&mut rng, tokens, &dev),
                eager: |x: &Tensor| window_step(&dev, x, &mut eager_state),
                capture: |x: &Tensor| WindowStepGraph::capture(&rt, x, graph_state),
                replay: |g: &mut WindowStepGraph<'_>, x: &Tensor| Ok(g.replay(x)?.result.clone()),
                verify: |g: &mut WindowStepGraph<'_>, x: &Tensor| {
                    Ok(g.verify(x, Tolerance::BITWISE)?.is_ok())
                },
                types: std::marker::PhantomData,
            };
            let measured = measure(
                &rt,
                &stream,
                format!("upload_cap/{}/{tokens}", kind.key()),
                format!("{}, {tokens} tokens", describe(kind, size)),
                vec![
                    ("batch", json!(1)),
                    ("tokens", json!(tokens)),
                    ("upload_bytes", json!(kind.upload_bytes(tokens))),
                    ("upload_cap_bytes", json!(cap)),
                ],
                args.inputs,
                m,
                |g: &WindowStepGraph<'_>| g.info().clone(),
            );
            let outcome = match measured {
                Ok(f) => {
                    figures.push(f);
                    Outcome::Captured(figures.len() - 1)
                }
                Err(e) => match e.downcast::<GraphError>() {
                    Ok(e) if upload_refusal(&e).is_some() => {
                        let eager_us = eager_only(&family, &dev, &stream, &mut rng, tokens)?;
                        Outcome::Refused {
                            error: *e,
                            eager_us,
                        }
                    }
                    Ok(e) => return Err(e as BoxError),
                    Err(e) => return Err(e),
                },
            };
            rows.push(Row {
                kind,
                tokens,
                upload: kind.upload_bytes(tokens),
                outcome,
            });
        }
    }
    report(&rows, &figures, cap, &kinds, size, args.json)
}

/// candle eager µs per window, for a window the graph could not capture.
fn eager_only(
    family: &Family,
    dev: &Device,
    stream: &std::sync::Arc<graph_runtime::cudarc::driver::CudaStream>,
    rng: &mut rand::rngs::SmallRng,
    tokens: usize,
) -> Result<f64, BoxError> {
    let mut state = family.state(dev)?;
    let x = family.tokens(rng, tokens, dev)?;
    let mut run = || {
        window_step(dev, &x, &mut state)
            .map(drop)
            .map_err(|e| GraphError::User(e.into()))
    };
    let probe = wall_us(stream, 3, &mut run)?;
    let iters = iters_for(probe, 300_000.0, 10, 1000);
    Ok(wall_us(stream, iters, run)?)
}

fn report(
    rows: &[Row],
    figures: &[Figures],
    cap: usize,
    kinds: &[Kind],
    size: Size,
    json: bool,
) -> Result<(), BoxError> {
    let stock = cap == upload_cap::STOCK_CAP;
    println!(
        "candle-transformers 0.11 models that upload a host tensor in every forward, random weights, f32, \
         batch 1, one forward over a window from position 0: candle eager against one #[cuda_graph] per \
         length. candle-core's capture upload limit in this build: {cap} bytes per upload ({}).\n",
        if stock {
            "candle-core as published".to_owned()
        } else {
            format!(
                "raised by scripts/candle-upload-cap.sh, as {} says",
                upload_cap::CAP_ENV
            )
        }
    );
    for k in kinds {
        println!(
            "  {}: uploads its {} every forward",
            describe(*k, size),
            k.upload_what()
        );
    }
    println!();
    let mut t = Table::new(&[
        "model",
        ">tokens",
        ">host upload per forward",
        "capture",
        ">candle eager µs",
        ">graph µs",
        ">speedup",
        "graph = candle eager",
    ]);
    let mut wrong = Vec::new();
    for r in rows {
        let (capture, eager_us, graph, speedup, agree) = match &r.outcome {
            Outcome::Captured(i) => {
                let f = &figures[*i];
                if !f.agree() {
                    wrong.push(format!(
                        "{} at {} tokens: graph != candle eager",
                        r.kind.key(),
                        r.tokens
                    ));
                }
                (
                    format!("ok ({:.0} ms)", f.capture_ms),
                    f.eager_us,
                    us(f.graph_us),
                    format!("{:.2}×", f.eager_us / f.graph_us),
                    format!(
                        "{} on {} new windows; verify {}",
                        if f.bitwise { "bitwise" } else { "DIFFERS" },
                        f.inputs,
                        if f.verified { "bitwise" } else { "FAILED" }
                    ),
                )
            }
            Outcome::Refused { eager_us, .. } => (
                "HostUploadInCapture".to_owned(),
                *eager_us,
                "—".to_owned(),
                "—".to_owned(),
                "—".to_owned(),
            ),
        };
        let captured = matches!(r.outcome, Outcome::Captured(_));
        if captured != (r.upload <= cap) {
            wrong.push(format!(
                "{} at {} tokens uploads {} bytes per forward and the build's limit is {cap}, yet the capture {}",
                r.kind.key(),
                r.tokens,
                r.upload,
                if captured { "succeeded" } else { "was refused" }
            ));
        }
        t.row(vec![
            r.kind.key().to_owned(),
            r.tokens.to_string(),
            bytes(r.upload),
            capture,
            us(eager_us),
            graph,
            speedup,
            agree,
        ]);
    }
    print!("{}", t.to_markdown());
    println!();
    if let Some((r, e)) = rows.iter().find_map(|r| match &r.outcome {
        Outcome::Refused { error, .. } => Some((r, error)),
        Outcome::Captured(_) => None,
    }) {
        println!(
            "the refusal ({} at {} tokens), as the user sees it: {e}\n",
            r.kind.key(),
            r.tokens
        );
    }
    if !figures.is_empty() {
        real_models::print(figures);
    }
    if json {
        for f in figures {
            // Their own family: the real-models tier's targets are about the models of 17-19.
            println!("{}", f.record_in("upload_cap").line());
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; ").into())
    }
}

fn bytes(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.0} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}
