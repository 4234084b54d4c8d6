//! What the records say: ours and PyTorch's record of each workload side by side, the
//! targets with their verdicts, and where graphs stop paying off. Plain data processing,
//! tested on the CPU.
//!
//! Every record has `eager_us` and `graph_us`: microseconds per call of the workload's unit
//! (one forward, one token, one training step, one chain), the graph figure including the
//! copy of new inputs where the workload has inputs. [`Report::summary`] pairs our record
//! with PyTorch's by their `workload` and flags a pair whose shapes differ.

use crate::programs::Run;
use crate::record::{Record, Side};
use crate::table::{times, us, Table};

/// The bench of the real-models tier (examples 17-19, `scripts/torch_real_models.py`).
pub const REAL_MODELS: &str = "real_models";

/// The speedup below which the report says a graph has stopped helping.
pub const HELPFUL_SPEEDUP: f64 = 1.10;

/// Everything the report is made of.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Machine and library facts, in order: (what, value).
    pub env: Vec<(String, String)>,
    /// The programs run.
    pub runs: Vec<Run>,
    /// All records, ours and PyTorch's.
    pub records: Vec<Record>,
}

/// Our record and PyTorch's for one workload, and what follows from them.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The records' `workload`.
    pub key: String,
    /// What our record says the workload is (or PyTorch's when we have none).
    pub what: String,
    /// Our record.
    pub ours: Option<Record>,
    /// PyTorch's record.
    pub torch: Option<Record>,
    /// Shape fields that differ between the two.
    pub shape_mismatch: Vec<String>,
}

impl Row {
    fn get(r: &Option<Record>, f: impl Fn(&Record) -> f64) -> f64 {
        r.as_ref().map_or(f64::NAN, f)
    }

    /// Our eager µs per call.
    pub fn ours_eager(&self) -> f64 {
        Self::get(&self.ours, |r| r.eager_us)
    }

    /// Our graph µs per call.
    pub fn ours_graph(&self) -> f64 {
        Self::get(&self.ours, |r| r.graph_us)
    }

    /// PyTorch's eager µs per call.
    pub fn torch_eager(&self) -> f64 {
        Self::get(&self.torch, |r| r.eager_us)
    }

    /// PyTorch's graph µs per call.
    pub fn torch_graph(&self) -> f64 {
        Self::get(&self.torch, |r| r.graph_us)
    }

    /// Our eager time over our graph time.
    pub fn ours_speedup(&self) -> f64 {
        self.ours_eager() / self.ours_graph()
    }

    /// PyTorch's eager time over its graph time.
    pub fn torch_speedup(&self) -> f64 {
        self.torch_eager() / self.torch_graph()
    }

    /// Our graph time over PyTorch's (below 1: ours is faster).
    pub fn graph_ratio(&self) -> f64 {
        self.ours_graph() / self.torch_graph()
    }
}

impl Report {
    /// Records of one side and benchmark.
    pub fn of<'a>(&'a self, side: Side, bench: &'a str) -> impl Iterator<Item = &'a Record> {
        self.records
            .iter()
            .filter(move |r| r.side == side && r.bench == bench)
    }

    /// One row per workload, in the order the records came (ours first).
    pub fn summary(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        for r in &self.records {
            let at = match rows.iter().position(|row| row.key == r.workload) {
                Some(i) => i,
                None => {
                    rows.push(Row {
                        key: r.workload.clone(),
                        what: r.what.clone(),
                        ours: None,
                        torch: None,
                        shape_mismatch: Vec::new(),
                    });
                    rows.len() - 1
                }
            };
            let row = &mut rows[at];
            match r.side {
                Side::Ours => {
                    row.what = r.what.clone();
                    row.ours = Some(r.clone());
                }
                Side::Torch => row.torch = Some(r.clone()),
            }
        }
        for row in &mut rows {
            if let (Some(o), Some(t)) = (&row.ours, &row.torch) {
                row.shape_mismatch = o
                    .shape
                    .iter()
                    .filter(|(k, v)| t.shape.get(*k).is_some_and(|w| w != *v))
                    .map(|(k, _)| k.clone())
                    .collect();
            }
        }
        rows
    }

