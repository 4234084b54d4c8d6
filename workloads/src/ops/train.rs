//! Launchers of the training kernels ([`crate::kernels::TRAIN`]): everything in a training
//! step of an MLP that is not a GEMM, on one GPU or on one rank of a data-parallel group
//! ([`select_rows`], [`mse_loss_into`], [`finish_step`]). Row-major matrices; `rows` is the
//! batch.
//!
//! Each launcher checks that its buffers hold what the kernel addresses (a panic naming the
//! kernel and the buffer), then launches on the runtime's stream (capturable: no device
//! allocation, no sync). Buffers are any cudarc device memory (`CudaSlice`, `CudaView`,
//! `CudaViewMut`); the kernels get their addresses.

use graph_runtime::cudarc::driver::{DevicePtr, DevicePtrMut};
use graph_runtime::{GraphError, Runtime};

use super::{blocks, elems, row_bias_kernel, Launch};
use crate::kernels::TRAIN;
use crate::reference::AdamW;

/// Threads per block of the grid-stride kernels (the gradient norm, the optimizer).
const THREADS: u32 = 256;

/// Copies mini-batch `*step % batches` of the data set into `x` (`x_len` values) and `t`
/// (`t_len` values); `xs` and `ts` hold `batches` of each.
#[allow(clippy::too_many_arguments)] // the kernel's parameters
pub fn select_batch(
    rt: &Runtime,
    xs: &impl DevicePtr<f32>,
    ts: &impl DevicePtr<f32>,
    step: &impl DevicePtr<i32>,
    x: &mut impl DevicePtrMut<f32>,
    t: &mut impl DevicePtrMut<f32>,
    batches: usize,
    x_len: usize,
    t_len: usize,
) -> Result<(), GraphError> {
    let launch = Launch::new(rt, TRAIN, "select_batch")?
        .read("xs", xs, batches * x_len)
        .read("ts", ts, batches * t_len)
        .read("step", step, 1)
        .write("x", x, x_len)
        .write("t", t, t_len)
        .int(batches)
        .int(x_len)
        .int(t_len);
    // SAFETY: the kernel copies x_len values of batch (*step % batches) of `xs` and t_len of
    // `ts`, inside the batches · x_len and batches · t_len they hold, into `x` and `t`.
    unsafe { launch.launch(elems(x_len.max(t_len))) }
}

/// The rows of a data set one rank trains on in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankRows {
    /// Mini-batches in the data set; step `s` uses mini-batch `s % batches`.
    pub batches: usize,
    /// Rows of one mini-batch, over all ranks.
    pub global_rows: usize,
    /// This rank's first row within the mini-batch.
    pub row0: usize,
    /// This rank's rows.
    pub rows: usize,
    /// Inputs per row.
    pub in_dim: usize,
    /// Targets per row.
    pub out_dim: usize,
}

/// Copies rows `at.row0..at.row0 + at.rows` of mini-batch `*step % at.batches` of the data set
/// (`xs`: `[batches · global_rows, in_dim]`, `ts`: `[batches · global_rows, out_dim]`) into `x`
/// and `t`: one rank's share of the step's mini-batch.
///
/// # Panics
/// If a buffer is shorter than `at` needs, or the rank's rows leave the mini-batch.
pub fn select_rows(
    rt: &Runtime,
    xs: &impl DevicePtr<f32>,
    ts: &impl DevicePtr<f32>,
    step: &impl DevicePtr<i32>,
    x: &mut impl DevicePtrMut<f32>,
    t: &mut impl DevicePtrMut<f32>,
    at: RankRows,
) -> Result<(), GraphError> {
    assert!(
        at.row0 + at.rows <= at.global_rows,
        "select_rows: rows {}..{} of a mini-batch of {}",
        at.row0,
        at.row0 + at.rows,
        at.global_rows
    );
    let all = at.batches * at.global_rows;
    let launch = Launch::new(rt, TRAIN, "select_rows")?
        .read("xs", xs, all * at.in_dim)
        .read("ts", ts, all * at.out_dim)
        .read("step", step, 1)
        .write("x", x, at.rows * at.in_dim)
        .write("t", t, at.rows * at.out_dim)
        .int(at.batches)
        .int(at.global_rows)
        .int(at.row0)
        .int(at.rows)
        .int(at.in_dim)
        .int(at.out_dim);
    // SAFETY: the kernel copies rows · in_dim inputs and rows · out_dim targets starting at
    // row (*step % batches) · global_rows + row0, which with row0 + rows ≤ global_rows
    // (asserted) stays inside the batches · global_rows rows `xs` and `ts` hold, into `x` and
    // `t`.
    unsafe { launch.launch(elems(at.rows * at.in_dim.max(at.out_dim))) }
}

