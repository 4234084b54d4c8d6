//! # 26 — a family of graphs for batches that change size
//!
//! A graph has fixed shapes, and a server's batches do not. `buckets(batch = [...])` turns the
//! function into a *family*: one graph per bucket size, sharing their static buffers and
//! graph memory. A replay with `b` rows runs the smallest bucket that holds them (the rows
//! beyond `b` zero-filled) and hands out only the `b` rows that count. Here: a two-layer MLP
//! (cuBLAS GEMMs and an NVRTC kernel) served with batches of 1 to 20 rows, buckets of 1 to
//! 16 captured on first use (`lazy = 3`: at most three live, least recently used dropped), a
//! batch above 16 run eagerly (`fallback = "eager"`), every reply compared with the function
//! called eagerly on the same rows, and the family's counts printed at the end.
//!
//! Run: `cargo run --release --example 26-bucket-family`
//!
//! It uses `graph-runtime` alone (and cudarc through it): copy it into a crate of yours that
//! depends on `graph-runtime`, and it builds as it is.

use graph_runtime::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};

/// Features per row.
const WIDTH: usize = 256;

/// `y = tanh(t + b)` by rows: CUDA C compiled by NVRTC the first time it is asked for.
const BIAS_TANH: &str = r#"
extern "C" __global__ void bias_tanh(const float *t, const float *b, float *y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] = tanhf(t[i] + b[i % cols]);
}
"#;

/// `out = tanh(inp · wᵀ + b)` for `rows` rows of WIDTH features.
fn layer(
    rt: &Runtime,
    inp: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    rows: usize,
) -> Result<(), GraphError> {
    // A temporary: inside the graph it lives in the graph's memory pool.
    let mut t = rt.stream().alloc_zeros::<f32>(rows * WIDTH)?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: WIDTH as i32,
        n: rows as i32,
        k: WIDTH as i32,
        alpha: 1.0f32,
        lda: WIDTH as i32,
        ldb: WIDTH as i32,
        beta: 0.0f32,
        ldc: WIDTH as i32,
    };
    // SAFETY: `inp` and `t` hold rows·WIDTH floats, `w` WIDTH·WIDTH.
    unsafe { rt.blas().gemm(cfg, w, inp, &mut t) }?;
    let f = rt.function(BIAS_TANH, "bias_tanh")?;
    let (r, c) = (rows as i32, WIDTH as i32);
    // SAFETY: reads r·c floats of `t` and c of `b`, writes r·c of `out`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&t)
            .arg(b)
            .arg(&mut *out)
            .arg(&r)
            .arg(&c)
            .launch(LaunchConfig::for_num_elems((r * c) as u32))?;
    }
    Ok(())
}

// 1. The function. `batch` (named in `buckets(…)`) is the number of rows; `x` and `y` hold
//    `batch` rows of WIDTH. Eagerly it runs for any `batch`; the family captures it once per
//    bucket size.
#[cuda_graph(warmup = 2, buckets(batch = [1, 2, 4, 8, 16], lazy = 3, fallback = "eager"))]
fn mlp(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let mut h = rt.stream().alloc_zeros::<f32>(batch * WIDTH)?;
    layer(rt, x, w, b, &mut h, batch)?;
    layer(rt, &h, w, b, y, batch)
}

/// Numbers in [-1, 1) from a seed (xorshift), so the example needs no other crate.
fn numbers(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn main() -> Result<(), GraphError> {
    let rt = match Runtime::new(0) {
        Ok(rt) => rt,
        Err(
            e @ (GraphError::NoDriver
            | GraphError::NoDevice { .. }
            | GraphError::MissingLibrary { .. }),
        ) => {
            eprintln!("skipped 26-bucket-family: {e}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let s = rt.stream();
    let scale = 1.0 / (WIDTH as f32).sqrt();
    let w: Vec<f32> = numbers(1, WIDTH * WIDTH)
        .iter()
        .map(|v| v * scale)
        .collect();
    let w = s.clone_htod(&w)?;
    let b = s.clone_htod(&numbers(2, WIDTH))?;

    // 2. The family: inputs and outputs are given by their row width (the static buffers
    //    hold the largest bucket's rows), state by reference. With `lazy = 3` nothing is
    //    captured yet.
    let mut family = MlpBuckets::capture(&rt, WIDTH, &w, &b, WIDTH)?;
    println!("buckets {:?}, none captured yet", MlpBuckets::BUCKETS);

    // 3. Serve: each request is `rows` rows; the family picks the bucket, captures it the
    //    first time, and evicts the least recently used when a fourth would be live.
    let requests = [3, 1, 7, 16, 2, 5, 12, 1, 20, 8, 3, 9, 4, 17, 6, 2];
    let mut worst = 0f32;
    for (i, &rows) in requests.iter().enumerate() {
        let x = numbers(100 + i as u64, rows * WIDTH);
        let got = s.clone_dtoh(&family.replay(&x)?.y)?;
        // The same rows through the function, eagerly.
        let x_dev = s.clone_htod(&x)?;
        let mut y = s.alloc_zeros::<f32>(rows * WIDTH)?;
        mlp(&rt, &x_dev, &w, &b, &mut y, rows)?;
        let want = s.clone_dtoh(&y)?;
        assert_eq!(
            got.len(),
            rows * WIDTH,
            "only the valid rows are handed out"
        );
        // cuBLAS may pick another kernel for a bucket's rows than for `rows` rows, so the
        // two agree to rounding.
        let diff = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(diff);
        println!("request {i:2}: {rows:2} rows, largest |replay - eager| {diff:.1e}");
    }
    if worst > 1e-4 {
        return Err(GraphError::User(
            format!("a reply differs from eager by {worst}").into(),
        ));
    }

    // 4. What the family did, per bucket: replays, captures, evictions, padded rows; and the
    //    batches above the largest bucket that ran eagerly.
    println!("\n{}", family.buckets().stats());
    Ok(())
}
