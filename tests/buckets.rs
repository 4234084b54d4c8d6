//! Shape buckets: one graph per batch size, sharing buffers and graph memory; every batch
//! from 1 to 32 replays like eager; batches above the largest bucket are a typed error, or
//! run eagerly when the attribute asks for it.

use graph_runtime::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};
use workloads::check::max_abs_diff;
use workloads::kernels::ELEMENTWISE;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

const WIDTH: usize = 512;

/// `out = gelu(inp · wᵀ + b)` for `rows` rows of WIDTH.
fn linear_gelu(
    rt: &Runtime,
    inp: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    rows: usize,
) -> Result<(), GraphError> {
    let mut tmp = rt.stream().alloc_zeros::<f32>(rows * WIDTH)?;
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
    // SAFETY: `inp` and `tmp` hold rows·WIDTH floats, `w` WIDTH·WIDTH.
    unsafe { rt.blas().gemm(cfg, w, inp, &mut tmp) }?;
    let f = rt.function(ELEMENTWISE, "bias_gelu")?;
    let (r, c) = (rows as i32, WIDTH as i32);
    // SAFETY: reads r·c floats of `tmp` and c of `b`, writes r·c of `out`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&tmp)
            .arg(b)
            .arg(&mut *out)
            .arg(&r)
            .arg(&c)
            .launch(LaunchConfig::for_num_elems((r * c) as u32))?;
    }
    Ok(())
}

/// Two layers; the hidden activation is a temporary of the graph.
fn two_layers(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let mut h = rt.stream().alloc_zeros::<f32>(batch * WIDTH)?;
    linear_gelu(rt, x, w, b, &mut h, batch)?;
    linear_gelu(rt, &h, w, b, y, batch)
}

#[cuda_graph(warmup = 2, buckets(batch = [1, 2, 4, 8, 16, 32]))]
fn mlp(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    two_layers(rt, x, w, b, y, batch)
}

#[cuda_graph(warmup = 2, buckets(batch = [32]))]
fn mlp_largest_only(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    two_layers(rt, x, w, b, y, batch)
}

#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4], fallback = "eager"))]
fn mlp_small(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    two_layers(rt, x, w, b, y, batch)
}

struct Weights {
    w: CudaSlice<f32>,
    b: CudaSlice<f32>,
}

fn weights(rt: &Runtime, test: &str) -> Result<Weights, GraphError> {
    let mut rng = fresh_rng(test);
    let scale = 1.0 / (WIDTH as f32).sqrt();
    let w: Vec<f32> = random_vec(&mut rng, WIDTH * WIDTH)
        .iter()
        .map(|v| v * scale)
        .collect();
    Ok(Weights {
        w: rt.stream().clone_htod(&w)?,
        b: rt.stream().clone_htod(&random_vec(&mut rng, WIDTH))?,
    })
}

fn eager(rt: &Runtime, wt: &Weights, x: &[f32], batch: usize) -> Result<Vec<f32>, GraphError> {
    let x = rt.stream().clone_htod(x)?;
    let mut y = rt.stream().alloc_zeros::<f32>(batch * WIDTH)?;
    mlp(rt, &x, &wt.w, &wt.b, &mut y, batch)?;
    Ok(rt.stream().clone_dtoh(&y)?)
}

// cuBLAS may pick a different kernel for a GEMM of `b` rows than for its bucket's rows, so
// graph and eager agree to rounding, not bit for bit.
const TOLERANCE: f32 = 1e-4;

#[gpu_test]
fn every_batch_from_1_to_32_matches_eager(rt: Runtime) -> Result<(), GraphError> {
    let test = "every_batch_from_1_to_32_matches_eager";
    let wt = weights(&rt, test)?;
    let mut family = MlpBuckets::capture(&rt, WIDTH, &wt.w, &wt.b, WIDTH)?;
    assert_eq!(MlpBuckets::BUCKETS, &[1, 2, 4, 8, 16, 32]);
    assert_eq!(family.buckets().graphs().len(), 6);
    let mut rng = fresh_rng(test);
    for batch in 1..=32 {
        let x = random_vec(&mut rng, batch * WIDTH);
        let want = eager(&rt, &wt, &x, batch)?;
        let out = family.replay(&x)?;
        assert_eq!(
            out.y.len(),
            batch * WIDTH,
            "batch {batch}: only the valid rows are handed out"
        );
        let got = rt.stream().clone_dtoh(&out.y)?;
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff < TOLERANCE,
            "batch {batch}: replay differs from eager by {diff}"
        );
    }
    Ok(())
}

