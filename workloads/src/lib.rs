//! What the workspace's integration tests (`tests/`) and examples (`examples/`) run on the GPU,
//! and how they run and check it.
//!
//! | module | owns |
//! | --- | --- |
//! | [`kernels`] | the CUDA C++ sources (NVRTC) of every kernel the tests and examples launch |
//! | [`ops`] | GPU operations: cuBLAS row-major products, element-wise kernels (bias + GELU, bias + residual, a fill by position), the fused linear kernel, the cuBLASLt linear plan, the training kernels (one GPU and data-parallel); each launcher checks its buffers and holds the one `unsafe` launch with its `SAFETY` contract |
//! | [`decode`] | the decoder of `05-decode-step` and `14-decode-loop` on the GPU: weights and state as `DeviceState`, one step's launches (plain argmax, or the argmax that sets a `graph_while` condition), restart and the check against the host model |
//! | [`train`] | the training step of `06-train-step` and `07-dropout-train` (an MLP, MSE, clipping, AdamW, optional dropout) and its data |
//! | [`reference`](mod@reference) | host reference models in `f64`: the MLP, the decoder, the trainer |
//! | [`timing`] | wall and GPU timings, medians of [`timing::REPEATS`], also with the ranks of a multi-GPU program aligned before each batch |
//! | [`check`] | bit-for-bit and tolerance comparisons of results |
//! | [`testing`] | the GPU test harness (`#[gpu_test]`, `#[gpu_test(gpus = N)]`, `#[cpu_test]`, [`testing::run_tests`]), the GPU-or-skip policy of tests and examples, seeded random data |
//! | [`machine`] | facts about the GPU, the CUDA libraries and the NCCL settings, for the benchmark report and the tables |
//!
//! Feature `nccl` (graph-runtime's NCCL collectives): a multi-GPU test may take a
//! `graph_runtime::nccl::CommGroup` ([`testing::GpuFixture`]).
//!
//! # Imports
//! This crate builds on `graph-runtime` (and the cudarc it re-exports). It may not import
//! `bench-report` (records and tables are the report's, and the examples write them) nor
//! anything of the root package: tests and examples depend on it, not the other way round.
//! Nothing here prints except [`testing`]: the harness writes libtest's output and says why
//! GPU tests are ignored, and [`testing::runtime_or_skip`] and [`testing::gpus_or_skip`] say why
//! an example skips.

pub mod check;
pub mod decode;
pub mod kernels;
pub mod machine;
pub mod ops;
pub mod reference;
pub mod testing;
pub mod timing;
pub mod train;