    /// The summary as one Markdown table per workload family (the records' `bench`: `chain`,
    /// `mlp`, `decode`, …), in the order the families first came.
    pub fn family_tables(&self) -> Vec<(String, Table)> {
        let rows = self.summary();
        let family = |r: &Row| {
            r.ours
                .as_ref()
                .or(r.torch.as_ref())
                .map_or_else(String::new, |rec| rec.bench.clone())
        };
        let mut families: Vec<String> = Vec::new();
        for r in &rows {
            let f = family(r);
            if !families.contains(&f) {
                families.push(f);
            }
        }
        families
            .into_iter()
            .map(|f| {
                let mut t = Self::summary_header();
                for r in rows.iter().filter(|r| family(r) == f) {
                    Self::summary_row(&mut t, r);
                }
                (f, t)
            })
            .collect()
    }

    fn summary_header() -> Table {
        Table::new(&[
            "workload",
            ">ours eager µs",
            ">ours graph µs",
            ">ours speedup",
            ">PyTorch eager µs",
            ">PyTorch graph µs",
            ">PyTorch speedup",
            ">ours graph / PyTorch graph",
        ])
    }

    fn summary_row(t: &mut Table, r: &Row) {
        let mut what = r.what.clone();
        if !r.shape_mismatch.is_empty() {
            what.push_str(&format!(
                " (shapes differ: {})",
                r.shape_mismatch.join(", ")
            ));
        }
        t.row(vec![
            what,
            us(r.ours_eager()),
            us(r.ours_graph()),
            times(r.ours_speedup()),
            us(r.torch_eager()),
            us(r.torch_graph()),
            times(r.torch_speedup()),
            ratio(r.graph_ratio()),
        ]);
    }

    /// The summary as a Markdown table.
    pub fn summary_table(&self) -> Table {
        let mut t = Self::summary_header();
        for r in self.summary() {
            Self::summary_row(&mut t, &r);
        }
        t
    }

    /// The targets, each with its verdict.
    pub fn targets(&self) -> Vec<String> {
        let rows = self.summary();
        let mut out = Vec::new();
        let paired: Vec<&Row> = rows
            .iter()
            .filter(|r| r.graph_ratio().is_finite())
            .collect();
        if paired.is_empty() {
            out.push(
                "Graph replay no slower than PyTorch's on every workload: not measured (no PyTorch figures)."
                    .to_owned(),
            );
        } else {
            let slower: Vec<String> = paired
                .iter()
                .filter(|r| r.graph_ratio() > 1.0)
                .map(|r| format!("{} ({})", r.what, ratio(r.graph_ratio())))
                .collect();
            if slower.is_empty() {
                out.push(format!(
                    "Graph replay no slower than PyTorch's on every workload: met on all {} paired workloads.",
                    paired.len()
                ));
            } else {
                out.push(format!(
                    "Graph replay no slower than PyTorch's on every workload: NOT met on {} of {}: {}.",
                    slower.len(),
                    paired.len(),
                    slower.join("; ")
                ));
            }
        }
        let verdict = |name: &str, got: f64, want: f64| {
            if !got.is_finite() {
                format!("{name}: not measured.")
            } else if got >= want {
                format!("{name}: met ({}, target {want}×).", times(got))
            } else {
                format!("{name}: NOT met ({}, target {want}×).", times(got))
            }
        };
        let mlp1 = rows
            .iter()
            .find(|r| r.key == "mlp/1")
            .map_or(f64::NAN, Row::ours_speedup);
        out.push(verdict(
            "At least 4× over our eager for the MLP at batch 1",
            mlp1,
            4.0,
        ));
        let train = rows
            .iter()
            .find(|r| r.key == "train")
            .map_or(f64::NAN, Row::ours_speedup);
        out.push(verdict(
            "At least 2× over our eager for the training step at small batch",
            train,
            2.0,
        ));
        if let Some(r) = rows.iter().find(|r| r.key == "mlp/1") {
            if r.torch_eager().is_finite() {
                out.push(format!(
                    "Context for the MLP at batch 1: our eager forward takes {} against PyTorch's {}; our graph replay ({}) is {} over PyTorch's eager and {} over PyTorch's graph ({}). A speedup over eager measures the eager program as much as the graph.",
                    fmt_us(r.ours_eager()),
                    fmt_us(r.torch_eager()),
                    fmt_us(r.ours_graph()),
                    times(r.torch_eager() / r.ours_graph()),
                    times(r.torch_graph() / r.ours_graph()),
                    fmt_us(r.torch_graph())
                ));
            }
        }
        out.extend(self.real_models_target(&rows));
        out.extend(self.tp_decode_targets());
        out
    }

