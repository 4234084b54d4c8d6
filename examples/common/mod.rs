//! Shared by the multi-GPU examples (`10-tensor-parallel-mlp`, `11-data-parallel-train`):
//! their CUDA kernels, a row-major cuBLAS product, timing, Markdown tables, JSON lines and
//! flags. Each example uses part of it.
#![allow(dead_code)]

pub mod train;

use std::fmt::Write as _;
use std::time::Instant;

use graph_runtime::cudarc::cublas::sys::cublasOperation_t;
use graph_runtime::cudarc::cublas::{Gemm, GemmConfig};
use graph_runtime::cudarc::driver::sys::CUevent_flags;
use graph_runtime::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use graph_runtime::{GraphError, Runtime};

/// The kernels of both examples (NVRTC, compiled once per process by the runtime).
pub const KERNELS: &str = r#"
#define GELU_K0 0.7978845608028654f
#define GELU_K1 0.044715f

__device__ __forceinline__ float gelu_tanh(float v) {
    float u = GELU_K0 * (v + GELU_K1 * v * v * v);
    return 0.5f * v * (1.0f + tanhf(u));
}

__device__ __forceinline__ float gelu_tanh_grad(float v) {
    float u = GELU_K0 * (v + GELU_K1 * v * v * v);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * v * v);
}

// A sum over the block in a fixed order (blockDim a multiple of 32, at most 1024); every
// thread gets it.
__device__ float block_sum(float v) {
    __shared__ float warp_sums[32];
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += warp_sums[w];
    return total;
}

// out[r, c] = scale * u(seed, (row0 + r) * full_cols + col0 + c), u uniform in [-1, 1): the
// entries of a [*, full_cols] matrix by position, so a rank's block of rows or columns holds
// exactly the numbers of the same block of the whole matrix.
extern "C" __global__ void init_uniform(float *out, int rows, int cols, int row0, int col0,
                                        int full_cols, unsigned int seed, float scale) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    long long r = i / cols, c = i % cols;
    unsigned long long z = (unsigned long long)((row0 + r) * (long long)full_cols + col0 + c);
    z += 0x9e3779b97f4a7c15ull * ((unsigned long long)seed + 1ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z = z ^ (z >> 31);
    float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    out[i] = scale * (2.0f * u - 1.0f);
}

// y[r, c] = gelu(z[r, c] + b[c]).
extern "C" __global__ void bias_gelu(const float *z, const float *b, float *y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] = gelu_tanh(z[i] + b[i % cols]);
}

// out[r, c] = res[r, c] + (y[r, c] + b[c]): a row-parallel layer's bias after the all-reduce,
// and the residual connection.
extern "C" __global__ void bias_residual(const float *y, const float *b, const float *res,
                                         float *out, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) out[i] = res[i] + (y[i] + b[i % cols]);
}

// z[r, c] = x[r, c] + b[c]; y = gelu(z); z is kept for the backward pass.
extern "C" __global__ void bias_gelu_fwd(const float *x, const float *b, float *z, float *y,
                                         int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        float v = x[i] + b[i % cols];
        z[i] = v;
        y[i] = gelu_tanh(v);
    }
}

// y[r, c] = x[r, c] + b[c].
extern "C" __global__ void bias_add(const float *x, const float *b, float *y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] = x[i] + b[i % cols];
}

// dz = dy * gelu'(z).
extern "C" __global__ void gelu_bwd(const float *dy, const float *z, float *dz, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dz[i] = dy[i] * gelu_tanh_grad(z[i]);
}

// db[c] = sum over the rows of dz[r, c], in row order.
extern "C" __global__ void col_sum(const float *dz, float *db, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float s = 0.0f;
        for (int r = 0; r < rows; ++r) s += dz[r * cols + c];
        db[c] = s;
    }
}

// Rows [row0, row0 + rows) of mini-batch (*step % batches) of a data set of `batches`
// mini-batches of `global_rows` rows: inputs of `in_dim`, targets of `out_dim` values.
extern "C" __global__ void select_rows(const float *xs, const float *ts, const int *step,
                                       float *x, float *t, int batches, int global_rows,
                                       int row0, int rows, int in_dim, int out_dim) {
    long long first = (long long)(*step % batches) * global_rows + row0;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * in_dim) x[i] = xs[first * in_dim + i];
    if (i < rows * out_dim) t[i] = ts[first * out_dim + i];
}

// One block: dy = 2 (y - t) / n and *loss = mean((y - t)^2).
extern "C" __global__ void mse_loss(const float *y, const float *t, float *dy, float *loss, int n) {
    float acc = 0.0f;
    float inv_n = 1.0f / (float)n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float d = y[i] - t[i];
        dy[i] = 2.0f * d * inv_n;
        acc += d * d;
    }
    float total = block_sum(acc);
    if (threadIdx.x == 0) *loss = total * inv_n;
}

