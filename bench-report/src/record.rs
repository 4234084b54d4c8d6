//! The lines a benchmark program prints for the report: one JSON object per line, among its
//! tables and logs.
//!
//! A [`Record`] is one measurement of one workload by one side (ours or PyTorch):
//!
//! ```json
//! {"bench":"mlp","side":"ours","workload":"mlp/1","what":"MLP 16×(Linear 512→512+GELU), batch 1",
//!  "shape":{"batch":1,"dim":512,"layers":16},"eager_us":400.0,"graph_us":80.0,"kernels":16,
//!  "check":"output bitwise eager vs graph","agree":true,"eager_gpu_us":70.0}
//! ```
//!
//! The record says everything the report needs to know about its workload: `workload` pairs
//! ours with PyTorch's, `what` names it in the tables, `shape` is compared between the two
//! sides. A new workload needs a program that prints records, and nothing in the report.
//! Fields beyond the named ones are kept (in [`Record::more`]) and land in `report.json`.
//!
//! An environment line, `{"env": [["PyTorch", "2.5.1"], …]}`, adds facts to the report's
//! header. Any other line that is not a JSON object is not the report's (a table, a log).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// Who measured a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// This workspace's Rust program.
    Ours,
    /// The PyTorch reference script.
    Torch,
}

/// One measurement: a workload, eager and as a graph, by one side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The benchmark (`chain`, `mlp`, `decode`, `train`, `dropout_train`): a family of
    /// workloads, such as the MLP at every batch size.
    pub bench: String,
    /// Who measured it.
    pub side: Side,
    /// The workload: ours and PyTorch's records of one workload share it (`mlp/1`).
    pub workload: String,
    /// The workload in words, for the tables.
    pub what: String,
    /// What makes up the workload's shape (`batch`, `layers`, …): compared between ours and
    /// PyTorch's record of one workload.
    #[serde(default)]
    pub shape: BTreeMap<String, Value>,
    /// µs per call of the workload's unit (one forward, one token, one step, one chain),
    /// eager.
    #[serde(deserialize_with = "number_or_nan")]
    pub eager_us: f64,
    /// The same as a graph, including the copy of new inputs where the workload has inputs.
    #[serde(deserialize_with = "number_or_nan")]
    pub graph_us: f64,
    /// Kernel nodes of the graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<u64>,
    /// What was compared between eager and graph (and the host), when the program checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// Whether [`Record::check`] held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agree: Option<bool>,
    /// Everything else the program measured (`eager_gpu_us`, `graph_launch_us`, …).
    #[serde(flatten)]
    pub more: Map<String, Value>,
}

/// A JSON number, or `null` for a figure that could not be measured (JSON has no NaN).
fn number_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl Record {
    /// A record of `workload` (of benchmark `bench`, described as `what`) by `side`.
    pub fn new(
        bench: &str,
        side: Side,
        workload: impl Into<String>,
        what: impl Into<String>,
        eager_us: f64,
        graph_us: f64,
    ) -> Self {
        Record {
            bench: bench.to_owned(),
            side,
            workload: workload.into(),
            what: what.into(),
            shape: BTreeMap::new(),
            eager_us,
            graph_us,
            kernels: None,
            check: None,
            agree: None,
            more: Map::new(),
        }
    }

    /// Adds a field of the workload's shape.
    pub fn shape(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.shape.insert(key.to_owned(), value.into());
        self
    }

    /// Sets the graph's kernel count.
    pub fn kernels(mut self, kernels: usize) -> Self {
        self.kernels = Some(kernels as u64);
        self
    }

    /// Sets what was checked and whether it held.
    pub fn check(mut self, check: impl Into<String>, agree: bool) -> Self {
        self.check = Some(check.into());
        self.agree = Some(agree);
        self
    }

    /// Adds (or replaces) another measured field.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.more.insert(key.to_owned(), value.into());
        self
    }

    /// A field of the shape, as a number.
    pub fn shape_num(&self, key: &str) -> Option<f64> {
        self.shape.get(key).and_then(Value::as_f64)
    }

    /// Another measured field, as a number.
    pub fn num(&self, key: &str) -> Option<f64> {
        self.more.get(key).and_then(Value::as_f64)
    }

    /// The record as one line of JSON.
    pub fn line(&self) -> String {
        serde_json::to_string(self).expect("a record is plain JSON data")
    }

    /// Our eager time over our graph time.
    pub fn speedup(&self) -> f64 {
        self.eager_us / self.graph_us
    }
}

