//! GPU operations the tests and examples compose, each a safe function over cudarc buffers
//! that checks what its kernel or library call will address and then issues it on the
//! runtime's stream (so a `#[cuda_graph]` body can call it).
//!
//! * [`blas`]: row-major matrix products on cuBLAS;
//! * [`linear`]: the fused `linear_bias_gelu` kernel, launched in order or early;
//! * [`lt`]: a linear layer with bias and GELU as one FP32 cuBLASLt call;
//! * [`train`]: the non-GEMM kernels of a training step.

pub mod blas;
pub mod linear;
pub mod lt;
pub mod train;