// Sum of squares of g, one partial per block of a fixed grid (a fixed split: a fixed result).
extern "C" __global__ void sumsq_partials(const float *g, float *partials, int n) {
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        acc += g[i] * g[i];
    float total = block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Clip to a global norm of max_norm (the partials summed in order by every block, no host
// round trip) and one AdamW step at t = *step + 1: decoupled weight decay, then Adam.
extern "C" __global__ void clip_adamw(float *p, const float *g, float *m, float *v,
                                      const float *partials, int nparts, const int *step,
                                      float lr, float beta1, float beta2, float eps, float wd,
                                      float max_norm, int n) {
    __shared__ float s_coef;
    if (threadIdx.x == 0) {
        float sq = 0.0f;
        for (int k = 0; k < nparts; ++k) sq += partials[k];
        s_coef = fminf(max_norm / (sqrtf(sq) + 1e-6f), 1.0f);
    }
    __syncthreads();
    float coef = s_coef;
    float t = (float)(*step + 1);
    float bc1 = 1.0f - powf(beta1, t);
    float bc2 = 1.0f - powf(beta2, t);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float gi = g[i] * coef;
        float pi = p[i] * (1.0f - lr * wd);
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

// The last kernel of a step: losses[*step] = *loss (while it fits), then the counter moves on.
extern "C" __global__ void finish_step(float *losses, const float *loss, int *step, int capacity) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        int s = *step;
        if (s >= 0 && s < capacity) losses[s] = *loss;
        *step = s + 1;
    }
}
"#;

/// A launch of `n` threads in blocks of 256.
pub fn elems(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// A launch of `grid` blocks of `threads`.
pub fn blocks(grid: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// An `i32` kernel argument.
pub fn int(v: usize) -> i32 {
    i32::try_from(v).expect("a size beyond i32 for a kernel argument")
}

/// Fills `out` (a `[rows, cols]` block at `(row0, col0)` of a matrix with `full_cols`
/// columns) with `scale · u`, `u` uniform in [-1, 1), by position (see `init_uniform`).
#[allow(clippy::too_many_arguments)]
pub fn init_uniform(
    rt: &Runtime,
    out: &mut CudaSlice<f32>,
    rows: usize,
    cols: usize,
    (row0, col0): (usize, usize),
    full_cols: usize,
    seed: u32,
    scale: f32,
) -> Result<(), GraphError> {
    assert!(out.len() >= rows * cols, "init_uniform: buffer too short");
    let f = rt.function(KERNELS, "init_uniform")?;
    let (r, c, r0, c0, fc) = (int(rows), int(cols), int(row0), int(col0), int(full_cols));
    // SAFETY: writes rows·cols floats of `out`, which holds at least that (checked above).
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(out)
            .arg(&r)
            .arg(&c)
            .arg(&r0)
            .arg(&c0)
            .arg(&fc)
            .arg(&seed)
            .arg(&scale)
            .launch(elems(rows * cols))?;
    }
    Ok(())
}

/// The shape of a row-major product `C[m, n] = op(A)[m, k] · op(B)[k, n]`; `ta`/`tb`: the
/// operand is stored transposed (`[k, m]`, `[n, k]`).
#[derive(Debug, Clone, Copy)]
pub struct Mm {
    /// Rows of `C`.
    pub m: usize,
    /// Columns of `C`.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
    /// `A` stored `[k, m]`.
    pub ta: bool,
    /// `B` stored `[n, k]`.
    pub tb: bool,
}

impl Mm {
    /// `C = A · B`.
    pub fn nn(m: usize, n: usize, k: usize) -> Self {
        Mm {
            m,
            n,
            k,
            ta: false,
            tb: false,
        }
    }

    /// `C = A · Bᵀ`: a linear layer, weights stored `[out, in]`.
    pub fn nt(m: usize, n: usize, k: usize) -> Self {
        Mm {
            tb: true,
            ..Self::nn(m, n, k)
        }
    }

    /// `C = Aᵀ · B`: a weight gradient `dW = dYᵀ · X`.
    pub fn tn(m: usize, n: usize, k: usize) -> Self {
        Mm {
            ta: true,
            ..Self::nn(m, n, k)
        }
    }
}

/// `c = op(a) · op(b)` (row-major, see [`Mm`]) with cuBLAS on the runtime's stream: the
/// column-major product `cᵀ = op(b)ᵀ · op(a)ᵀ`, so the operands swap places.
pub fn gemm<A, B, C>(rt: &Runtime, a: &A, b: &B, c: &mut C, mm: Mm) -> Result<(), GraphError>
where
    A: DevicePtr<f32>,
    B: DevicePtr<f32>,
    C: DevicePtrMut<f32>,
{
    let (m, n, k) = (mm.m, mm.n, mm.k);
    if a.len() < m * k || b.len() < k * n || c.len() < m * n {
        return Err(GraphError::User(
            format!(
                "gemm {mm:?}: buffers of {}, {}, {} elements",
                a.len(),
                b.len(),
                c.len()
            )
            .into(),
        ));
    }
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let cfg = GemmConfig {
        transa: op(mm.tb),
        transb: op(mm.ta),
        m: int(n),
        n: int(m),
        k: int(k),
        alpha: 1.0f32,
        lda: int(if mm.tb { k } else { n }),
        ldb: int(if mm.ta { m } else { k }),
        beta: 0.0f32,
        ldc: int(n),
    };
    // SAFETY: checked above: cuBLAS reads m·k of `a`, k·n of `b` and writes m·n of `c`, with
    // leading dimensions equal to the stored row lengths.
    unsafe { rt.blas().gemm(cfg, b, a, c) }?;
    Ok(())
}

/// Measurements per timing; the median is reported.
pub const REPEATS: usize = 7;

/// The median of `v`.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median over [`REPEATS`] of the host wall time per call (µs): `align` (a host barrier
/// between ranks, so they start together), then `iters` calls back to back and one
/// synchronize.
pub fn wall_us(
    s: &CudaStream,
    iters: usize,
    mut align: impl FnMut() -> Result<(), GraphError>,
    mut f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    let mut per = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        s.synchronize()?;
        align()?;
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        s.synchronize()?;
        per.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    Ok(median(per))
}

/// Median over [`REPEATS`] of the GPU time per call (µs) from CUDA events recorded on `s`
/// around `iters` calls, after `align`.
pub fn gpu_us(
    s: &CudaStream,
    iters: usize,
    mut align: impl FnMut() -> Result<(), GraphError>,
    mut f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    let mut per = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        s.synchronize()?;
        align()?;
        let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        for _ in 0..iters {
            f()?;
        }
        let end = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        per.push(start.elapsed_ms(&end)? as f64 * 1e3 / iters as f64);
    }
    Ok(median(per))
}

/// A Markdown table; a header starting with `>` is right-aligned.
pub struct Table {
    headers: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers
                .iter()
                .map(|h| h.trim_start_matches('>').to_owned())
                .collect(),
            right: headers.iter().map(|h| h.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row of one cell per column.
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.headers.len(), "one cell per column");
        self.rows.push(cells);
    }

    /// The table as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!("| {} |\n|", self.headers.join(" | "));
        for &r in &self.right {
            out.push_str(if r { "---:|" } else { "---|" });
        }
        out.push('\n');
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }
}

