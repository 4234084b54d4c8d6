//! The report's three outputs: Markdown (`report.md`), JSON (`report.json`) and the SVG
//! figure (`speedup.svg`).

use serde_json::{json, Map, Value};

use crate::record::{Record, Side};
use crate::summary::{measured, Report, REAL_MODELS};
use crate::svg::{self, Panel, Series};
use crate::table::Table;

impl Report {
    /// The SVG figure: speedup against kernels per graph, and against batch size.
    pub fn svg(&self) -> String {
        let speedups = |side: Side, bench: &str, x: &str| -> Vec<(f64, f64)> {
            let mut v: Vec<(f64, f64)> = self
                .of(side, bench)
                .filter_map(|r| Some((r.shape_num(x)?, r.speedup())))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        };
        let line = |label: &str, points, color: &str, dashed| Series {
            label: label.to_owned(),
            points,
            color: color.to_owned(),
            line: true,
            dashed,
        };
        let mut a = Panel {
            title: "Speedup against kernels per graph".into(),
            x_label: "kernels per call (kernel nodes of the graph)".into(),
            y_label: "eager time / graph time".into(),
            series: vec![
                line(
                    "ours: chain of tiny kernels",
                    speedups(Side::Ours, "chain", "kernels_n"),
                    "#1f77b4",
                    false,
                ),
                line(
                    "PyTorch: chain",
                    speedups(Side::Torch, "chain", "kernels_n"),
                    "#ff7f0e",
                    true,
                ),
            ],
        };
        let colors = ["#2ca02c", "#d62728", "#9467bd", "#8c564b"];
        // One point per model workload of ours: the MLP at batch 1 and every benchmark
        // that is neither the MLP sweep nor the chain.
        let models: Vec<&Record> = self
            .records
            .iter()
            .filter(|r| r.side == Side::Ours)
            .filter(|r| match r.bench.as_str() {
                "mlp" => r.shape_num("batch") == Some(1.0),
                "chain" => false,
                _ => true,
            })
            .collect();
        for (i, r) in models.iter().enumerate() {
            if let (Some(k), true) = (r.kernels, measured(r)) {
                let label = match r.bench.as_str() {
                    "mlp" => "MLP b=1".to_owned(),
                    b => b.replace('_', " "),
                };
                a.series.push(Series {
                    label,
                    points: vec![(k as f64, r.speedup())],
                    color: colors[i % colors.len()].into(),
                    line: false,
                    dashed: false,
                });
            }
        }
        let b = Panel {
            title: "MLP 16×(Linear 512→512+GELU): speedup against batch size".into(),
            x_label: "batch size".into(),
            y_label: "eager time / graph time".into(),
            series: vec![
                line(
                    "ours",
                    speedups(Side::Ours, "mlp", "batch"),
                    "#1f77b4",
                    false,
                ),
                line(
                    "PyTorch",
                    speedups(Side::Torch, "mlp", "batch"),
                    "#ff7f0e",
                    true,
                ),
            ],
        };
        let footer: Vec<String> = self
            .env
            .iter()
            .take(6)
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        svg::render("CUDA graphs: eager vs graph replay", &[a, b], &footer)
    }

