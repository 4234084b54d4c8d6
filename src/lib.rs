//! The root package of the workspace holds no library code: only the integration tests
//! (`tests/`) and the numbered examples (`examples/`).
//!
//! What they share lives in crates named for what it is: `workloads` (kernels, launchers,
//! host reference models, timing, the GPU test harness) and `bench-report` (the records the
//! examples print, Markdown tables, the benchmark report). The library itself is
//! `graph-runtime`.
//!
//! The tests and examples may import all three; nothing in the workspace imports this package.

/// The README's Rust code blocks, compiled as doctests (`cargo test --workspace` runs them;
/// `no_run`: they need a GPU to run). A block that cannot compile here says `ignore` and
/// where its compiled twin lives.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
