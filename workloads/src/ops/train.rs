//! Launchers of the training kernels ([`crate::kernels::TRAIN`]): everything in a training
//! step of an MLP that is not a GEMM, on one GPU or on one rank of a data-parallel group
//! ([`select_rows`], [`mse_loss_into`], [`finish_step`]). Row-major matrices; `rows` is the
//! batch.
//!
//! Each launcher asserts that its buffers hold what the kernel addresses, then launches on the
//! runtime's stream (capturable: no allocation, no sync). Buffers are any cudarc device
//! memory (`CudaSlice`, `CudaView`, `CudaViewMut`); the kernels get their addresses.

use graph_runtime::cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
use graph_runtime::{GraphError, Runtime};

use super::{blocks, elems, int, need, row_bias_kernel};
use crate::kernels::TRAIN;
use crate::reference::AdamW;

/// Threads per block of the grid-stride kernels (the gradient norm, the optimizer).
const THREADS: u32 = 256;

/// Copies mini-batch `*step % batches` of the data set into `x` (`x_len` values) and `t`
/// (`t_len` values); `xs` and `ts` hold `batches` of each.
#[allow(clippy::too_many_arguments)] // the kernel's parameters
pub fn select_batch<Xs, Ts, S, X, T>(
    rt: &Runtime,
    xs: &Xs,
    ts: &Ts,
    step: &S,
    x: &mut X,
    t: &mut T,
    batches: usize,
    x_len: usize,
    t_len: usize,
) -> Result<(), GraphError>
where
    Xs: DevicePtr<f32>,
    Ts: DevicePtr<f32>,
    S: DevicePtr<i32>,
    X: DevicePtrMut<f32>,
    T: DevicePtrMut<f32>,
{
    need("select_batch xs", xs.len(), batches * x_len);
    need("select_batch ts", ts.len(), batches * t_len);
    need("select_batch step", step.len(), 1);
    need("select_batch x", x.len(), x_len);
    need("select_batch t", t.len(), t_len);
    let f = rt.function(TRAIN, "select_batch")?;
    let s = rt.stream();
    let ((xsp, _a), (tsp, _b), (sp, _c)) = (xs.device_ptr(s), ts.device_ptr(s), step.device_ptr(s));
    let ((xp, _d), (tp, _e)) = (x.device_ptr_mut(s), t.device_ptr_mut(s));
    let (nb, xl, tl) = (int(batches), int(x_len), int(t_len));
    // SAFETY: the kernel copies x_len values of batch (*step % batches) of `xs` and t_len of
    // `ts`, inside the batches · x_len and batches · t_len they hold, into `x` and `t`, which
    // hold that many (all asserted above).
    unsafe {
        s.launch_builder(&f)
            .arg(&xsp)
            .arg(&tsp)
            .arg(&sp)
            .arg(&xp)
            .arg(&tp)
            .arg(&nb)
            .arg(&xl)
            .arg(&tl)
            .launch(elems(x_len.max(t_len)))?;
    }
    Ok(())
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
pub fn select_rows<Xs, Ts, S, X, T>(
    rt: &Runtime,
    xs: &Xs,
    ts: &Ts,
    step: &S,
    x: &mut X,
    t: &mut T,
    at: RankRows,
) -> Result<(), GraphError>
where
    Xs: DevicePtr<f32>,
    Ts: DevicePtr<f32>,
    S: DevicePtr<i32>,
    X: DevicePtrMut<f32>,
    T: DevicePtrMut<f32>,
{
    assert!(
        at.row0 + at.rows <= at.global_rows,
        "select_rows: rows {}..{} of a mini-batch of {}",
        at.row0,
        at.row0 + at.rows,
        at.global_rows
    );
    let all = at.batches * at.global_rows;
    need("select_rows xs", xs.len(), all * at.in_dim);
    need("select_rows ts", ts.len(), all * at.out_dim);
    need("select_rows step", step.len(), 1);
    need("select_rows x", x.len(), at.rows * at.in_dim);
    need("select_rows t", t.len(), at.rows * at.out_dim);
    let f = rt.function(TRAIN, "select_rows")?;
    let s = rt.stream();
    let ((xsp, _a), (tsp, _b), (sp, _c)) = (xs.device_ptr(s), ts.device_ptr(s), step.device_ptr(s));
    let ((xp, _d), (tp, _e)) = (x.device_ptr_mut(s), t.device_ptr_mut(s));
    let args = [
        at.batches,
        at.global_rows,
        at.row0,
        at.rows,
        at.in_dim,
        at.out_dim,
    ]
    .map(int);
    // SAFETY: the kernel copies rows · in_dim inputs and rows · out_dim targets starting at
    // row (*step % batches) · global_rows + row0, which with row0 + rows ≤ global_rows stays
    // inside the batches · global_rows rows `xs` and `ts` hold, into `x` and `t`, which hold
    // that many (all asserted above).
    unsafe {
        let mut launch = s.launch_builder(&f);
        launch.arg(&xsp).arg(&tsp).arg(&sp).arg(&xp).arg(&tp);
        for a in &args {
            launch.arg(a);
        }
        launch.launch(elems(at.rows * at.in_dim.max(at.out_dim)))?;
    }
    Ok(())
}

/// `z = x + bias` per row and `y = gelu(z)` for `[rows, cols]` matrices; `z` is kept for the
/// backward pass.
#[allow(clippy::too_many_arguments)] // the kernel's parameters
pub fn bias_gelu_fwd<X, B, Z, Y>(
    rt: &Runtime,
    x: &X,
    bias: &B,
    z: &mut Z,
    y: &mut Y,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError>
where
    X: DevicePtr<f32>,
    B: DevicePtr<f32>,
    Z: DevicePtrMut<f32>,
    Y: DevicePtrMut<f32>,
{
    let n = rows * cols;
    need("bias_gelu_fwd x", x.len(), n);
    need("bias_gelu_fwd bias", bias.len(), cols);
    need("bias_gelu_fwd z", z.len(), n);
    need("bias_gelu_fwd y", y.len(), n);
    let f = rt.function(TRAIN, "bias_gelu_fwd")?;
    let s = rt.stream();
    let ((xp, _a), (bp, _b)) = (x.device_ptr(s), bias.device_ptr(s));
    let ((zp, _c), (yp, _d)) = (z.device_ptr_mut(s), y.device_ptr_mut(s));
    let (r, c) = (int(rows), int(cols));
    // SAFETY: one thread per element reads rows · cols of `x` and cols of `bias` and writes
    // rows · cols of `z` and `y` (asserted above).
    unsafe {
        s.launch_builder(&f)
            .arg(&xp)
            .arg(&bp)
            .arg(&zp)
            .arg(&yp)
            .arg(&r)
            .arg(&c)
            .launch(elems(n))?;
    }
    Ok(())
}

/// `y = x + bias` per row for `[rows, cols]` matrices.
pub fn bias_add<X, B, Y>(
    rt: &Runtime,
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
    row_bias_kernel(rt, (TRAIN, "bias_add"), x, bias, y, rows, cols)
}

/// `dz = dy · gelu'(z)` over `n` elements.
pub fn gelu_bwd<Dy, Z, Dz>(
    rt: &Runtime,
    dy: &Dy,
    z: &Z,
    dz: &mut Dz,
    n: usize,
) -> Result<(), GraphError>
where
    Dy: DevicePtr<f32>,
    Z: DevicePtr<f32>,
    Dz: DevicePtrMut<f32>,
{
    need("gelu_bwd dy", dy.len(), n);
    need("gelu_bwd z", z.len(), n);
    need("gelu_bwd dz", dz.len(), n);
    let f = rt.function(TRAIN, "gelu_bwd")?;
    let s = rt.stream();
    let ((dyp, _a), (zp, _b), (dzp, _c)) =
        (dy.device_ptr(s), z.device_ptr(s), dz.device_ptr_mut(s));
    let ni = int(n);
    // SAFETY: one thread per element reads n of `dy` and `z` and writes n of `dz` (asserted).
    unsafe {
        s.launch_builder(&f)
            .arg(&dyp)
            .arg(&zp)
            .arg(&dzp)
            .arg(&ni)
            .launch(elems(n))?;
    }
    Ok(())
}

/// `dx = mask ? dy / keep_prob : 0` over `n` elements: the backward pass of
/// `graph_runtime::Generator::dropout`.
pub fn dropout_bwd<Dy, M, Dx>(
    rt: &Runtime,
    dy: &Dy,
    mask: &M,
    dx: &mut Dx,
    keep_prob: f32,
    n: usize,
) -> Result<(), GraphError>
where
    Dy: DevicePtr<f32>,
    M: DevicePtr<u8>,
    Dx: DevicePtrMut<f32>,
{
    need("dropout_bwd dy", dy.len(), n);
    need("dropout_bwd mask", mask.len(), n);
    need("dropout_bwd dx", dx.len(), n);
    let f = rt.function(TRAIN, "dropout_bwd")?;
    let s = rt.stream();
    let ((dyp, _a), (mp, _b), (dxp, _c)) =
        (dy.device_ptr(s), mask.device_ptr(s), dx.device_ptr_mut(s));
    let ni = int(n);
    // SAFETY: one thread per element reads n of `dy` and of the byte mask and writes n of `dx`
    // (asserted above).
    unsafe {
        s.launch_builder(&f)
            .arg(&dyp)
            .arg(&mp)
            .arg(&dxp)
            .arg(&keep_prob)
            .arg(&ni)
            .launch(elems(n))?;
    }
    Ok(())
}

/// `db[c] = Σ_r dz[r, c]` for a `[rows, cols]` matrix, rows added in order.
pub fn col_sum<Dz, Db>(
    rt: &Runtime,
    dz: &Dz,
    db: &mut Db,
    rows: usize,
    cols: usize,
) -> Result<(), GraphError>
where
    Dz: DevicePtr<f32>,
    Db: DevicePtrMut<f32>,
{
    need("col_sum dz", dz.len(), rows * cols);
    need("col_sum db", db.len(), cols);
    let f = rt.function(TRAIN, "col_sum")?;
    let s = rt.stream();
    let ((dzp, _a), (dbp, _b)) = (dz.device_ptr(s), db.device_ptr_mut(s));
    let (r, c) = (int(rows), int(cols));
    // SAFETY: one thread per column reads the rows · cols of `dz` and writes cols of `db`
    // (asserted above).
    unsafe {
        s.launch_builder(&f)
            .arg(&dzp)
            .arg(&dbp)
            .arg(&r)
            .arg(&c)
            .launch(elems(cols))?;
    }
    Ok(())
}

/// Mean squared error over `n` outputs in one block: `dy = 2 (y - t) / n`, and
/// `losses[*step] = mean((y - t)²)` while `*step < losses.len()`.
#[allow(clippy::too_many_arguments)] // the kernel's parameters
pub fn mse_loss<Y, T, Dy, L, S>(
    rt: &Runtime,
    y: &Y,
    t: &T,
    dy: &mut Dy,
    losses: &mut L,
    step: &S,
    n: usize,
) -> Result<(), GraphError>
where
    Y: DevicePtr<f32>,
    T: DevicePtr<f32>,
    Dy: DevicePtrMut<f32>,
    L: DevicePtrMut<f32>,
    S: DevicePtr<i32>,
{
    need("mse_loss y", y.len(), n);
    need("mse_loss t", t.len(), n);
    need("mse_loss dy", dy.len(), n);
    need("mse_loss step", step.len(), 1);
    let capacity = int(losses.len());
    let f = rt.function(TRAIN, "mse_loss")?;
    let s = rt.stream();
    let ((yp, _a), (tp, _b), (sp, _c)) = (y.device_ptr(s), t.device_ptr(s), step.device_ptr(s));
    let ((dyp, _d), (lp, _e)) = (dy.device_ptr_mut(s), losses.device_ptr_mut(s));
    let ni = int(n);
    // SAFETY: one block of 1024 threads (a multiple of 32, as the kernel's block sum needs)
    // reads n of `y` and `t`, writes n of `dy`, and writes losses[*step] only while
    // *step < capacity, the length of `losses` (asserted above).
    unsafe {
        s.launch_builder(&f)
            .arg(&yp)
            .arg(&tp)
            .arg(&dyp)
            .arg(&lp)
            .arg(&sp)
            .arg(&ni)
            .arg(&capacity)
            .launch(blocks(1, 1024))?;
    }
    Ok(())
}

/// Mean squared error over `n` outputs in one block: `dy = 2 (y - t) / n` and
/// `loss[0] = mean((y - t)²)` (a data-parallel step averages it over the ranks with the
/// gradients, then [`finish_step`] records it).
pub fn mse_loss_into<Y, T, Dy, L>(
    rt: &Runtime,
    y: &Y,
    t: &T,
    dy: &mut Dy,
    loss: &mut L,
    n: usize,
) -> Result<(), GraphError>
where
    Y: DevicePtr<f32>,
    T: DevicePtr<f32>,
    Dy: DevicePtrMut<f32>,
    L: DevicePtrMut<f32>,
{
    need("mse_loss_into y", y.len(), n);
    need("mse_loss_into t", t.len(), n);
    need("mse_loss_into dy", dy.len(), n);
    need("mse_loss_into loss", loss.len(), 1);
    let f = rt.function(TRAIN, "mse_loss_into")?;
    let s = rt.stream();
    let ((yp, _a), (tp, _b)) = (y.device_ptr(s), t.device_ptr(s));
    let ((dyp, _c), (lp, _d)) = (dy.device_ptr_mut(s), loss.device_ptr_mut(s));
    let ni = int(n);
    // SAFETY: one block of 1024 threads (a multiple of 32, as the kernel's block sum needs)
    // reads n of `y` and `t`, writes n of `dy` and one float of `loss` (asserted above).
    unsafe {
        s.launch_builder(&f)
            .arg(&yp)
            .arg(&tp)
            .arg(&dyp)
            .arg(&lp)
            .arg(&ni)
            .launch(blocks(1, 1024))?;
    }
    Ok(())
}

/// Partial sums of squares of the `n` values of `g`, one per block of a fixed grid of
/// `partials.len()` blocks (a fixed split, so the sum is always the same).
pub fn sumsq_partials<G, P>(
    rt: &Runtime,
    g: &G,
    partials: &mut P,
    n: usize,
) -> Result<(), GraphError>
where
    G: DevicePtr<f32>,
    P: DevicePtrMut<f32>,
{
    need("sumsq_partials g", g.len(), n);
    let grid = partials.len();
    assert!(grid > 0, "sumsq_partials: no partials to write");
    let f = rt.function(TRAIN, "sumsq_partials")?;
    let s = rt.stream();
    let ((gp, _a), (pp, _b)) = (g.device_ptr(s), partials.device_ptr_mut(s));
    let ni = int(n);
    // SAFETY: `grid` blocks read the n values of `g` (grid-stride, asserted) and write one
    // partial each into `partials`, which holds `grid`.
    unsafe {
        s.launch_builder(&f)
            .arg(&gp)
            .arg(&pp)
            .arg(&ni)
            .launch(blocks(grid, THREADS))?;
    }
    Ok(())
}

/// Clips the gradient `g` to the global norm `opt.max_norm` (the norm is the sum of
/// `partials`, added on the device: no host round trip) and applies one AdamW step to the
/// `n` parameters `p` with moments `m` and `v`, at step `*step + 1`.
#[allow(clippy::too_many_arguments)] // the kernel's parameters
pub fn clip_adamw<P, G, M, V, Pa, S>(
    rt: &Runtime,
    p: &mut P,
    g: &G,
    m: &mut M,
    v: &mut V,
    partials: &Pa,
    step: &S,
    opt: &AdamW,
    n: usize,
) -> Result<(), GraphError>
where
    P: DevicePtrMut<f32>,
    G: DevicePtr<f32>,
    M: DevicePtrMut<f32>,
    V: DevicePtrMut<f32>,
    Pa: DevicePtr<f32>,
    S: DevicePtr<i32>,
{
    for (what, len) in [
        ("p", p.len()),
        ("g", g.len()),
        ("m", m.len()),
        ("v", v.len()),
    ] {
        need(&format!("clip_adamw {what}"), len, n);
    }
    need("clip_adamw step", step.len(), 1);
    let nparts = int(partials.len());
    let f = rt.function(TRAIN, "clip_adamw")?;
    let s = rt.stream();
    let ((gp, _a), (pap, _b), (sp, _c)) =
        (g.device_ptr(s), partials.device_ptr(s), step.device_ptr(s));
    let ((pp, _d), (mp, _e), (vp, _f)) = (
        p.device_ptr_mut(s),
        m.device_ptr_mut(s),
        v.device_ptr_mut(s),
    );
    let ni = int(n);
    let grid = n.div_ceil(THREADS as usize).min(256);
    // SAFETY: a grid-stride loop over the n elements of `p`, `g`, `m` and `v` (each holds n,
    // asserted); thread 0 of each block reads the `nparts` partials, and each block the step
    // counter.
    unsafe {
        s.launch_builder(&f)
            .arg(&pp)
            .arg(&gp)
            .arg(&mp)
            .arg(&vp)
            .arg(&pap)
            .arg(&nparts)
            .arg(&sp)
            .arg(&opt.lr)
            .arg(&opt.beta1)
            .arg(&opt.beta2)
            .arg(&opt.eps)
            .arg(&opt.weight_decay)
            .arg(&opt.max_norm)
            .arg(&ni)
            .launch(blocks(grid, THREADS))?;
    }
    Ok(())
}

/// `*step += 1` on the device: the last kernel of a step, after every kernel that read it.
pub fn step_increment<S: DevicePtrMut<i32>>(rt: &Runtime, step: &mut S) -> Result<(), GraphError> {
    need("step_increment step", step.len(), 1);
    let f = rt.function(TRAIN, "step_increment")?;
    let s = rt.stream();
    let (sp, _a) = step.device_ptr_mut(s);
    // SAFETY: one thread of the first block writes the one int of `step` (asserted).
    unsafe {
        s.launch_builder(&f).arg(&sp).launch(blocks(1, 32))?;
    }
    Ok(())
}

/// The last kernel of a step whose loss is known only at its end (after an all-reduce):
/// `losses[*step] = loss[0]` while `*step < losses.len()`, then `*step += 1`.
pub fn finish_step<Ls, L, S>(
    rt: &Runtime,
    losses: &mut Ls,
    loss: &L,
    step: &mut S,
) -> Result<(), GraphError>
where
    Ls: DevicePtrMut<f32>,
    L: DevicePtr<f32>,
    S: DevicePtrMut<i32>,
{
    need("finish_step loss", loss.len(), 1);
    need("finish_step step", step.len(), 1);
    let capacity = int(losses.len());
    let f = rt.function(TRAIN, "finish_step")?;
    let s = rt.stream();
    let (lp, _a) = loss.device_ptr(s);
    let ((lsp, _b), (sp, _c)) = (losses.device_ptr_mut(s), step.device_ptr_mut(s));
    // SAFETY: one thread reads the one float of `loss`, writes losses[*step] only while
    // *step < capacity, the length of `losses`, and writes the one int of `step` (asserted).
    unsafe {
        s.launch_builder(&f)
            .arg(&lsp)
            .arg(&lp)
            .arg(&sp)
            .arg(&capacity)
            .launch(blocks(1, 32))?;
    }
    Ok(())
}