    /// The whole report as Markdown.
    pub fn markdown(&self) -> String {
        let mut md = String::from("# CUDA graphs benchmark report\n\n");
        md.push_str("## Machine and libraries\n\n");
        let mut env = Table::new(&["what", "value"]);
        for (k, v) in &self.env {
            env.row(vec![k.clone(), v.clone()]);
        }
        md.push_str(&env.to_markdown());
        md.push_str(
            "\n## Eager against graph, ours and PyTorch\n\nMicroseconds per call of the workload's unit: one forward (MLP), one token (decode), one training step, one whole chain. Graph times include copying new inputs into the graph (`replay`, PyTorch's `copy_` + `replay`) where the workload has inputs. Each figure is a median of 7 measurements of back-to-back calls.\n\n",
        );
        for (family, table) in self.family_tables() {
            md.push_str(&format!("### {}\n\n", family_title(&family)));
            md.push_str(&table.to_markdown());
            if let Some(note) = family_note(&family) {
                md.push_str(&format!("\n{note}\n"));
            }
            if family == REAL_MODELS {
                md.push_str(&format!(
                    "\nWhat each graph costs besides its replay (ours; PyTorch's where it measured the same). \
                     MiB: the temporaries' high-water mark (`GraphInfo::temp_bytes`), the runtime's graph pool \
                     after the capture (shared by the graphs of one program), and the free device memory \
                     the capture took (`cuMemGetInfo` before and after it).\n\n{}",
                    self.real_models_details().to_markdown()
                ));
            }
            md.push('\n');
        }
        md.push_str("\n## Targets\n\n");
        for t in self.targets() {
            md.push_str(&format!("- {t}\n"));
        }
        md.push_str("\n## Where graphs stop helping\n\n");
        for t in self.where_graphs_stop_helping() {
            md.push_str(&format!("- {t}\n"));
        }
        md.push_str("\n## Eager and graph agree\n\n");
        let mut checks = Table::new(&["workload", "check", "result"]);
        for r in self.records.iter().filter(|r| r.side == Side::Ours) {
            if let Some(check) = &r.check {
                checks.row(vec![
                    r.what.clone(),
                    check.clone(),
                    match r.agree {
                        Some(true) => "agree".to_owned(),
                        Some(false) => "DIFFER".to_owned(),
                        None => "–".to_owned(),
                    },
                ]);
            }
        }
        if checks.rows.is_empty() {
            md.push_str("No agreement checks were recorded: no model example produced a record.\n");
        } else {
            md.push_str(&checks.to_markdown());
        }
        md.push_str("\n## Programs run\n\n");
        let mut runs = Table::new(&["program", "status", ">seconds", ">records"]);
        for r in &self.runs {
            runs.row(vec![
                r.name.clone(),
                if r.skipped {
                    format!("skipped: {}", r.detail)
                } else if r.ok {
                    "ok".to_owned()
                } else {
                    format!("FAILED: {}", r.detail)
                },
                format!("{:.1}", r.seconds),
                r.records.to_string(),
            ]);
        }
        md.push_str(&runs.to_markdown());
        md.push_str("\n![speedup](speedup.svg)\n");
        md
    }

    /// The whole report as JSON.
    pub fn json(&self) -> Value {
        let env: Map<String, Value> = self
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        let summary: Vec<Value> = self
            .summary()
            .iter()
            .map(|r| {
                json!({
                    "workload": r.key,
                    "what": r.what,
                    "ours_eager_us": r.ours_eager(),
                    "ours_graph_us": r.ours_graph(),
                    "ours_speedup": r.ours_speedup(),
                    "torch_eager_us": r.torch_eager(),
                    "torch_graph_us": r.torch_graph(),
                    "torch_speedup": r.torch_speedup(),
                    "ours_graph_over_torch_graph": r.graph_ratio(),
                    "shape_mismatch": r.shape_mismatch,
                })
            })
            .collect();
        json!({
            "env": env,
            "runs": self.runs,
            "summary": summary,
            "targets": self.targets(),
            "where_graphs_stop_helping": self.where_graphs_stop_helping(),
            "records": self.records,
        })
    }
}