    /// The tensor-parallel decoder's targets (bench `tp_decode`), on the Llama-3.1-8B shape:
    /// 2 GPUs at most 0.6× one GPU's graph µs per token, 4 GPUs at most 0.35×, and at every
    /// GPU count at most PyTorch's graphed step; nothing without our records.
    fn tp_decode_targets(&self) -> Vec<String> {
        const CONFIG: &str = "llama-8b";
        let graph_us = |side: Side, world: f64| {
            self.of(side, "tp_decode")
                .filter(|r| measured(r))
                .find(|r| {
                    r.shape.get("config").and_then(|c| c.as_str()) == Some(CONFIG)
                        && r.shape_num("world") == Some(world)
                })
                .map(|r| r.graph_us)
        };
        let Some(one) = graph_us(Side::Ours, 1.0) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (world, want) in [(2.0, 0.6), (4.0, 0.35)] {
            let name = format!("{CONFIG}, {world} GPUs at most {want}× one GPU's µs per token");
            out.push(match graph_us(Side::Ours, world) {
                None => format!("{name}: not measured."),
                Some(t) if t / one <= want => format!("{name}: met ({:.2}×).", t / one),
                Some(t) => format!("{name}: NOT met ({:.2}×).", t / one),
            });
        }
        let mut versus = Vec::new();
        for world in [1.0, 2.0, 4.0] {
            if let (Some(o), Some(t)) = (graph_us(Side::Ours, world), graph_us(Side::Torch, world))
            {
                versus.push((world, o / t));
            }
        }
        if !versus.is_empty() {
            let all = versus
                .iter()
                .map(|(w, r)| format!("{w} GPU: {r:.2}×"))
                .collect::<Vec<_>>()
                .join(", ");
            let met = versus.iter().all(|(_, r)| *r <= 1.0);
            out.push(format!(
                "{CONFIG}, at most PyTorch's graphed step at every GPU count: {} (ours / PyTorch: {all}).",
                if met { "met" } else { "NOT met" }
            ));
        }
        out
    }

