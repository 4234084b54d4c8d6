//! The benchmark report: records from the examples (and from PyTorch) in, Markdown, JSON
//! and SVG out. `examples/08-report.rs` runs the programs; everything here is plain data
//! processing, tested on the CPU.
//!
//! # Records
//! One JSON object per line, `{"bench": …, "side": "ours" | "torch", …}` (see
//! [`super::json::Record`]). Every record has `eager_us` and `graph_us`: microseconds per
//! call of the workload's unit (one forward, one token, one training step, one chain), the
//! graph figure including the copy of new inputs where the workload has inputs. Shape fields
//! (`batch`, `layers`, `dim`, …) identify the workload; [`Report::summary`] pairs our record
//! with PyTorch's by [`workload_key`] and flags a pair whose shapes differ.

use super::json::Json;
use super::svg::{self, Panel, Series};
use super::table::{self, times, us, Table};

/// Fields that describe a workload's shape: compared between our record and PyTorch's.
pub const SHAPE_FIELDS: &[&str] = &[
    "batch",
    "kernels_n",
    "layers",
    "dim",
    "heads",
    "ffn",
    "vocab",
    "tokens",
    "dims",
    "p",
    "steps",
];

/// The speedup below which the report says a graph has stopped helping.
pub const HELPFUL_SPEEDUP: f64 = 1.10;

/// How one program of the report ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The program (`04-mlp-inference`, `torch_models.py`, …).
    pub name: String,
    /// Whether it ran to completion with exit status 0.
    pub ok: bool,
    /// Exit status, or why it did not run.
    pub detail: String,
    /// Wall seconds it took.
    pub seconds: f64,
    /// Records it produced.
    pub records: usize,
}

/// Everything the report is made of.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Machine and library facts, in order: (what, value).
    pub env: Vec<(String, String)>,
    /// The programs run.
    pub runs: Vec<Run>,
    /// All records, ours and PyTorch's.
    pub records: Vec<Json>,
}

/// The key that pairs our record of a workload with PyTorch's: the benchmark name plus the
/// swept parameter (batch size for the MLP, kernel count for the chain).
pub fn workload_key(r: &Json) -> Option<String> {
    let bench = r.str("bench")?;
    match bench {
        "env" => None,
        "mlp" => Some(format!("mlp/{}", r.num("batch")?)),
        "chain" => Some(format!("chain/{}", r.num("kernels_n")?)),
        other => Some(other.to_owned()),
    }
}

/// What a workload is, for the tables: `MLP 16×512, batch 4`.
pub fn describe(r: &Json) -> String {
    let n = |k: &str| {
        r.num(k)
            .map(|v| format!("{v}"))
            .unwrap_or_else(|| "?".into())
    };
    match r.str("bench").unwrap_or("?") {
        "chain" => format!("chain of {} tiny kernels", n("kernels_n")),
        "mlp" => format!(
            "MLP {}×(Linear {d}→{d}+GELU), batch {}",
            n("layers"),
            n("batch"),
            d = n("dim")
        ),
        "decode" => format!(
            "decode step, {} layers, dim {}, vocab {} ({} tokens)",
            n("layers"),
            n("dim"),
            n("vocab"),
            n("tokens")
        ),
        "train" => format!(
            "train step MLP {}, batch {}",
            r.str("dims").unwrap_or("?"),
            n("batch")
        ),
        "dropout_train" => format!(
            "train step + dropout p={} MLP {}, batch {}",
            n("p"),
            r.str("dims").unwrap_or("?"),
            n("batch")
        ),
        other => other.to_owned(),
    }
}

/// Our record and PyTorch's for one workload, and what follows from them.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// [`workload_key`].
    pub key: String,
    /// [`describe`] of our record (or PyTorch's when we have none).
    pub what: String,
    /// Our record.
    pub ours: Option<Json>,
    /// PyTorch's record.
    pub torch: Option<Json>,
    /// Shape fields that differ between the two.
    pub shape_mismatch: Vec<String>,
}

