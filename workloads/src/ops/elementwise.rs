//! Launchers of the element-wise kernels of [`crate::kernels::ELEMENTWISE`] that the MLP
//! examples use around their GEMMs: bias + GELU (`04-mlp-inference`, `10-tensor-parallel-mlp`),
//! bias + residual after an all-reduce, and a fill of a matrix block by position (the
//! tensor-parallel example's weights, equal on one GPU and split over two).
//!
//! Each launcher asserts that its buffers hold what the kernel addresses, then launches on the
//! runtime's stream (capturable: no allocation, no sync). Row-major `[rows, cols]` matrices.

use graph_runtime::cudarc::driver::{DevicePtr, DevicePtrMut};
use graph_runtime::{GraphError, Runtime};

use super::{elems, row_bias_kernel, Launch};
use crate::kernels::ELEMENTWISE;

/// `y = gelu(z + bias)` per row of `[rows, cols]` matrices (tanh approximation).
pub fn bias_gelu(
    rt: &Runtime,
    z: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    y: &mut impl DevicePtrMut<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError> {
    row_bias_kernel(rt, (ELEMENTWISE, "bias_gelu"), z, bias, y, rows, cols)
}

/// `out = res + (y + bias)` per row of `[rows, cols]` matrices: a row-parallel layer's bias,
/// added once after the all-reduce of its partial sums, and the residual connection. `out`
/// must be another buffer than `y` and `res` (the borrows see to it).
pub fn bias_residual(
    rt: &Runtime,
    y: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    res: &impl DevicePtr<f32>,
    out: &mut impl DevicePtrMut<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError> {
    let n = rows * cols;
    let launch = Launch::new(rt, ELEMENTWISE, "bias_residual")?
        .read("y", y, n)
        .read("bias", bias, cols)
        .read("res", res, n)
        .write("out", out, n)
        .int(rows)
        .int(cols);
    // SAFETY: one thread per element reads rows · cols of `y` and `res` and cols of `bias`,
    // and writes rows · cols of `out`.
    unsafe { launch.launch(elems(n)) }
}

/// Where a block of a matrix sits in the whole: the whole matrix's columns and the block's
/// first row and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockAt {
    /// Columns of the whole matrix.
    pub full_cols: usize,
    /// The block's first row in the whole matrix.
    pub row0: usize,
    /// The block's first column in the whole matrix.
    pub col0: usize,
}

impl BlockAt {
    /// The whole of a matrix of `cols` columns (or its first rows).
    pub fn whole(cols: usize) -> Self {
        BlockAt {
            full_cols: cols,
            row0: 0,
            col0: 0,
        }
    }
}

/// Fills `out`, the `[rows, cols]` block `at` of a matrix, with `scale · u`: `u` uniform in
/// `[-1, 1)`, a hash of `seed` and the entry's position in the whole matrix. A block filled
/// on one GPU therefore holds the numbers of the same block of the whole matrix filled on
/// another.
pub fn init_uniform(
    rt: &Runtime,
    out: &mut impl DevicePtrMut<f32>,
    rows: usize,
    cols: usize,
    at: BlockAt,
    seed: u32,
    scale: f32,
) -> Result<(), GraphError> {
    assert!(
        at.col0 + cols <= at.full_cols,
        "init_uniform: columns {}..{} of a matrix of {}",
        at.col0,
        at.col0 + cols,
        at.full_cols
    );
    let n = rows * cols;
    let launch = Launch::new(rt, ELEMENTWISE, "init_uniform")?
        .write("out", out, n)
        .int(rows)
        .int(cols)
        .int(at.row0)
        .int(at.col0)
        .int(at.full_cols)
        .uint(seed)
        .float(scale);
    // SAFETY: one thread per element writes rows · cols floats of `out`; the position is
    // only hashed, never used as an address.
    unsafe { launch.launch(elems(n)) }
}
