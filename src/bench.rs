//! Host helpers of the model examples (`examples/04-…` to `07-…`) and of the benchmark report
//! (`examples/08-report.rs`): timing, tables, JSON lines, the SVG plot, cuBLAS row-major
//! and cuBLASLt helpers and host reference implementations of the example models.
//!
//! Everything here except [`wall_us`], [`gpu_us`] and the launch helpers in [`blas`] runs on
//! the CPU and is unit-tested there.
//!
//! # Conventions
//! * Timings are medians of [`REPEATS`] measurements. A *wall* time is `iters` calls issued
//!   back to back, then one synchronize, divided by `iters`: what a caller that keeps the GPU
//!   busy sees per call. A *GPU* time comes from CUDA events around the same loop.
//! * Each example prints a Markdown table; with `--json` it also prints one JSON object per
//!   line (see [`json::Record`]); the report collects those lines.

use std::time::Instant;

use graph_runtime::cudarc::driver::sys::CUevent_flags;
use graph_runtime::cudarc::driver::CudaStream;
use graph_runtime::GraphError;

pub mod blas;
pub mod json;
pub mod linear;
pub mod lt;
pub mod reference;
pub mod report;
pub mod svg;
pub mod table;

/// Measurements per timing; the median is reported.
pub const REPEATS: usize = 7;

/// The median of `v` (the upper one of the two middle values for an even length).
///
/// # Panics
/// If `v` is empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of no values");
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median over [`REPEATS`] of the wall time per call (µs) of `f` called `iters` times back to
/// back, the stream synchronized before and after each batch of calls.
pub fn wall_us(
    s: &CudaStream,
    iters: usize,
    mut f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    let iters = iters.max(1);
    let mut per = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        s.synchronize()?;
        per.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    Ok(median(per))
}

/// Median over [`REPEATS`] of the GPU time per call (µs) of `f` called `iters` times,
/// measured with CUDA events recorded on `s` around the loop.
pub fn gpu_us(
    s: &CudaStream,
    iters: usize,
    mut f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    let iters = iters.max(1);
    let mut per = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        for _ in 0..iters {
            f()?;
        }
        let end = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        per.push(start.elapsed_ms(&end)? as f64 * 1e3 / iters as f64);
    }
    Ok(median(per))
}

/// How many calls of about `estimate_us` each fill `budget_us`, clamped to `[min, max]`.
pub fn iters_for(estimate_us: f64, budget_us: f64, min: usize, max: usize) -> usize {
    let n = if estimate_us.is_finite() && estimate_us > 0.0 {
        (budget_us / estimate_us).floor()
    } else {
        max as f64
    };
    (n.max(0.0) as usize).clamp(min, max)
}

/// Command-line flags shared by the examples: `--json` and `--NAME VALUE` options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cli {
    /// Print JSON lines after the tables.
    pub json: bool,
    args: Vec<String>,
}

impl Cli {
    /// Parses the process arguments.
    pub fn from_env() -> Self {
        Self::parse(std::env::args().skip(1))
    }

    /// Parses `args` (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Self {
        let args: Vec<String> = args.into_iter().collect();
        Cli {
            json: args.iter().any(|a| a == "--json"),
            args,
        }
    }

    /// Whether `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        let flag = format!("--{name}");
        self.args.contains(&flag)
    }

    /// The value after `--name`, if given.
    pub fn value(&self, name: &str) -> Option<&str> {
        let flag = format!("--{name}");
        self.args
            .iter()
            .position(|a| *a == flag)
            .and_then(|i| self.args.get(i + 1))
            .map(String::as_str)
    }

    /// A comma-separated list of numbers after `--name`, or `default` when absent.
    pub fn usize_list(&self, name: &str, default: &[usize]) -> Result<Vec<usize>, String> {
        match self.value(name) {
            None => Ok(default.to_vec()),
            Some(v) => v
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| {
                    s.trim()
                        .parse::<usize>()
                        .map_err(|e| format!("--{name}: `{s}` is not a count: {e}"))
                })
                .collect(),
        }
    }

    /// A number after `--name`, or `default` when absent.
    pub fn usize_or(&self, name: &str, default: usize) -> Result<usize, String> {
        match self.value(name) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|e| format!("--{name}: `{v}` is not a count: {e}")),
        }
    }
}