impl Report {
    /// The real-models tier's figures besides the times: first calls, capture, memory.
    pub fn real_models_details(&self) -> Table {
        let mut t = Table::new(&[
            "workload",
            ">nodes (kernels)",
            ">first eager call ms (PyTorch)",
            ">capture ms (PyTorch)",
            ">first replay µs",
            ">temporaries MiB",
            ">graph pool MiB",
            ">capture took MiB (PyTorch)",
            ">max |graph − eager|",
        ]);
        let num = |r: Option<&Record>, k: &str| r.and_then(|r| r.num(k)).unwrap_or(f64::NAN);
        let fixed = |v: f64, scale: f64| {
            if v.is_finite() {
                format!("{:.1}", v / scale)
            } else {
                "–".to_owned()
            }
        };
        let both = |ours: f64, torch: f64, scale: f64| {
            if torch.is_finite() {
                format!("{} ({})", fixed(ours, scale), fixed(torch, scale))
            } else {
                fixed(ours, scale)
            }
        };
        const MIB: f64 = 1024.0 * 1024.0;
        for row in self.summary() {
            let Some(ours) = row.ours.as_ref().filter(|o| o.bench == REAL_MODELS) else {
                continue;
            };
            let torch = row.torch.as_ref();
            let o = Some(ours);
            t.row(vec![
                row.what.clone(),
                format!(
                    "{} ({})",
                    ours.more
                        .get("nodes")
                        .map_or("–".to_owned(), |n| n.to_string()),
                    ours.kernels.map_or("–".to_owned(), |k| k.to_string())
                ),
                both(num(o, "first_eager_us"), num(torch, "first_eager_us"), 1e3),
                both(num(o, "capture_ms"), num(torch, "capture_ms"), 1.0),
                fixed(num(o, "first_replay_us"), 1.0),
                fixed(num(o, "temp_bytes"), MIB),
                fixed(num(o, "pool_reserved_bytes"), MIB),
                both(
                    num(o, "capture_mem_bytes"),
                    num(torch, "capture_mem_bytes"),
                    MIB,
                ),
                format!("{:.2e}", num(o, "max_abs_diff")),
            ]);
        }
        t
    }
}

/// What sets a family's times, where the table alone does not say.
fn family_note(bench: &str) -> Option<&'static str> {
    match bench {
        "mlp" => Some(
            "Past batch 512 both sides spend the forward in the 16 GEMMs, so the kernels set the time, and both run the same ones: a layer is cuBLASLt's GEMM with the bias folded in (the heuristic's first pick, untimed, as PyTorch takes it), then a GELU kernel (`layer_kernels` = `lt`; `04-mlp-inference` prints the algorithm and the kernels of each graph). cuBLASLt's GELU_BIAS epilogue would run the GELU as a generic epilogue kernel of its own, slower. The same kernels vary by a few percent from run to run (the log of `04-mlp-inference` has the GPU time of each graph).",
        ),
        REAL_MODELS => Some(
            "candle-transformers' models as they are (`ModelState`), random weights, f32, TF32 off on both sides. A graph removes launch cost, not GPU work: where candle's kernels take longer on the GPU than PyTorch's, its graph cannot be faster than PyTorch's graph. BERT at batch 8 is such a case: candle-transformers runs each layer's attention unfused (a GEMM for QKᵀ, a scale, the mask added, candle-nn's generic softmax as separate max, subtract, exp, sum and divide kernels, a GEMM for the values, and a strided copy for each of the four head transposes), each step a round trip through device memory over the 8×12×128×128 score tensor, where transformers' `sdpa` (the `attn` field of PyTorch's record) runs one fused attention kernel per layer. What would close it: a fused attention in candle (candle-flash-attn, or candle-nn's fused softmax `softmax_last_dim` at the least), which a graph then captures like any kernel.",
        ),
        _ => None,
    }
}

/// The heading of a workload family's table.
fn family_title(bench: &str) -> String {
    let what = match bench {
        "chain" => "a chain of tiny kernels (µs per whole chain)",
        "mlp" => "MLP inference (µs per forward)",
        "decode" => "decoder step (µs per token)",
        "train" => "training step (µs per step)",
        "dropout_train" => "training step with dropout (µs per step)",
        "decode_loop" => "decoding until the end token (µs per token: eager = one replay per token + host read, graph = the on-device loop; PyTorch: replay + `.item()`, replays without a check)",
        "jacobi" => "Jacobi solve until the residual is small (µs per iteration: eager = one replay per iteration + host read, graph = the on-device loop)",
        "tp_mlp" => "tensor-parallel MLP, 2 GPUs (µs per forward)",
        "ddp_train" => "data-parallel training, 2 GPUs (µs per step)",
        "tp_decode" => "tensor-parallel Llama decoding in candle, bf16, batch 1, on 1, 2 and 4 GPUs (µs per token, the slower rank; PyTorch: the same shapes with `torch.distributed`, the step captured whole)",
        "allreduce" => "an all-reduce of f32 (µs per operation, p50 GPU time back to back: eager = NCCL eager, graph = our fastest graph of it: NCCL's, NCCL's over symmetric buffers or the one-shot kernel)",
        "candle" => "candle code as graphs (µs per call)",
        "upload_cap" => "candle-transformers models that upload a host tensor in every forward, at the lengths the build's capture upload limit allows (µs per forward)",
        "islands" => "eager islands between graphed segments (µs per call: eager = the whole function eagerly, graph = the segments' launches with the islands' host code between them)",
        REAL_MODELS => "candle-transformers models, candle eager and graph against PyTorch eager and graph (µs per forward)",
        "" => "other",
        other => other,
    };
    format!("{bench}: {what}")
}