    /// The real-models tier's own target (bench `real_models`): at least 2× over candle eager
    /// at batch 1, said for the slowest of its batch-1 workloads; nothing without records.
    fn real_models_target(&self, rows: &[Row]) -> Option<String> {
        let batch1: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                r.ours.as_ref().is_some_and(|o| {
                    o.bench == REAL_MODELS && o.shape_num("batch") == Some(1.0) && measured(o)
                })
            })
            .collect();
        let worst = batch1
            .iter()
            .min_by(|a, b| a.ours_speedup().total_cmp(&b.ours_speedup()))?;
        let got = worst.ours_speedup();
        let all: Vec<String> = batch1
            .iter()
            .map(|r| format!("{} {}", r.key, times(r.ours_speedup())))
            .collect();
        Some(format!(
            "Real models, at least 2× over candle eager at batch 1: {} (lowest: {}; {}).",
            if got >= 2.0 { "met" } else { "NOT met" },
            worst.what,
            all.join(", ")
        ))
    }

    /// Where graphs stop paying off, said from the MLP batch sweep and the chain.
    pub fn where_graphs_stop_helping(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (side, name) in [(Side::Ours, "ours"), (Side::Torch, "PyTorch")] {
            let mut mlp: Vec<(f64, f64, f64, f64)> = self
                .of(side, "mlp")
                .filter(|r| measured(r))
                .filter_map(|r| {
                    Some((
                        r.shape_num("batch")?,
                        r.eager_us,
                        r.graph_us,
                        r.num("eager_gpu_us").unwrap_or(f64::NAN),
                    ))
                })
                .collect();
            if mlp.is_empty() {
                continue;
            }
            mlp.sort_by(|a, b| a.0.total_cmp(&b.0));
            let speedups: Vec<String> = mlp
                .iter()
                .map(|(b, e, g, _)| format!("{b}: {}", times(e / g)))
                .collect();
            out.push(format!(
                "MLP, {name}, speedup by batch size: {}.",
                speedups.join(", ")
            ));
            match mlp.iter().find(|(_, e, g, _)| e / g < HELPFUL_SPEEDUP) {
                Some((b, e, g, gpu)) => {
                    let mut s = format!(
                        "MLP, {name}: from batch {b} the graph gains less than {:.0}% ({} per forward eager, {} graphed, {}).",
                        (HELPFUL_SPEEDUP - 1.0) * 100.0,
                        fmt_us(*e),
                        fmt_us(*g),
                        times(e / g)
                    );
                    if gpu.is_finite() {
                        s.push_str(&format!(
                            " The GPU is busy {} of the {} an eager forward takes: the work, not the launches, sets the time, and a graph only removes launch cost.",
                            fmt_us(*gpu),
                            fmt_us(*e)
                        ));
                    }
                    out.push(s);
                }
                None => {
                    let (b, e, g, _) = mlp[mlp.len() - 1];
                    out.push(format!(
                        "MLP, {name}: the graph still gains at least {:.0}% at every measured batch size, {} at the largest ({b}); add larger batches (`--batches`) to find the crossover.",
                        (HELPFUL_SPEEDUP - 1.0) * 100.0,
                        times(e / g)
                    ));
                }
            }
        }
        let mut chain: Vec<(f64, f64, f64)> = self
            .of(Side::Ours, "chain")
            .filter(|r| measured(r))
            .filter_map(|r| Some((r.shape_num("kernels_n")?, r.eager_us, r.graph_us)))
            .collect();
        chain.sort_by(|a, b| a.0.total_cmp(&b.0));
        if let (Some(first), Some(last)) = (chain.first(), chain.last()) {
            out.push(format!(
                "Chain of tiny kernels: {} at {} kernels, {} at {}; per kernel, eager costs {} and a graph node {} at {} kernels: the gain is the launch overhead per kernel, so it is largest for many small kernels and shrinks as each kernel's own GPU time grows.",
                times(first.1 / first.2),
                first.0,
                times(last.1 / last.2),
                last.0,
                fmt_us(last.1 / last.0),
                fmt_us(last.2 / last.0),
                last.0
            ));
        }
        if out.is_empty() {
            out.push(
                "No MLP or chain figures: nothing to say about where graphs stop helping.".into(),
            );
        }
        out
    }
}

/// Whether a record has both figures (JSON `null` reads as NaN).
pub(crate) fn measured(r: &Record) -> bool {
    r.eager_us.is_finite() && r.graph_us.is_finite()
}

pub(crate) fn fmt_us(v: f64) -> String {
    format!("{} µs", us(v))
}

