//! The benchmark report: the records the benchmark programs print, and what is made of them.
//!
//! | module | owns |
//! | --- | --- |
//! | [`record`] | the JSON line a program prints per measurement ([`record::Record`]) and reading a program's output |
//! | [`programs`] | running a program, its log, how it ran ([`programs::Run`]) |
//! | [`summary`] | pairing ours with PyTorch's, the targets and their verdicts, where graphs stop helping |
//! | [`render`] | `report.md`, `report.json` and the figure |
//! | [`svg`] | the log-log line plot the figure is drawn with |
//! | [`table`] | Markdown tables and the number formats of every table |
//! | [`versions`] | the report's timestamp and the crate versions of the build |
//!
//! `examples/08-report.rs` runs the programs and writes the files; the benchmark examples and
//! `scripts/*.py` print the records.
//!
//! # Imports
//! Plain data processing on the CPU: this crate imports serde, serde_json, toml and
//! thiserror, and nothing of the workspace. It may not import `graph-runtime` or
//! `workloads`: machine facts come in as text, so the report is tested without a GPU.
//! Nothing here prints; the programs and the report binary do.

pub mod programs;
pub mod record;
pub mod render;
pub mod summary;
pub mod svg;
pub mod table;
pub mod versions;