/// `z = x + bias` per row and `y = gelu(z)` for `[rows, cols]` matrices; `z` is kept for the
/// backward pass.
pub fn bias_gelu_fwd(
    rt: &Runtime,
    x: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    z: &mut impl DevicePtrMut<f32>,
    y: &mut impl DevicePtrMut<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError> {
    let n = rows * cols;
    let launch = Launch::new(rt, TRAIN, "bias_gelu_fwd")?
        .read("x", x, n)
        .read("bias", bias, cols)
        .write("z", z, n)
        .write("y", y, n)
        .int(rows)
        .int(cols);
    // SAFETY: one thread per element reads rows · cols of `x` and cols of `bias` and writes
    // rows · cols of `z` and `y`.
    unsafe { launch.launch(elems(n)) }
}

/// `y = x + bias` per row for `[rows, cols]` matrices.
pub fn bias_add(
    rt: &Runtime,
    x: &impl DevicePtr<f32>,
    bias: &impl DevicePtr<f32>,
    y: &mut impl DevicePtrMut<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError> {
    row_bias_kernel(rt, (TRAIN, "bias_add"), x, bias, y, rows, cols)
}

/// `dz = dy · gelu'(z)` over `n` elements.
pub fn gelu_bwd(
    rt: &Runtime,
    dy: &impl DevicePtr<f32>,
    z: &impl DevicePtr<f32>,
    dz: &mut impl DevicePtrMut<f32>,
    n: usize,
) -> Result<(), GraphError> {
    let launch = Launch::new(rt, TRAIN, "gelu_bwd")?
        .read("dy", dy, n)
        .read("z", z, n)
        .write("dz", dz, n)
        .int(n);
    // SAFETY: one thread per element reads n of `dy` and `z` and writes n of `dz`.
    unsafe { launch.launch(elems(n)) }
}

/// `dx = mask ? dy / keep_prob : 0` over `n` elements: the backward pass of
/// `graph_runtime::Generator::dropout`.
pub fn dropout_bwd(
    rt: &Runtime,
    dy: &impl DevicePtr<f32>,
    mask: &impl DevicePtr<u8>,
    dx: &mut impl DevicePtrMut<f32>,
    keep_prob: f32,
    n: usize,
) -> Result<(), GraphError> {
    let launch = Launch::new(rt, TRAIN, "dropout_bwd")?
        .read("dy", dy, n)
        .read("mask", mask, n)
        .write("dx", dx, n)
        .float(keep_prob)
        .int(n);
    // SAFETY: one thread per element reads n of `dy` and of the byte mask and writes n of
    // `dx`.
    unsafe { launch.launch(elems(n)) }
}

/// `db[c] = Σ_r dz[r, c]` for a `[rows, cols]` matrix, rows added in order.
pub fn col_sum(
    rt: &Runtime,
    dz: &impl DevicePtr<f32>,
    db: &mut impl DevicePtrMut<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError> {
    let launch = Launch::new(rt, TRAIN, "col_sum")?
        .read("dz", dz, rows * cols)
        .write("db", db, cols)
        .int(rows)
        .int(cols);
    // SAFETY: one thread per column reads the rows · cols of `dz` and writes cols of `db`.
    unsafe { launch.launch(elems(cols)) }
}

/// Mean squared error over `n` outputs in one block: `dy = 2 (y - t) / n`, and
/// `losses[*step] = mean((y - t)²)` while `*step < losses.len()`.
pub fn mse_loss(
    rt: &Runtime,
    y: &impl DevicePtr<f32>,
    t: &impl DevicePtr<f32>,
    dy: &mut impl DevicePtrMut<f32>,
    losses: &mut impl DevicePtrMut<f32>,
    step: &impl DevicePtr<i32>,
    n: usize,
) -> Result<(), GraphError> {
    let capacity = losses.len();
    let launch = Launch::new(rt, TRAIN, "mse_loss")?
        .read("y", y, n)
        .read("t", t, n)
        .write("dy", dy, n)
        .write("losses", losses, capacity)
        .read("step", step, 1)
        .int(n)
        .int(capacity);
    // SAFETY: one block of 1024 threads (a multiple of 32, as the kernel's block sum needs)
    // reads n of `y` and `t`, writes n of `dy`, and writes losses[*step] only while
    // *step < capacity, the length of `losses`.
    unsafe { launch.launch(blocks(1, 1024)) }
}

/// Mean squared error over `n` outputs in one block: `dy = 2 (y - t) / n` and
/// `loss[0] = mean((y - t)²)` (a data-parallel step averages it over the ranks with the
/// gradients, then [`finish_step`] records it).
pub fn mse_loss_into(
    rt: &Runtime,
    y: &impl DevicePtr<f32>,
    t: &impl DevicePtr<f32>,
    dy: &mut impl DevicePtrMut<f32>,
    loss: &mut impl DevicePtrMut<f32>,
    n: usize,
) -> Result<(), GraphError> {
    let launch = Launch::new(rt, TRAIN, "mse_loss_into")?
        .read("y", y, n)
        .read("t", t, n)
        .write("dy", dy, n)
        .write("loss", loss, 1)
        .int(n);
    // SAFETY: one block of 1024 threads (a multiple of 32, as the kernel's block sum needs)
    // reads n of `y` and `t`, writes n of `dy` and one float of `loss`.
    unsafe { launch.launch(blocks(1, 1024)) }
}

/// Partial sums of squares of the `n` values of `g`, one per block of a fixed grid of
/// `partials.len()` blocks (a fixed split, so the sum is always the same).
pub fn sumsq_partials(
    rt: &Runtime,
    g: &impl DevicePtr<f32>,
    partials: &mut impl DevicePtrMut<f32>,
    n: usize,
) -> Result<(), GraphError> {
    let grid = partials.len();
    assert!(grid > 0, "sumsq_partials: no partials to write");
    let launch = Launch::new(rt, TRAIN, "sumsq_partials")?
        .read("g", g, n)
        .write("partials", partials, grid)
        .int(n);
    // SAFETY: `grid` blocks read the n values of `g` (grid-stride) and write one partial
    // each into `partials`, which holds `grid`.
    unsafe { launch.launch(blocks(grid, THREADS)) }
}

/// Clips the gradient `g` to the global norm `opt.max_norm` (the norm is the sum of
/// `partials`, added on the device: no host round trip) and applies one AdamW step to the
/// `n` parameters `p` with moments `m` and `v`, at step `*step + 1`.
#[allow(clippy::too_many_arguments)] // the kernel's parameters
pub fn clip_adamw(
    rt: &Runtime,
    p: &mut impl DevicePtrMut<f32>,
    g: &impl DevicePtr<f32>,
    m: &mut impl DevicePtrMut<f32>,
    v: &mut impl DevicePtrMut<f32>,
    partials: &impl DevicePtr<f32>,
    step: &impl DevicePtr<i32>,
    opt: &AdamW,
    n: usize,
) -> Result<(), GraphError> {
    let nparts = partials.len();
    let launch = Launch::new(rt, TRAIN, "clip_adamw")?
        .write("p", p, n)
        .read("g", g, n)
        .write("m", m, n)
        .write("v", v, n)
        .read("partials", partials, nparts)
        .int(nparts)
        .read("step", step, 1)
        .float(opt.lr)
        .float(opt.beta1)
        .float(opt.beta2)
        .float(opt.eps)
        .float(opt.weight_decay)
        .float(opt.max_norm)
        .int(n);
    let grid = n.div_ceil(THREADS as usize).min(256);
    // SAFETY: a grid-stride loop over the n elements of `p`, `g`, `m` and `v`; thread 0 of
    // each block reads the `nparts` partials, and each block the step counter.
    unsafe { launch.launch(blocks(grid, THREADS)) }
}

/// `*step += 1` on the device: the last kernel of a step, after every kernel that read it.
pub fn step_increment(rt: &Runtime, step: &mut impl DevicePtrMut<i32>) -> Result<(), GraphError> {
    let launch = Launch::new(rt, TRAIN, "step_increment")?.write("step", step, 1);
    // SAFETY: one thread of the first block writes the one int of `step`.
    unsafe { launch.launch(blocks(1, 32)) }
}

/// The last kernel of a step whose loss is known only at its end (after an all-reduce):
/// `losses[*step] = loss[0]` while `*step < losses.len()`, then `*step += 1`.
pub fn finish_step(
    rt: &Runtime,
    losses: &mut impl DevicePtrMut<f32>,
    loss: &impl DevicePtr<f32>,
    step: &mut impl DevicePtrMut<i32>,
) -> Result<(), GraphError> {
    let capacity = losses.len();
    let launch = Launch::new(rt, TRAIN, "finish_step")?
        .write("losses", losses, capacity)
        .read("loss", loss, 1)
        .write("step", step, 1)
        .int(capacity);
    // SAFETY: one thread reads the one float of `loss`, writes losses[*step] only while
    // *step < capacity, the length of `losses`, and writes the one int of `step`.
    unsafe { launch.launch(blocks(1, 32)) }
}