#[cfg(test)]
mod tests {
    use crate::summary::tests::sample;
    use crate::summary::Report;

    #[test]
    fn markdown() {
        let md = sample().markdown();
        assert!(md.contains("| GPU | Test GPU |"));
        assert!(md.contains("| MLP 16×(Linear 512→512+GELU), batch 1 | 400.0 | 80.0 | 5.00× | 485.0 | 103.0 | 4.71× | 0.78 |"), "{md}");
        assert!(md.contains("(shapes differ: batch)"));
        assert!(md.contains("## Where graphs stop helping"));
        assert!(md.contains("| 04-mlp-inference | ok | 1.5 | 3 |"));
        assert!(
            md.contains("| train step + dropout | loss curve bitwise | DIFFER |"),
            "{md}"
        );
        assert!(Report::default().markdown().contains("No agreement checks"));
        // One heading per workload family, and a program left out says why.
        assert!(
            md.contains("### mlp: MLP inference (µs per forward)")
                && md.contains("the heuristic's first pick"),
            "{md}"
        );
        assert!(md.contains("### train: training step"), "{md}");
        let mut r = sample();
        r.runs.push(crate::programs::Run::skipped(
            "10-tensor-parallel-mlp",
            "it needs 2 GPUs, this machine has 1".into(),
        ));
        let md = r.markdown();
        assert!(
            md.contains("| 10-tensor-parallel-mlp | skipped: it needs 2 GPUs, this machine has 1 | 0.0 | 0 |"),
            "{md}"
        );
    }

    #[test]
    fn the_real_models_table_has_its_note_and_details() {
        use crate::record::{Record, Side};
        use crate::summary::tests::real_model;
        let torch = Record::new("real_models", Side::Torch, "bert/1", "BERT", 900.0, 260.0)
            .shape("batch", 1)
            .with("capture_ms", 120.0)
            .with("capture_mem_bytes", 8i64 << 20);
        let report = Report {
            records: vec![real_model("bert/1", 1, 1000.0, 250.0), torch],
            ..Report::default()
        };
        let md = report.markdown();
        assert!(
            md.contains("### real_models: candle-transformers models"),
            "{md}"
        );
        assert!(md.contains("softmax"), "{md}");
        assert!(
            md.contains("| bert/1 model | 300 (100) | 250.0 | 40.0 (120.0) | 900.0 | 96.0 | 32.0 | 34.0 (8.0) | 0.00e0 |"),
            "{md}"
        );
        // No tier records, no details.
        assert!(!sample().markdown().contains("What each graph costs"));
    }

    #[test]
    fn json() {
        let j = sample().json();
        let text = serde_json::to_string_pretty(&j).unwrap();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["summary"].as_array().map(Vec::len), Some(6));
        assert_eq!(back["env"]["GPU"], "Test GPU");
        assert_eq!(back["runs"][0]["name"], "04-mlp-inference");
        assert_eq!(back["records"].as_array().map(Vec::len), Some(9));
        // Unmeasured figures are null, as JSON has no NaN.
        assert!(back["summary"][2]["torch_eager_us"].is_null());
        let records: Vec<crate::record::Record> =
            serde_json::from_value(back["records"].clone()).unwrap();
        assert_eq!(records[..8], sample().records[..8]);
    }

    #[test]
    fn svg() {
        let svg = sample().svg();
        assert_eq!(
            svg.matches("<polyline").count(),
            2,
            "ours and PyTorch MLP lines"
        );
        assert!(svg.contains("MLP b=1") && svg.contains("decode") && svg.contains("train"));
        assert!(
            !svg.contains("dropout"),
            "a record without timings is no point"
        );
    }
}