/// `12.3` for a time in µs.
pub fn us(v: f64) -> String {
    format!("{v:.1}")
}

/// `2.41×` for a ratio.
pub fn times(v: f64) -> String {
    format!("{v:.2}×")
}

/// A JSON value of a flat record.
pub enum J {
    /// A number.
    N(f64),
    /// A string.
    S(String),
    /// A boolean.
    B(bool),
}

/// One JSON object on one line, fields in the order given.
pub fn json_line(fields: &[(&str, J)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| {
            let v = match v {
                J::N(x) if x.is_finite() => format!("{x}"),
                J::N(_) => "null".to_owned(),
                J::S(s) => format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
                J::B(b) => b.to_string(),
            };
            format!("\"{k}\": {v}")
        })
        .collect();
    format!("{{{}}}", body.join(", "))
}

/// Command-line flags: `--json`, `--NAME VALUE`.
pub struct Cli {
    args: Vec<String>,
}

impl Cli {
    /// The process's arguments.
    pub fn from_env() -> Self {
        Cli {
            args: std::env::args().skip(1).collect(),
        }
    }

    /// Whether `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.args.iter().any(|a| *a == format!("--{name}"))
    }

    fn value(&self, name: &str) -> Option<&str> {
        let flag = format!("--{name}");
        let i = self.args.iter().position(|a| *a == flag)?;
        self.args.get(i + 1).map(String::as_str)
    }

    /// A comma-separated list of positive integers after `--name`, or `default`.
    pub fn usizes(&self, name: &str, default: &[usize]) -> Result<Vec<usize>, String> {
        let Some(v) = self.value(name) else {
            return Ok(default.to_vec());
        };
        v.split(',')
            .map(|s| match s.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "--{name} {v}: give positive integers separated by commas"
                )),
            })
            .collect()
    }

    /// A positive integer after `--name`, or `default`.
    pub fn usize(&self, name: &str, default: usize) -> Result<usize, String> {
        let list = self.usizes(name, &[default])?;
        match list.as_slice() {
            [one] => Ok(*one),
            _ => Err(format!("--{name}: give one number")),
        }
    }
}

/// The position and values of the first difference between `a` and `b` (bitwise).
pub fn first_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    if a.len() != b.len() {
        return Some((a.len().min(b.len()), f32::NAN, f32::NAN));
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
        .map(|i| (i, a[i], b[i]))
}

/// The NCCL settings this run sees, for the header of a table.
pub fn nccl_env() -> String {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "unset".to_owned());
    format!(
        "NCCL_NVLS_ENABLE={}, NCCL_GRAPH_MIXING_SUPPORT={}",
        var("NCCL_NVLS_ENABLE"),
        var("NCCL_GRAPH_MIXING_SUPPORT")
    )
}

/// Sends `tracing` output to stderr (filter with `RUST_LOG`).
pub fn init_tracing() {
    workloads::testing::init_tracing();
}
