//! The launcher of the fused `linear_bias_gelu` kernel ([`crate::kernels::LINEAR`]):
//! `y = gelu(x · Wᵀ + bias)` for row-major `x [rows, k]`, `W [n_out, k]` (PyTorch's
//! `Linear.weight` layout) and `y [rows, n_out]`, launched in order or
//! [early](graph_runtime::launch).

use graph_runtime::cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use graph_runtime::{GraphError, Runtime};

use crate::kernels::LINEAR;

/// One warp per output feature and tile of 8 rows, four warps per block.
pub fn linear_config(rows: usize, n_out: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n_out.div_ceil(4) as u32, rows.div_ceil(8) as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `y = gelu(x · Wᵀ + bias)` on the runtime's stream; `early` starts each launch while the
/// kernel before it finishes (the kernel loads only `w` and `bias` before it waits, so
/// nothing still running may write those two).
///
/// # Panics
/// If a buffer is shorter than the shape needs, `k` is not a multiple of 4, or a buffer is
/// not 16-byte aligned (the kernel reads `float4`s).
#[allow(clippy::too_many_arguments)] // the kernel's parameters
pub fn linear_bias_gelu<X, W, B, Y>(
    rt: &Runtime,
    early: bool,
    x: &X,
    w: &W,
    bias: &B,
    y: &mut Y,
    rows: usize,
    n_out: usize,
    k: usize,
) -> Result<(), GraphError>
where
    X: DevicePtr<f32>,
    W: DevicePtr<f32>,
    B: DevicePtr<f32>,
    Y: DevicePtrMut<f32>,
{
    check_lens(
        "linear_bias_gelu",
        rows,
        n_out,
        k,
        [x.len(), w.len(), bias.len(), y.len()],
    );
    assert!(
        k.is_multiple_of(4),
        "linear_bias_gelu reads float4s: k = {k} must be a multiple of 4"
    );
    let f = rt.function(LINEAR, "linear_bias_gelu")?;
    let s = rt.stream();
    {
        let ((xp, _x), (wp, _w)) = (x.device_ptr(s), w.device_ptr(s));
        assert!(
            xp.is_multiple_of(16) && wp.is_multiple_of(16),
            "linear_bias_gelu reads float4s: x and w must start 16-byte aligned"
        );
    }
    let (r, n, kk) = (rows as i32, n_out as i32, k as i32);
    let cfg = linear_config(rows, n_out);
    if early {
        // SAFETY: the kernel reads rows·k floats of `x`, n_out·k of `w` and n_out of `bias`,
        // and writes rows·n_out of `y` (all checked above), as float4s where it reads x and
        // w (alignment and k asserted). Early-launch contract: before `griddepcontrol.wait`
        // it reads only `w` and `bias`, which the caller guarantees no running kernel writes.
        unsafe {
            rt.launch_early(&f)
                .buf(x)
                .buf(w)
                .buf(bias)
                .buf_mut(y)
                .arg(r)
                .arg(n)
                .arg(kk)
                .launch(cfg)?;
        }
    } else {
        // cudarc's builder takes concrete buffer types; the generic ones go as addresses.
        let ((xp, _x), (wp, _w), (bp, _b)) = (x.device_ptr(s), w.device_ptr(s), bias.device_ptr(s));
        let (yp, _y) = y.device_ptr_mut(s);
        // SAFETY: as above, launched in order.
        unsafe {
            s.launch_builder(&f)
                .arg(&xp)
                .arg(&wp)
                .arg(&bp)
                .arg(&yp)
                .arg(&r)
                .arg(&n)
                .arg(&kk)
                .launch(cfg)?;
        }
    }
    Ok(())
}

/// Asserts that buffers of `lens = [x, w, bias, y]` elements hold what a linear layer
/// `x [rows, k]`, `w [n_out, k]`, `bias [n_out]` → `y [rows, n_out]` addresses; `what` names
/// the caller in the message.
pub fn check_lens(what: &str, rows: usize, n_out: usize, k: usize, lens: [usize; 4]) {
    let need = [rows * k, n_out * k, n_out, rows * n_out];
    assert!(
        lens.iter().zip(need).all(|(&have, need)| have >= need),
        "{what} [{rows}, {k}] → [{rows}, {n_out}]: buffers of {lens:?} elements, need {need:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked_per_buffer() {
        // x [3, 8], w [5, 8], bias [5], y [3, 5].
        check_lens("t", 3, 5, 8, [24, 40, 5, 15]);
        check_lens("t", 3, 5, 8, [30, 40, 6, 15]);
        for short in 0..4 {
            let mut lens = [24, 40, 5, 15];
            lens[short] -= 1;
            let r = std::panic::catch_unwind(|| check_lens("t", 3, 5, 8, lens));
            assert!(r.is_err(), "buffer {short} one element short was accepted");
        }
    }

    #[test]
    fn the_grid_covers_every_feature_and_row() {
        let cfg = linear_config(11, 40);
        assert_eq!(cfg.grid_dim, (10, 2, 1));
        assert_eq!(cfg.block_dim, (128, 1, 1));
        let cfg = linear_config(1, 512);
        assert_eq!(cfg.grid_dim, (128, 1, 1));
        // 4 warps per block × grid.x ≥ n_out, 8 rows per block × grid.y ≥ rows.
        for (rows, n) in [(1, 1), (7, 3), (8, 4), (9, 5), (64, 512), (65, 513)] {
            let g = linear_config(rows, n).grid_dim;
            assert!(g.0 as usize * 4 >= n && (g.0 as usize - 1) * 4 < n);
            assert!(g.1 as usize * 8 >= rows && (g.1 as usize - 1) * 8 < rows);
        }
    }
}