#[gpu_test]
fn batch_above_the_largest_bucket_is_a_typed_error(rt: Runtime) -> Result<(), GraphError> {
    let test = "batch_above_the_largest_bucket_is_a_typed_error";
    let wt = weights(&rt, test)?;
    let mut family = MlpBuckets::capture(&rt, WIDTH, &wt.w, &wt.b, WIDTH)?;
    let err = family
        .replay(&vec![0.5f32; 33 * WIDTH])
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::BatchAboveBuckets {
                graph: "mlp",
                batch: 33,
                largest: 32
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("fallback = \"eager\""), "{err}");
    let err = family
        .replay(&vec![0.5f32; WIDTH + 1])
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::InputShape {
                graph: "mlp",
                input: "x",
                ..
            }
        ),
        "{err:?}"
    );
    // Still usable.
    let x = vec![0.25f32; 5 * WIDTH];
    let got = rt.stream().clone_dtoh(&family.replay(&x)?.y)?;
    assert!(max_abs_diff(&got, &eager(&rt, &wt, &x, 5)?) < TOLERANCE);
    Ok(())
}

#[gpu_test]
fn eager_fallback_above_the_buckets_when_asked_for(rt: Runtime) -> Result<(), GraphError> {
    let test = "eager_fallback_above_the_buckets_when_asked_for";
    let wt = weights(&rt, test)?;
    let mut family = MlpSmallBuckets::capture(&rt, WIDTH, &wt.w, &wt.b, WIDTH)?;
    let mut rng = fresh_rng(test);
    for batch in [3usize, 7, 2, 12, 4, 1] {
        let x = random_vec(&mut rng, batch * WIDTH);
        let got = rt.stream().clone_dtoh(&family.replay(&x)?.y)?;
        let diff = max_abs_diff(&got, &eager(&rt, &wt, &x, batch)?);
        assert!(
            diff < TOLERANCE,
            "batch {batch} (above the buckets: {}): {diff}",
            batch > 4
        );
    }
    Ok(())
}

fn free_untrimmed(rt: &Runtime) -> Result<usize, GraphError> {
    rt.synchronize()?;
    Ok(rt.mem_info()?.0)
}

#[gpu_test]
fn six_buckets_cost_at_most_1_2_times_the_largest_alone(rt: Runtime) -> Result<(), GraphError> {
    let test = "six_buckets_cost_at_most_1_2_times_the_largest_alone";
    let wt = weights(&rt, test)?;
    let x = vec![0.1f32; 32 * WIDTH];
    // Load kernels and cuBLAS state first, so that neither measurement pays for them.
    drop(MlpLargestOnlyBuckets::capture(
        &rt, WIDTH, &wt.w, &wt.b, WIDTH,
    )?);
    rt.trim_graph_memory()?;

    let base = free_untrimmed(&rt)?;
    let mut largest = MlpLargestOnlyBuckets::capture(&rt, WIDTH, &wt.w, &wt.b, WIDTH)?;
    largest.replay(&x)?;
    let alone = base.saturating_sub(free_untrimmed(&rt)?);
    drop(largest);
    rt.trim_graph_memory()?;

    let base = free_untrimmed(&rt)?;
    let mut family = MlpBuckets::capture(&rt, WIDTH, &wt.w, &wt.b, WIDTH)?;
    for batch in [32usize, 1, 2, 4, 8, 16, 3, 17] {
        family.replay(&x[..batch * WIDTH])?;
    }
    let together = base.saturating_sub(free_untrimmed(&rt)?);
    let temps: Vec<usize> = family
        .buckets()
        .graphs()
        .iter()
        .map(|g| g.info().temp_bytes)
        .collect();
    eprintln!(
        "{test}: largest bucket alone {} KiB, six buckets {} KiB; temporaries per bucket {:?} bytes",
        alone / 1024,
        together / 1024,
        temps
    );
    assert!(alone > 0, "the largest bucket alone must take memory");
    assert!(
        together as f64 <= 1.2 * alone as f64,
        "six buckets took {together} bytes, the largest alone {alone}"
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
