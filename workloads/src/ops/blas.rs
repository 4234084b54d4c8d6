//! Row-major matrix products on cuBLAS, which is column-major.
//!
//! A row-major `[rows, cols]` buffer is the column-major `[cols, rows]` matrix, its
//! transpose. So the row-major product `C = op(A) · op(B)` is computed as the column-major
//! product `Cᵀ = op(B)ᵀ · op(A)ᵀ`: the operands swap places and keep their buffers.
//! [`gemm_config`] and [`gemv_config`] build the cuBLAS arguments (plain functions,
//! tested on the CPU against a model of cuBLAS's column-major semantics); [`matmul`] and
//! [`matvec`] check the buffer lengths and issue the call on the runtime's stream, so a
//! `#[cuda_graph]` body can call them.

use graph_runtime::cudarc::cublas::sys::cublasOperation_t;
use graph_runtime::cudarc::cublas::{Gemm, GemmConfig, Gemv, GemvConfig};
use graph_runtime::cudarc::driver::{DevicePtr, DevicePtrMut};
use graph_runtime::{GraphError, Runtime};

/// The shape of `C = alpha · op(A) · op(B) + beta · C`, all row-major: `op(A)` is `[m, k]`
/// (stored `[k, m]` when `trans_a`), `op(B)` is `[k, n]` (stored `[n, k]` when `trans_b`),
/// `C` is `[m, n]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatMul {
    /// Rows of `C`.
    pub m: usize,
    /// Columns of `C`.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
    /// `A` is stored transposed.
    pub trans_a: bool,
    /// `B` is stored transposed.
    pub trans_b: bool,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the previous `C` (0: overwrite, 1: accumulate).
    pub beta: f32,
}

