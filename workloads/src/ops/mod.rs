//! GPU operations the tests and examples compose, each a safe function over cudarc buffers
//! that checks what its kernel or library call will address and then issues it on the
//! runtime's stream (so a `#[cuda_graph]` body can call it).
//!
//! * [`blas`]: row-major matrix products on cuBLAS;
//! * [`elementwise`]: bias + GELU, bias + residual, and a fill by position (the MLP and
//!   tensor-parallel examples);
//! * [`linear`]: the fused `linear_bias_gelu` kernel, launched in order or early;
//! * [`lt`]: a linear layer with bias and GELU as one FP32 cuBLASLt call;
//! * [`train`]: the non-GEMM kernels of a training step, one GPU or data-parallel.

use graph_runtime::cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use graph_runtime::{GraphError, Runtime};

pub mod blas;
pub mod elementwise;
pub mod linear;
pub mod lt;
pub mod train;

/// One thread per element, blocks of 256 (cudarc's `for_num_elems`).
pub(crate) fn elems(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(u32::try_from(n).expect("more elements than one launch covers"))
}

/// `grid` blocks of `threads`.
pub(crate) fn blocks(grid: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            u32::try_from(grid).expect("more blocks than one launch covers"),
            1,
            1,
        ),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A size as the kernels' `int`.
///
/// # Panics
/// Beyond `i32::MAX`.
pub(crate) fn int(v: usize) -> i32 {
    i32::try_from(v).expect("size exceeds the kernels' i32")
}

/// Asserts that a buffer holds what a kernel addresses.
///
/// # Panics
/// When `have < need`, naming `what`.
pub(crate) fn need(what: &str, have: usize, need: usize) {
    assert!(
        have >= need,
        "{what}: a buffer of {have} elements, need {need}"
    );
}

/// Launches `kernel` of `source`, a kernel `(x, bias, y, rows, cols)` with one thread per
/// element of `[rows, cols]` matrices that reads `x[r, c]` and `bias[c]` and writes `y[r, c]`
/// (`bias_add`, `bias_gelu`).
pub(crate) fn row_bias_kernel<X, B, Y>(
    rt: &Runtime,
    (source, kernel): (&str, &str),
    x: &X,
    bias: &B,
    y: &mut Y,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError>
where
    X: DevicePtr<f32>,
    B: DevicePtr<f32>,
    Y: DevicePtrMut<f32>,
{
    let n = rows * cols;
    need(&format!("{kernel} x"), x.len(), n);
    need(&format!("{kernel} bias"), bias.len(), cols);
    need(&format!("{kernel} y"), y.len(), n);
    let f = rt.function(source, kernel)?;
    let s = rt.stream();
    let ((xp, _a), (bp, _b), (yp, _c)) = (x.device_ptr(s), bias.device_ptr(s), y.device_ptr_mut(s));
    let (r, c) = (int(rows), int(cols));
    // SAFETY: the kernel's contract (above): one thread per element reads rows · cols of `x`
    // and cols of `bias` and writes rows · cols of `y` (asserted above).
    unsafe {
        s.launch_builder(&f)
            .arg(&xp)
            .arg(&bp)
            .arg(&yp)
            .arg(&r)
            .arg(&c)
            .launch(elems(n))?;
    }
    Ok(())
}
