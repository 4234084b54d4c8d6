//! Launchers of the element-wise kernels of [`crate::kernels::ELEMENTWISE`] that the MLP
//! examples use around their GEMMs: bias + GELU (`04-mlp-inference`, `10-tensor-parallel-mlp`),
//! bias + residual after an all-reduce, and a fill of a matrix block by position (the
//! tensor-parallel example's weights, equal on one GPU and split over two).
//!
//! Each launcher asserts that its buffers hold what the kernel addresses, then launches on the
//! runtime's stream (capturable: no allocation, no sync). Row-major `[rows, cols]` matrices.

use graph_runtime::cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
use graph_runtime::{GraphError, Runtime};

use super::{elems, int, need, row_bias_kernel};
use crate::kernels::ELEMENTWISE;

/// `y = gelu(z + bias)` per row of `[rows, cols]` matrices (tanh approximation).
pub fn bias_gelu<Z, B, Y>(
    rt: &Runtime,
    z: &Z,
    bias: &B,
    y: &mut Y,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError>
where
    Z: DevicePtr<f32>,
    B: DevicePtr<f32>,
    Y: DevicePtrMut<f32>,
{
    row_bias_kernel(rt, (ELEMENTWISE, "bias_gelu"), z, bias, y, rows, cols)
}

/// `out = res + (y + bias)` per row of `[rows, cols]` matrices: a row-parallel layer's bias,
/// added once after the all-reduce of its partial sums, and the residual connection. `out`
/// must be another buffer than `y` and `res` (the borrows see to it).
pub fn bias_residual<Y, B, R, O>(
    rt: &Runtime,
    y: &Y,
    bias: &B,
    res: &R,
    out: &mut O,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError>
where
    Y: DevicePtr<f32>,
    B: DevicePtr<f32>,
    R: DevicePtr<f32>,
    O: DevicePtrMut<f32>,
{
    let n = rows * cols;
    need("bias_residual y", y.len(), n);
    need("bias_residual bias", bias.len(), cols);
    need("bias_residual res", res.len(), n);
    need("bias_residual out", out.len(), n);
    let f = rt.function(ELEMENTWISE, "bias_residual")?;
    let s = rt.stream();
    let ((yp, _a), (bp, _b), (rp, _c)) = (y.device_ptr(s), bias.device_ptr(s), res.device_ptr(s));
    let (op, _d) = out.device_ptr_mut(s);
    let (r, c) = (int(rows), int(cols));
    // SAFETY: one thread per element reads rows · cols of `y` and `res` and cols of `bias`,
    // and writes rows · cols of `out` (asserted above).
    unsafe {
        s.launch_builder(&f)
            .arg(&yp)
            .arg(&bp)
            .arg(&rp)
            .arg(&op)
            .arg(&r)
            .arg(&c)
            .launch(elems(n))?;
    }
    Ok(())
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
pub fn init_uniform<O: DevicePtrMut<f32>>(
    rt: &Runtime,
    out: &mut O,
    rows: usize,
    cols: usize,
    at: BlockAt,
    seed: u32,
    scale: f32,
) -> Result<(), GraphError> {
    let n = rows * cols;
    need("init_uniform out", out.len(), n);
    assert!(
        at.col0 + cols <= at.full_cols,
        "init_uniform: columns {}..{} of a matrix of {}",
        at.col0,
        at.col0 + cols,
        at.full_cols
    );
    let f = rt.function(ELEMENTWISE, "init_uniform")?;
    let s = rt.stream();
    let (op, _a) = out.device_ptr_mut(s);
    let (r, c, r0, c0, fc) = (
        int(rows),
        int(cols),
        int(at.row0),
        int(at.col0),
        int(at.full_cols),
    );
    // SAFETY: one thread per element writes rows · cols floats of `out` (asserted above); the
    // position is only hashed, never used as an address.
    unsafe {
        s.launch_builder(&f)
            .arg(&op)
            .arg(&r)
            .arg(&c)
            .arg(&r0)
            .arg(&c0)
            .arg(&fc)
            .arg(&seed)
            .arg(&scale)
            .launch(elems(n))?;
    }
    Ok(())
}