impl Row {
    fn get(r: &Option<Json>, k: &str) -> f64 {
        r.as_ref().and_then(|r| r.num(k)).unwrap_or(f64::NAN)
    }

    /// Our eager µs per call.
    pub fn ours_eager(&self) -> f64 {
        Self::get(&self.ours, "eager_us")
    }

    /// Our graph µs per call.
    pub fn ours_graph(&self) -> f64 {
        Self::get(&self.ours, "graph_us")
    }

    /// PyTorch's eager µs per call.
    pub fn torch_eager(&self) -> f64 {
        Self::get(&self.torch, "eager_us")
    }

    /// PyTorch's graph µs per call.
    pub fn torch_graph(&self) -> f64 {
        Self::get(&self.torch, "graph_us")
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

fn field_text(r: &Json, k: &str) -> Option<String> {
    match r.get(k)? {
        Json::Num(v) => Some(format!("{v}")),
        Json::Str(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

impl Report {
    /// Records of one side (`"ours"` or `"torch"`) and benchmark.
    pub fn of<'a>(&'a self, side: &'a str, bench: &'a str) -> impl Iterator<Item = &'a Json> {
        self.records
            .iter()
            .filter(move |r| r.str("side") == Some(side) && r.str("bench") == Some(bench))
    }

    /// One row per workload, in the order the records came (ours first).
    pub fn summary(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        for r in &self.records {
            let Some(key) = workload_key(r) else { continue };
            let side = r.str("side").unwrap_or("");
            let at = match rows.iter().position(|row| row.key == key) {
                Some(i) => i,
                None => {
                    rows.push(Row {
                        key: key.clone(),
                        what: describe(r),
                        ours: None,
                        torch: None,
                        shape_mismatch: Vec::new(),
                    });
                    rows.len() - 1
                }
            };
            let row = &mut rows[at];
            match side {
                "ours" => {
                    row.what = describe(r);
                    row.ours = Some(r.clone());
                }
                "torch" => row.torch = Some(r.clone()),
                _ => {}
            }
        }
        for row in &mut rows {
            if let (Some(o), Some(t)) = (&row.ours, &row.torch) {
                row.shape_mismatch = SHAPE_FIELDS
                    .iter()
                    .filter(|k| match (field_text(o, k), field_text(t, k)) {
                        (Some(a), Some(b)) => a != b,
                        _ => false,
                    })
                    .map(|k| (*k).to_owned())
                    .collect();
            }
        }
        rows
    }

    /// The summary as a Markdown table.
    pub fn summary_table(&self) -> Table {
        let mut t = Table::new(&[
            "workload",
            ">ours eager µs",
            ">ours graph µs",
            ">ours speedup",
            ">PyTorch eager µs",
            ">PyTorch graph µs",
            ">PyTorch speedup",
            ">ours graph / PyTorch graph",
        ]);
        for r in self.summary() {
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
        out
    }

    /// Where graphs stop paying off, said from the MLP batch sweep and the chain.
    pub fn where_graphs_stop_helping(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (side, name) in [("ours", "ours"), ("torch", "PyTorch")] {
            let mut mlp: Vec<(f64, f64, f64, f64)> = self
                .of(side, "mlp")
                .filter_map(|r| {
                    Some((
                        r.num("batch")?,
                        r.num("eager_us")?,
                        r.num("graph_us")?,
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
            .of("ours", "chain")
            .filter_map(|r| Some((r.num("kernels_n")?, r.num("eager_us")?, r.num("graph_us")?)))
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

    /// The SVG figure: speedup against kernels per graph, and against batch size.
    pub fn svg(&self) -> String {
        let speedups = |side: &str, bench: &str, x: &str| -> Vec<(f64, f64)> {
            let mut v: Vec<(f64, f64)> = self
                .of(side, bench)
                .filter_map(|r| Some((r.num(x)?, r.num("eager_us")? / r.num("graph_us")?)))
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
                    speedups("ours", "chain", "kernels_n"),
                    "#1f77b4",
                    false,
                ),
                line(
                    "PyTorch: chain",
                    speedups("torch", "chain", "kernels_n"),
                    "#ff7f0e",
                    true,
                ),
            ],
        };
        let colors = ["#2ca02c", "#d62728", "#9467bd", "#8c564b"];
        let models: Vec<&Json> = self
            .records
            .iter()
            .filter(|r| r.str("side") == Some("ours"))
            .filter(|r| match r.str("bench") {
                Some("mlp") => r.num("batch") == Some(1.0),
                Some("decode" | "train" | "dropout_train") => true,
                _ => false,
            })
            .collect();
        for (i, r) in models.iter().enumerate() {
            if let (Some(k), Some(e), Some(g)) =
                (r.num("kernels"), r.num("eager_us"), r.num("graph_us"))
            {
                let label = match r.str("bench") {
                    Some("mlp") => "MLP b=1".to_owned(),
                    Some(b) => b.replace('_', " "),
                    None => String::new(),
                };
                a.series.push(Series {
                    label,
                    points: vec![(k, e / g)],
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
                line("ours", speedups("ours", "mlp", "batch"), "#1f77b4", false),
                line(
                    "PyTorch",
                    speedups("torch", "mlp", "batch"),
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
        md.push_str(&self.summary_table().to_markdown());
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
        for r in self
            .records
            .iter()
            .filter(|r| r.str("side") == Some("ours"))
        {
            if let Some(check) = r.str("check") {
                let ok = r.get("agree").and_then(Json::as_bool);
                checks.row(vec![
                    describe(r),
                    check.to_owned(),
                    match ok {
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
                if r.ok {
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
    pub fn json(&self) -> Json {
        let env = Json::Obj(
            self.env
                .iter()
                .map(|(k, v)| (k.clone(), Json::from(v.as_str())))
                .collect(),
        );
        let runs = Json::Arr(
            self.runs
                .iter()
                .map(|r| {
                    Json::Obj(vec![
                        ("name".into(), r.name.as_str().into()),
                        ("ok".into(), r.ok.into()),
                        ("detail".into(), r.detail.as_str().into()),
                        ("seconds".into(), r.seconds.into()),
                        ("records".into(), r.records.into()),
                    ])
                })
                .collect(),
        );
        let summary = Json::Arr(
            self.summary()
                .iter()
                .map(|r| {
                    Json::Obj(vec![
                        ("workload".into(), r.key.as_str().into()),
                        ("what".into(), r.what.as_str().into()),
                        ("ours_eager_us".into(), r.ours_eager().into()),
                        ("ours_graph_us".into(), r.ours_graph().into()),
                        ("ours_speedup".into(), r.ours_speedup().into()),
                        ("torch_eager_us".into(), r.torch_eager().into()),
                        ("torch_graph_us".into(), r.torch_graph().into()),
                        ("torch_speedup".into(), r.torch_speedup().into()),
                        ("ours_graph_over_torch_graph".into(), r.graph_ratio().into()),
                        (
                            "shape_mismatch".into(),
                            Json::Arr(r.shape_mismatch.iter().map(|s| s.as_str().into()).collect()),
                        ),
                    ])
                })
                .collect(),
        );
        let lines = |v: Vec<String>| Json::Arr(v.into_iter().map(Json::from).collect());
        Json::Obj(vec![
            ("env".into(), env),
            ("runs".into(), runs),
            ("summary".into(), summary),
            ("targets".into(), lines(self.targets())),
            (
                "where_graphs_stop_helping".into(),
                lines(self.where_graphs_stop_helping()),
            ),
            ("records".into(), Json::Arr(self.records.clone())),
        ])
    }
}

fn fmt_us(v: f64) -> String {
    format!("{} µs", us(v))
}

fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "–".to_owned()
    }
}

/// Records of `examples/02-chain.rs`, read from its Markdown tables: ours from the wall-time
/// table, PyTorch's from the PyTorch table when it printed one. Times are per whole chain.
pub fn chain_records(output: &str) -> Vec<Json> {
    use super::json::Record;
    let mut out = Vec::new();
    for t in table::parse_markdown_tables(output) {
        let (Some(n), Some(per_kernel), Some(replay)) = (
            t.numbers("N"),
            t.numbers("eager µs/kernel"),
            t.numbers("ours replay µs"),
        ) else {
            if let (Some(n), Some(eager), Some(graph)) = (
                t.numbers("N"),
                t.numbers("torch eager µs/op"),
                t.numbers("torch graph µs/node"),
            ) {
                for ((n, e), g) in n.into_iter().zip(eager).zip(graph) {
                    if let (Some(n), Some(e), Some(g)) = (n, e, g) {
                        out.push(
                            Record::new("chain", "torch")
                                .set("kernels_n", n)
                                .set("eager_us", e * n)
                                .set("graph_us", g * n)
                                .into_json(),
                        );
                    }
                }
            }
            continue;
        };
        let launch = t.numbers("ours launch-only µs").unwrap_or_default();
        for (i, ((n, e), g)) in n.into_iter().zip(per_kernel).zip(replay).enumerate() {
            if let (Some(n), Some(e), Some(g)) = (n, e, g) {
                let mut r = Record::new("chain", "ours")
                    .set("kernels_n", n)
                    .set("kernels", n)
                    .set("eager_us", e * n)
                    .set("graph_us", g);
                if let Some(Some(l)) = launch.get(i) {
                    r = r.set("graph_launch_us", *l);
                }
                out.push(r.into_json());
            }
        }
    }
    out
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch.
pub fn utc_timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// A CUDA version number as the driver reports it (`13000`) in the usual form (`13.0`).
pub fn cuda_version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The version of crate `name` in a `Cargo.lock` text.
pub fn locked_version(lock: &str, name: &str) -> Option<String> {
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l.trim() == format!("name = \"{name}\"") {
            let v = lines.next()?.trim();
            return v
                .strip_prefix("version = \"")
                .and_then(|v| v.strip_suffix('"'))
                .map(str::to_owned);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::json::Record;

    fn rec(bench: &str, side: &str, fields: &[(&str, f64)]) -> Json {
        let mut r = Record::new(bench, side);
        for (k, v) in fields {
            r = r.set(k, *v);
        }
        r.into_json()
    }

    fn sample() -> Report {
        let mut records = Vec::new();
        for (b, e, g, gpu) in [
            (1.0, 400.0, 80.0, 70.0),
            (64.0, 420.0, 100.0, 95.0),
            (4096.0, 2000.0, 1950.0, 1940.0),
        ] {
            records.push(rec(
                "mlp",
                "ours",
                &[
                    ("batch", b),
                    ("layers", 16.0),
                    ("dim", 512.0),
                    ("eager_us", e),
                    ("graph_us", g),
                    ("eager_gpu_us", gpu),
                    ("kernels", 32.0),
                ],
            ));
        }
        for (b, e, g) in [(1.0, 485.0, 103.0), (64.0, 500.0, 120.0)] {
            records.push(rec(
                "mlp",
                "torch",
                &[
                    ("batch", b),
                    ("layers", 16.0),
                    ("dim", 512.0),
                    ("eager_us", e),
                    ("graph_us", g),
                ],
            ));
        }
        records.push(rec(
            "train",
            "ours",
            &[
                ("batch", 32.0),
                ("eager_us", 300.0),
                ("graph_us", 100.0),
                ("kernels", 22.0),
            ],
        ));
        records.push(rec(
            "train",
            "torch",
            &[("batch", 16.0), ("eager_us", 900.0), ("graph_us", 90.0)],
        ));
        records.push(rec(
            "decode",
            "ours",
            &[
                ("layers", 8.0),
                ("eager_us", 350.0),
                ("graph_us", 90.0),
                ("kernels", 76.0),
            ],
        ));
        records.push(rec("env", "torch", &[]));
        let checked = Record::new("dropout_train", "ours")
            .set("check", "loss curve bitwise")
            .set("agree", false)
            .into_json();
        records.push(checked);
        Report {
            env: vec![("GPU".into(), "Test GPU".into())],
            runs: vec![Run {
                name: "04-mlp-inference".into(),
                ok: true,
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
    fn markdown_json_and_svg() {
        let r = sample();
        let md = r.markdown();
        assert!(md.contains("| GPU | Test GPU |"));
        assert!(md.contains("| MLP 16×(Linear 512→512+GELU), batch 1 | 400.0 | 80.0 | 5.00× | 485.0 | 103.0 | 4.71× | 0.78 |"), "{md}");
        assert!(md.contains("(shapes differ: batch)"));
        assert!(md.contains("## Where graphs stop helping"));
        assert!(md.contains("| 04-mlp-inference | ok | 1.5 | 3 |"));
        assert!(md.contains("| loss curve bitwise | DIFFER |"), "{md}");
        assert!(Report::default().markdown().contains("No agreement checks"));
        let j = Json::parse(&r.json().to_string()).unwrap();
        assert_eq!(
            j.get("summary").and_then(Json::as_array).map(<[Json]>::len),
            Some(6)
        );
        assert_eq!(j.get("env").and_then(|e| e.str("GPU")), Some("Test GPU"));
        let svg = r.svg();
        assert_eq!(
            svg.matches("<polyline").count(),
            2,
            "ours and PyTorch MLP lines"
        );
        assert!(svg.contains("MLP b=1") && svg.contains("decode") && svg.contains("train"));
    }

    #[test]
    fn reads_chain_tables() {
        let out = "\
| N | eager µs/kernel | ours replay µs | ours µs/node | raw cudarc replay µs | raw µs/node | ours/raw | ours launch-only µs | raw launch-only µs | speedup vs eager |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| 10 | 3.00 | 10.0 | 1.000 | 9.0 | 0.900 | 1.111 | 8.0 | 7.5 | 3.0× |
| 1000 | 2.50 | 1200.0 | 1.200 | 1190.0 | 1.190 | 1.008 | 1190.0 | 1185.0 | 2.1× |

| N | ours replay host µs | raw replay host µs | extra µs |
|---:|---:|---:|---:|
| 10 | 3.0 | 2.9 | +0.1 |

PyTorch, same chain
| N | torch eager µs/op | torch graph µs/node | ours µs/node | torch replay host µs | ours host µs | torch capture ms |
|---:|---:|---:|---:|---:|---:|---:|
| 10 | 9.00 | 1.250 | 1.000 | 5.00 | 3.00 | 1.00 |
";
        let recs = chain_records(out);
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].num("kernels_n"), Some(10.0));
        assert_eq!(recs[0].num("eager_us"), Some(30.0));
        assert_eq!(recs[0].num("graph_us"), Some(10.0));
        assert_eq!(recs[0].num("graph_launch_us"), Some(8.0));
        assert_eq!(recs[1].num("eager_us"), Some(2500.0));
        assert_eq!(recs[2].str("side"), Some("torch"));
        assert_eq!(recs[2].num("eager_us"), Some(90.0));
        assert_eq!(recs[2].num("graph_us"), Some(12.5));
        let report = Report {
            records: recs,
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

    #[test]
    fn timestamps_and_lock_versions() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_timestamp(951_782_400 + 3_661), "2000-02-29 01:01 UTC");
        assert_eq!(utc_timestamp(1_798_761_600), "2027-01-01 00:00 UTC");
        let lock = "[[package]]\nname = \"cudarc\"\nversion = \"0.19.10\"\nsource = \"x\"\n\n[[package]]\nname = \"rand\"\nversion = \"0.9.5\"\n";
        assert_eq!(locked_version(lock, "cudarc").as_deref(), Some("0.19.10"));
        assert_eq!(locked_version(lock, "rand").as_deref(), Some("0.9.5"));
        assert_eq!(locked_version(lock, "serde"), None);
        assert_eq!(cuda_version_text(13000), "13.0");
        assert_eq!(cuda_version_text(12080), "12.8");
    }
}
