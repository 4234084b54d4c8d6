//! The root package of the workspace holds no library code: only the integration tests
//! (`tests/`) and the numbered examples (`examples/`).
//!
//! What they share lives in crates named for what it is: `workloads` (kernels, launchers,
//! host reference models, timing, the GPU test harness) and `bench-report` (the records the
//! examples print, Markdown tables, the benchmark report). The library itself is
//! `graph-runtime`.
//!
//! The tests and examples may import all three; nothing in the workspace imports this package.