/// Where two `f32` sequences first differ bit for bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mismatch {
    /// The first index whose values differ (or the shorter length, if one is a prefix).
    pub index: usize,
    /// The value of the first sequence there (`NaN` past its end).
    pub a: f32,
    /// The value of the second sequence there (`NaN` past its end).
    pub b: f32,
}

/// The first index where `a` and `b` differ bit for bit (lengths included), or `None` when
/// they are identical. `-0.0` and `0.0` differ; two NaNs with the same bits do not.
pub fn first_mismatch(a: &[f32], b: &[f32]) -> Option<Mismatch> {
    let common = a.len().min(b.len());
    if let Some(i) = (0..common).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        return Some(Mismatch {
            index: i,
            a: a[i],
            b: b[i],
        });
    }
    (a.len() != b.len()).then(|| Mismatch {
        index: common,
        a: a.get(common).copied().unwrap_or(f32::NAN),
        b: b.get(common).copied().unwrap_or(f32::NAN),
    })
}

/// The largest `|a - b| / max(1, |b|)`: an error that is absolute near zero and relative
/// for large values.
///
/// # Panics
/// If the slices differ in length.
pub fn max_scaled_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_lengths() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(vec![5.0]), 5.0);
    }

    #[test]
    #[should_panic(expected = "median of no values")]
    fn median_of_nothing_panics() {
        median(Vec::new());
    }

    #[test]
    fn iteration_counts_fill_the_budget() {
        assert_eq!(iters_for(100.0, 10_000.0, 1, 1000), 100);
        assert_eq!(iters_for(1.0, 10_000.0, 1, 1000), 1000);
        assert_eq!(iters_for(1e6, 10_000.0, 3, 1000), 3);
        assert_eq!(iters_for(0.0, 10_000.0, 3, 50), 50);
        assert_eq!(iters_for(f64::NAN, 10_000.0, 3, 50), 50);
    }

    #[test]
    fn cli_flags_and_lists() {
        let cli = Cli::parse(
            ["--batches", "1, 2,64", "--json", "--tokens", "16"]
                .iter()
                .map(|s| s.to_string()),
        );
        assert!(cli.json);
        assert!(cli.flag("json") && !cli.flag("no-torch"));
        assert_eq!(cli.usize_list("batches", &[7]).unwrap(), vec![1, 2, 64]);
        assert_eq!(cli.usize_list("other", &[7]).unwrap(), vec![7]);
        assert_eq!(cli.usize_or("tokens", 256).unwrap(), 16);
        assert_eq!(cli.usize_or("steps", 200).unwrap(), 200);
        let bad = Cli::parse(["--batches", "1,x"].iter().map(|s| s.to_string()));
        assert!(bad.usize_list("batches", &[]).unwrap_err().contains("`x`"));
        assert!(!Cli::parse(Vec::new()).json);
    }

    #[test]
    fn bitwise_mismatches() {
        assert_eq!(first_mismatch(&[1.0, 2.0], &[1.0, 2.0]), None);
        let m = first_mismatch(&[1.0, 2.0, 3.0], &[1.0, 2.5, 3.0]).unwrap();
        assert_eq!((m.index, m.a, m.b), (1, 2.0, 2.5));
        // Sign of zero counts: the curves must be bitwise identical.
        assert_eq!(first_mismatch(&[0.0], &[-0.0]).unwrap().index, 0);
        // The smallest possible difference is found.
        let x = 1.0f32;
        let next = f32::from_bits(x.to_bits() + 1);
        assert_eq!(first_mismatch(&[x], &[next]).unwrap().index, 0);
        // A prefix is a mismatch at the shorter length.
        let m = first_mismatch(&[1.0], &[1.0, 2.0]).unwrap();
        assert_eq!(m.index, 1);
        assert!(m.a.is_nan());
        assert_eq!(m.b, 2.0);
        // Identical NaN bits are equal.
        assert_eq!(first_mismatch(&[f32::NAN], &[f32::NAN]), None);
    }

    #[test]
    fn scaled_differences() {
        assert_eq!(max_scaled_diff(&[1.0, 200.0], &[1.0, 200.0]), 0.0);
        assert!((max_scaled_diff(&[0.5], &[0.25]) - 0.25).abs() < 1e-7);
        assert!((max_scaled_diff(&[110.0], &[100.0]) - 0.1).abs() < 1e-6);
    }
}