/// A line of a program's output that is JSON but not what the report reads.
#[derive(Debug, thiserror::Error)]
#[error("line {line} is not a benchmark record: {source}")]
pub struct BadLine {
    /// The line number, from 1.
    pub line: usize,
    /// Why it does not read as a record (or an environment line).
    #[source]
    pub source: serde_json::Error,
}

/// What the report reads from one program's output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    /// The records, in order.
    pub records: Vec<Record>,
    /// Facts of `{"env": …}` lines, in order.
    pub env: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvLine {
    env: Vec<(String, String)>,
}

/// Reads a program's output: every line that is a JSON object must be a [`Record`] or an
/// environment line; other lines (tables, logs) are skipped.
pub fn read_output(text: &str) -> Result<Output, BadLine> {
    let mut out = Output::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if !(line.starts_with('{') && line.ends_with('}')) {
            continue;
        }
        let bad = |source| BadLine {
            line: i + 1,
            source,
        };
        let value: Value = serde_json::from_str(line).map_err(bad)?;
        if value.get("env").is_some() {
            out.env
                .extend(serde_json::from_value::<EnvLine>(value).map_err(bad)?.env);
        } else {
            out.records
                .push(serde_json::from_value(value).map_err(bad)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mlp() -> Record {
        Record::new("mlp", Side::Ours, "mlp/1", "MLP, batch 1", 400.0, 80.0)
            .shape("batch", 1)
            .shape("layers", 16)
            .kernels(16)
            .check("output bitwise", true)
            .with("eager_gpu_us", 70.5)
    }

    #[test]
    fn records_round_trip_through_one_line() {
        let r = mlp();
        let line = r.line();
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with(r#"{"bench":"mlp","side":"ours","workload":"mlp/1""#),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
        assert_eq!(r.shape_num("batch"), Some(1.0));
        assert_eq!(r.num("eager_gpu_us"), Some(70.5));
        assert_eq!(r.speedup(), 5.0);
    }

    #[test]
    fn unmeasured_figures_are_null_and_read_back_as_nan() {
        let r = Record::new("x", Side::Torch, "x", "x", f64::NAN, 1.0);
        let line = r.line();
        assert!(line.contains(r#""eager_us":null"#), "{line}");
        let back: Record = serde_json::from_str(&line).unwrap();
        assert!(back.eager_us.is_nan());
    }

    #[test]
    fn reads_records_and_env_lines_among_other_output() {
        let text = format!(
            "| a | b |\n|---|---|\n{}\nskipped x: no GPU\n{{\"env\": [[\"PyTorch\", \"2.5\"], [\"PyTorch CUDA\", \"12.4\"]]}}\n",
            mlp().line()
        );
        let out = read_output(&text).unwrap();
        assert_eq!(out.records, vec![mlp()]);
        assert_eq!(
            out.env,
            vec![
                ("PyTorch".to_owned(), "2.5".to_owned()),
                ("PyTorch CUDA".to_owned(), "12.4".to_owned())
            ]
        );
    }

    #[test]
    fn what_python_prints_reads() {
        let line = r#"{"bench": "mlp", "side": "torch", "workload": "mlp/4", "what": "MLP, batch 4", "shape": {"batch": 4}, "eager_us": 485.25, "graph_us": 1e-05, "u": "\u00b5s"}"#;
        let out = read_output(line).unwrap();
        let r = &out.records[0];
        assert_eq!(
            (r.side, r.eager_us, r.graph_us),
            (Side::Torch, 485.25, 1e-5)
        );
        assert_eq!(r.more.get("u").and_then(Value::as_str), Some("µs"));
    }

    #[test]
    fn a_json_line_that_is_no_record_is_an_error_with_its_line() {
        for (text, line) in [
            ("table\n{\"bench\": \"mlp\"}", 2),
            ("{broken}", 1),
            ("{\"env\": {\"PyTorch\": 2}}", 1),
            ("{\"env\": [], \"other\": 1}", 1),
        ] {
            let e = read_output(text).unwrap_err();
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(e.to_string().starts_with(&format!("line {line} ")), "{e}");
        }
    }
}