pub(crate) fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "–".to_owned()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn mlp(side: Side, batch: u32, eager: f64, graph: f64) -> Record {
        Record::new(
            "mlp",
            side,
            format!("mlp/{batch}"),
            format!("MLP 16×(Linear 512→512+GELU), batch {batch}"),
            eager,
            graph,
        )
        .shape("batch", batch)
        .shape("layers", 16)
        .shape("dim", 512)
    }

    fn train(side: Side, batch: u32, eager: f64, graph: f64) -> Record {
        Record::new(
            "train",
            side,
            "train",
            format!("train step MLP 64-256-256-16, batch {batch}"),
            eager,
            graph,
        )
        .shape("batch", batch)
        .shape("dims", "64-256-256-16")
    }

    /// Records of every kind: an MLP sweep (PyTorch's shorter), a training step whose
    /// shapes differ, a decode step without PyTorch, a check without timings.
    pub(crate) fn sample() -> Report {
        let mut records = Vec::new();
        for (b, e, g, gpu) in [
            (1, 400.0, 80.0, 70.0),
            (64, 420.0, 100.0, 95.0),
            (4096, 2000.0, 1950.0, 1940.0),
        ] {
            records.push(
                mlp(Side::Ours, b, e, g)
                    .kernels(32)
                    .with("eager_gpu_us", gpu),
            );
        }
        records.push(mlp(Side::Torch, 1, 485.0, 103.0));
        records.push(mlp(Side::Torch, 64, 500.0, 120.0));
        records.push(train(Side::Ours, 32, 300.0, 100.0).kernels(22));
        records.push(train(Side::Torch, 16, 900.0, 90.0));
        records.push(
            Record::new("decode", Side::Ours, "decode", "decode step", 350.0, 90.0)
                .shape("layers", 8)
                .kernels(76),
        );
        records.push(
            Record::new(
                "dropout_train",
                Side::Ours,
                "dropout_train",
                "train step + dropout",
                f64::NAN,
                f64::NAN,
            )
            .check("loss curve bitwise", false),
        );
        Report {
            env: vec![("GPU".into(), "Test GPU".into())],
            runs: vec![Run {
                name: "04-mlp-inference".into(),
                ok: true,
                skipped: false,
                detail: "exit 0".into(),
                seconds: 1.5,
                records: 3,
            }],
            records,
        }
    }

    #[test]
    fn pairs_ours_with_pytorch_and_flags_shape_differences() {
        let rows = sample().summary();
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "mlp/1",
                "mlp/64",
                "mlp/4096",
                "train",
                "decode",
                "dropout_train"
            ]
        );
        let mlp1 = &rows[0];
        assert_eq!(mlp1.ours_speedup(), 5.0);
        assert!((mlp1.torch_speedup() - 485.0 / 103.0).abs() < 1e-12);
        assert!((mlp1.graph_ratio() - 80.0 / 103.0).abs() < 1e-12);
        assert!(mlp1.shape_mismatch.is_empty());
        assert!(rows[2].torch.is_none() && rows[2].graph_ratio().is_nan());
        assert_eq!(rows[3].shape_mismatch, vec!["batch".to_owned()]);
        assert_eq!(rows[3].what, "train step MLP 64-256-256-16, batch 32");
    }

    #[test]
    fn a_workload_only_pytorch_measured_keeps_its_description() {
        let report = Report {
            records: vec![mlp(Side::Torch, 8, 10.0, 5.0)],
            ..Report::default()
        };
        let rows = report.summary();
        assert_eq!(rows[0].what, "MLP 16×(Linear 512→512+GELU), batch 8");
        assert!(rows[0].ours_speedup().is_nan());
        assert_eq!(rows[0].torch_speedup(), 2.0);
    }

    fn tp(side: Side, world: usize, graph_us: f64) -> Record {
        Record::new(
            "tp_decode",
            side,
            format!("tp_decode/llama-8b/{world}gpu"),
            "",
            1.0,
            graph_us,
        )
        .shape("config", "llama-8b")
        .shape("world", world)
    }

    #[test]
    fn tensor_parallel_decoding_has_its_verdicts() {
        let report = Report {
            records: vec![
                tp(Side::Ours, 1, 5000.0),
                tp(Side::Ours, 2, 2900.0),
                tp(Side::Ours, 4, 2000.0),
                tp(Side::Torch, 1, 5100.0),
                tp(Side::Torch, 2, 2800.0),
            ],
            ..Report::default()
        };
        let t = report.tp_decode_targets();
        assert!(
            t[0].contains("2 GPUs at most 0.6×") && t[0].ends_with(": met (0.58×)."),
            "{}",
            t[0]
        );
        assert!(t[1].contains(": NOT met (0.40×)."), "{}", t[1]);
        assert!(
            t[2].contains(": NOT met (ours / PyTorch: 1 GPU: 0.98×, 2 GPU: 1.04×)"),
            "{}",
            t[2]
        );
        assert!(Report::default().tp_decode_targets().is_empty());
    }

    #[test]
    fn targets_have_verdicts() {
        let t = sample().targets();
        // train: ours 100 µs against PyTorch 90 µs.
        assert!(t[0].contains("NOT met on 1 of 3"), "{}", t[0]);
        assert!(t[0].contains("train step"), "{}", t[0]);
        assert!(
            t[1].starts_with("At least 4×") && t[1].contains(": met (5.00×"),
            "{}",
            t[1]
        );
        assert!(t[2].contains(": met (3.00×"), "{}", t[2]);
        assert!(
            t[3].starts_with("Context for the MLP at batch 1")
                && t[3].contains("takes 400.0 µs against PyTorch's 485.0 µs")
                && t[3].contains("6.06× over PyTorch's eager"),
            "{}",
            t[3]
        );
        let empty = Report::default().targets();
        assert!(empty[0].contains("not measured"));
        assert!(empty[1].contains("not measured"));
    }

    #[test]
    fn says_where_graphs_stop_helping() {
        let lines = sample().where_graphs_stop_helping();
        let ours = lines
            .iter()
            .find(|l| l.starts_with("MLP, ours: from batch 4096"))
            .expect("crossover found");
        assert!(ours.contains("1.03×"), "{ours}");
        assert!(ours.contains("The GPU is busy 1940 µs"), "{ours}");
        let torch = lines
            .iter()
            .find(|l| l.starts_with("MLP, PyTorch: the graph still gains"))
            .expect("no crossover");
        assert!(torch.contains("(64)"), "{torch}");
        assert!(Report::default().where_graphs_stop_helping()[0].contains("nothing to say"));
    }

    #[test]
    fn one_table_per_family_in_order() {
        let r = sample();
        let tables = r.family_tables();
        let families: Vec<&str> = tables.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(families, ["mlp", "train", "decode", "dropout_train"]);
        let rows: usize = tables.iter().map(|(_, t)| t.rows.len()).sum();
        assert_eq!(
            rows,
            r.summary().len(),
            "every workload in exactly one table"
        );
        let (_, mlp) = &tables[0];
        assert!(
            mlp.rows.iter().all(|row| row[0].starts_with("MLP")),
            "{:?}",
            mlp.rows
        );
        assert_eq!(
            tables[1].1.rows.len(),
            1,
            "ours and PyTorch's train step share a row"
        );
    }

    /// A real-models record of ours with the figures the examples print.
    pub(crate) fn real_model(workload: &str, batch: u32, eager: f64, graph: f64) -> Record {
        Record::new(
            REAL_MODELS,
            Side::Ours,
            workload,
            format!("{workload} model"),
            eager,
            graph,
        )
        .shape("batch", batch)
        .kernels(100)
        .with("nodes", 300)
        .with("first_eager_us", 250_000.0)
        .with("capture_ms", 40.0)
        .with("first_replay_us", 900.0)
        .with("temp_bytes", 96u64 << 20)
        .with("pool_reserved_bytes", 32u64 << 20)
        .with("capture_mem_bytes", 34i64 << 20)
        .with("max_abs_diff", 0.0)
    }

    #[test]
    fn the_real_models_target_is_said_for_the_slowest_at_batch_1() {
        let mut report = Report {
            records: vec![
                real_model("bert/1", 1, 1000.0, 250.0),
                real_model("bert/8", 8, 1000.0, 900.0),
                real_model("resnet18/1", 1, 1500.0, 500.0),
            ],
            ..Report::default()
        };
        let t = report.targets();
        let line = t.last().unwrap();
        assert!(
            line.starts_with("Real models, at least 2× over candle eager at batch 1: met (lowest: resnet18/1 model;"),
            "{line}"
        );
        assert!(
            line.contains("bert/1 4.00×") && !line.contains("bert/8"),
            "{line}"
        );
        report
            .records
            .push(real_model("llama_window/128", 1, 300.0, 200.0));
        let t = report.targets();
        assert!(
            t.last()
                .unwrap()
                .contains(": NOT met (lowest: llama_window/128"),
            "{t:?}"
        );
        assert!(!sample()
            .targets()
            .iter()
            .any(|l| l.starts_with("Real models")));
    }

    #[test]
    fn the_chain_sweep() {
        let chain = |side, n: u32, eager: f64, graph: f64| {
            Record::new(
                "chain",
                side,
                format!("chain/{n}"),
                format!("chain of {n} tiny kernels"),
                eager,
                graph,
            )
            .shape("kernels_n", n)
        };
        let report = Report {
            records: vec![
                chain(Side::Ours, 10, 30.0, 10.0).kernels(10),
                chain(Side::Ours, 1000, 2500.0, 1200.0).kernels(1000),
                chain(Side::Torch, 10, 90.0, 12.5),
            ],
            ..Report::default()
        };
        let rows = report.summary();
        assert_eq!(rows[0].key, "chain/10");
        assert_eq!(rows[0].graph_ratio(), 0.8);
        let stop = report.where_graphs_stop_helping();
        assert!(
            stop[0].starts_with("Chain of tiny kernels: 3.00× at 10 kernels, 2.08× at 1000"),
            "{}",
            stop[0]
        );
    }
}