impl MatMul {
    /// `C[m, n] = A[m, k] · B[k, n]`.
    pub fn nn(m: usize, n: usize, k: usize) -> Self {
        MatMul {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }

    /// `C[m, n] = A[m, k] · B[n, k]ᵀ`: a linear layer `y = x · Wᵀ` with `W` stored
    /// `[out, in]` like PyTorch's.
    pub fn nt(m: usize, n: usize, k: usize) -> Self {
        MatMul {
            trans_b: true,
            ..Self::nn(m, n, k)
        }
    }

    /// `C[m, n] = A[k, m]ᵀ · B[k, n]`: a weight gradient `dW = dYᵀ · X`.
    pub fn tn(m: usize, n: usize, k: usize) -> Self {
        MatMul {
            trans_a: true,
            ..Self::nn(m, n, k)
        }
    }

    /// The same product with `beta` set (1.0 adds the product to `C`).
    pub fn beta(self, beta: f32) -> Self {
        MatMul { beta, ..self }
    }

    /// Elements `A`, `B` and `C` must hold at least.
    pub fn lens(&self) -> (usize, usize, usize) {
        (self.m * self.k, self.k * self.n, self.m * self.n)
    }
}

fn op(t: bool) -> cublasOperation_t {
    if t {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

fn int(v: usize) -> i32 {
    i32::try_from(v).expect("matrix dimension exceeds i32")
}

/// The cuBLAS arguments of the row-major product `mm`. Pass `B`'s buffer as cuBLAS's `a`
/// and `A`'s as its `b`.
pub fn gemm_config(mm: MatMul) -> GemmConfig<f32> {
    GemmConfig {
        transa: op(mm.trans_b),
        transb: op(mm.trans_a),
        m: int(mm.n),
        n: int(mm.m),
        k: int(mm.k),
        alpha: mm.alpha,
        lda: int(if mm.trans_b { mm.k } else { mm.n }),
        ldb: int(if mm.trans_a { mm.m } else { mm.k }),
        beta: mm.beta,
        ldc: int(mm.n),
    }
}

/// The cuBLAS arguments of `y[out] = W[out, inp] · x[inp] + beta · y` with `W` row-major.
pub fn gemv_config(out: usize, inp: usize, beta: f32) -> GemvConfig<f32> {
    GemvConfig {
        trans: cublasOperation_t::CUBLAS_OP_T,
        m: int(inp),
        n: int(out),
        alpha: 1.0,
        lda: int(inp),
        incx: 1,
        beta,
        incy: 1,
    }
}

/// `c = alpha · op(a) · op(b) + beta · c` (row-major, see [`MatMul`]) on the runtime's
/// stream, through cuBLAS.
///
/// # Panics
/// If a buffer is shorter than the shape needs.
pub fn matmul<A, B, C>(rt: &Runtime, a: &A, b: &B, c: &mut C, mm: MatMul) -> Result<(), GraphError>
where
    A: DevicePtr<f32>,
    B: DevicePtr<f32>,
    C: DevicePtrMut<f32>,
{
    let (la, lb, lc) = mm.lens();
    assert!(
        a.len() >= la && b.len() >= lb && c.len() >= lc,
        "matmul {mm:?}: buffers of {}, {}, {} elements, need {la}, {lb}, {lc}",
        a.len(),
        b.len(),
        c.len()
    );
    // SAFETY: the assertion above checks that each buffer holds the elements the
    // configuration addresses: cuBLAS reads m·k of `a`, k·n of `b` and writes m·n of `c`,
    // with leading dimensions equal to the stored row lengths (`gemm_config`).
    unsafe { rt.blas().gemm(gemm_config(mm), b, a, c) }?;
    Ok(())
}

/// `y = w · x + beta · y` for a row-major `w: [out, inp]` on the runtime's stream.
///
/// # Panics
/// If a buffer is shorter than the shape needs.
pub fn matvec<W, X, Y>(
    rt: &Runtime,
    w: &W,
    x: &X,
    y: &mut Y,
    out: usize,
    inp: usize,
    beta: f32,
) -> Result<(), GraphError>
where
    W: DevicePtr<f32>,
    X: DevicePtr<f32>,
    Y: DevicePtrMut<f32>,
{
    assert!(
        w.len() >= out * inp && x.len() >= inp && y.len() >= out,
        "matvec [{out}, {inp}]: buffers of {}, {}, {} elements",
        w.len(),
        x.len(),
        y.len()
    );
    // SAFETY: checked above: cuBLAS reads out·inp elements of `w` (leading dimension inp),
    // inp of `x` and reads and writes out of `y`, all with unit stride.
    unsafe { rt.blas().gemv(gemv_config(out, inp, beta), w, x, y) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{random_vec, seeded_rng};

    fn is_t(o: cublasOperation_t) -> bool {
        o == cublasOperation_t::CUBLAS_OP_T
    }

    /// cuBLAS's `sgemm` on the CPU: column-major, `C = alpha op(A) op(B) + beta C`.
    fn cublas_sgemm(cfg: &GemmConfig<f32>, a: &[f32], b: &[f32], c: &mut [f32]) {
        let (m, n, k) = (cfg.m as usize, cfg.n as usize, cfg.k as usize);
        let (lda, ldb, ldc) = (cfg.lda as usize, cfg.ldb as usize, cfg.ldc as usize);
        let at = |i: usize, l: usize| {
            if is_t(cfg.transa) {
                a[l + i * lda]
            } else {
                a[i + l * lda]
            }
        };
        let bt = |l: usize, j: usize| {
            if is_t(cfg.transb) {
                b[j + l * ldb]
            } else {
                b[l + j * ldb]
            }
        };
        for j in 0..n {
            for i in 0..m {
                let dot: f32 = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
                c[i + j * ldc] = cfg.alpha * dot + cfg.beta * c[i + j * ldc];
            }
        }
    }

    /// cuBLAS's `sgemv` on the CPU: `y = alpha op(A) x + beta y`, `A` column-major m × n.
    fn cublas_sgemv(cfg: &GemvConfig<f32>, a: &[f32], x: &[f32], y: &mut [f32]) {
        let (m, n, lda) = (cfg.m as usize, cfg.n as usize, cfg.lda as usize);
        let (rows, cols) = if is_t(cfg.trans) { (n, m) } else { (m, n) };
        for (r, yr) in y.iter_mut().enumerate().take(rows) {
            let dot: f32 = (0..cols)
                .map(|c| {
                    let v = if is_t(cfg.trans) {
                        a[c + r * lda]
                    } else {
                        a[r + c * lda]
                    };
                    v * x[c]
                })
                .sum();
            *yr = cfg.alpha * dot + cfg.beta * *yr;
        }
    }

    /// Row-major reference: `C = alpha op(A) op(B) + beta C`.
    fn row_major(mm: MatMul, a: &[f32], b: &[f32], c: &mut [f32]) {
        for i in 0..mm.m {
            for j in 0..mm.n {
                let dot: f32 = (0..mm.k)
                    .map(|l| {
                        let av = if mm.trans_a {
                            a[l * mm.m + i]
                        } else {
                            a[i * mm.k + l]
                        };
                        let bv = if mm.trans_b {
                            b[j * mm.k + l]
                        } else {
                            b[l * mm.n + j]
                        };
                        av * bv
                    })
                    .sum();
                c[i * mm.n + j] = mm.alpha * dot + mm.beta * c[i * mm.n + j];
            }
        }
    }

    #[test]
    fn gemm_config_computes_the_row_major_product() {
        let mut rng = seeded_rng(11);
        for &(m, n, k) in &[(1, 1, 1), (3, 5, 7), (8, 2, 4), (1, 16, 9), (6, 1, 3)] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                for beta in [0.0, 1.0, 0.5] {
                    let mm = MatMul {
                        m,
                        n,
                        k,
                        trans_a: ta,
                        trans_b: tb,
                        alpha: 1.5,
                        beta,
                    };
                    let a = random_vec(&mut rng, m * k);
                    let b = random_vec(&mut rng, k * n);
                    let c0 = random_vec(&mut rng, m * n);
                    let mut want = c0.clone();
                    row_major(mm, &a, &b, &mut want);
                    let mut got = c0.clone();
                    // As `matmul` calls it: B's buffer first.
                    cublas_sgemm(&gemm_config(mm), &b, &a, &mut got);
                    for (g, w) in got.iter().zip(&want) {
                        assert!((g - w).abs() < 1e-5, "{mm:?}: {got:?} vs {want:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_linear_layer_config_is_the_one_the_tests_use() {
        // tests/replay_vs_eager.rs `linear_gelu`: batch 8, in 256, out 128.
        let cfg = gemm_config(MatMul::nt(8, 128, 256));
        assert_eq!(cfg.transa, cublasOperation_t::CUBLAS_OP_T);
        assert_eq!(cfg.transb, cublasOperation_t::CUBLAS_OP_N);
        assert_eq!((cfg.m, cfg.n, cfg.k), (128, 8, 256));
        assert_eq!((cfg.lda, cfg.ldb, cfg.ldc), (256, 256, 128));
    }

    #[test]
    fn gemv_config_computes_w_times_x() {
        let mut rng = seeded_rng(12);
        for &(out, inp) in &[(1, 1), (5, 3), (3, 5), (16, 64)] {
            for beta in [0.0f32, 1.0] {
                let w = random_vec(&mut rng, out * inp);
                let x = random_vec(&mut rng, inp);
                let y0 = random_vec(&mut rng, out);
                let want: Vec<f32> = (0..out)
                    .map(|r| (0..inp).map(|c| w[r * inp + c] * x[c]).sum::<f32>() + beta * y0[r])
                    .collect();
                let mut got = y0.clone();
                cublas_sgemv(&gemv_config(out, inp, beta), &w, &x, &mut got);
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() < 1e-5);
                }
            }
        }
    }

    #[test]
    fn shapes_and_lengths() {
        let mm = MatMul::tn(4, 6, 3).beta(1.0);
        assert!(mm.trans_a && !mm.trans_b);
        assert_eq!(mm.beta, 1.0);
        assert_eq!(mm.lens(), (12, 18, 24));
    }
}
