//! Shape buckets: one graph per batch size, sharing buffers and graph memory; every batch
//! from 1 to 32 replays like eager; batches above the largest bucket are a typed error, or
//! run eagerly when the attribute asks for it; a `lazy` family captures each bucket on its
//! first use, keeps at most N graphs live (least recently replayed dropped first) and
//! counts, per bucket, replays, captures, evictions and padded rows. A family runs through
//! the single graph's code: a host value frozen at capture is caught by `verify = "every"`
//! and, in debug builds, by each bucket's first replay, naming the bucket; eager islands run
//! between a bucket's segments like eager.

use std::sync::atomic::{AtomicU32, Ordering};

use graph_runtime::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, BucketCounts, GraphError, Runtime, Tolerance};
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

#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4, 8], fallback = "eager", lazy = 4))]
fn mlp_lazy(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    two_layers(rt, x, w, b, y, batch)
}

#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4], lazy = 2))]
fn mlp_two_live(
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
    assert_eq!(family.buckets().graphs().count(), 6);
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

/// What a bucket's counts must be: `(bucket, replays, captures, evictions, rows padded, live)`.
fn counts(rows: &[(usize, u64, u64, u64, u64, bool)]) -> Vec<BucketCounts> {
    rows.iter()
        .map(
            |&(bucket, replays, captures, evictions, rows_padded, live)| BucketCounts {
                bucket,
                replays,
                captures,
                evictions,
                rows_padded,
                live,
            },
        )
        .collect()
}

#[gpu_test]
fn lazy_family_captures_on_first_use_and_matches_eager(rt: Runtime) -> Result<(), GraphError> {
    let test = "lazy_family_captures_on_first_use_and_matches_eager";
    let wt = weights(&rt, test)?;
    let mut family = MlpLazyBuckets::capture(&rt, WIDTH, &wt.w, &wt.b, WIDTH)?;
    assert_eq!(
        family.buckets().graphs().count(),
        0,
        "nothing captured up front"
    );
    assert_eq!(family.buckets().stats().captures(), 0);
    let mut rng = fresh_rng(test);
    // 12 is above the largest bucket: it runs eagerly and is never captured.
    for batch in [3usize, 1, 3, 8, 2, 12, 3, 7, 1] {
        let x = random_vec(&mut rng, batch * WIDTH);
        let want = eager(&rt, &wt, &x, batch)?;
        let got = rt.stream().clone_dtoh(&family.replay(&x)?.y)?;
        assert_eq!(got.len(), batch * WIDTH);
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff < TOLERANCE,
            "batch {batch}: replay differs from eager by {diff}"
        );
    }
    let stats = family.buckets().stats();
    eprintln!("{stats}");
    assert_eq!(
        stats.buckets,
        counts(&[
            (1, 2, 1, 0, 0, true),
            (2, 1, 1, 0, 0, true),
            (4, 3, 1, 0, 3, true),
            (8, 2, 1, 0, 1, true),
        ])
    );
    assert_eq!((stats.eager_runs, stats.eager_rows), (1, 12));
    assert_eq!(
        (stats.replays(), stats.captures(), stats.max_live),
        (8, 4, Some(4))
    );
    assert_eq!(family.buckets().graphs().count(), 4);
    let table = stats.to_string();
    assert!(table.contains("lazy, at most 4 live"), "{table}");
    assert!(
        table.contains(">8 |") && table.contains(" 1 eager |"),
        "{table}"
    );
    Ok(())
}

#[gpu_test]
fn lazy_family_under_a_bound_of_2_evicts_the_least_recently_replayed(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "lazy_family_under_a_bound_of_2_evicts_the_least_recently_replayed";
    let wt = weights(&rt, test)?;
    let mut family = MlpTwoLiveBuckets::capture(&rt, WIDTH, &wt.w, &wt.b, WIDTH)?;
    let mut rng = fresh_rng(test);
    // Three shapes cycling through two live graphs: every one of the first six replays
    // misses (the bucket it needs was the least recently replayed, and dropped); the last
    // one (3 rows, bucket 4) finds its graph live.
    for (step, batch) in [1usize, 2, 4, 1, 2, 4, 3].into_iter().enumerate() {
        let x = random_vec(&mut rng, batch * WIDTH);
        let want = eager(&rt, &wt, &x, batch)?;
        let got = rt.stream().clone_dtoh(&family.replay(&x)?.y)?;
        let diff = max_abs_diff(&got, &want);
        assert!(diff < TOLERANCE, "step {step}, batch {batch}: {diff}");
        let live = family.buckets().graphs().count();
        assert!(
            live <= 2,
            "step {step}: {live} graphs live under a bound of 2"
        );
    }
    let stats = family.buckets().stats();
    eprintln!("{stats}");
    // Evictions: bucket 1 at steps 2 and 5, bucket 2 at step 3, bucket 4 at step 4.
    assert_eq!(
        stats.buckets,
        counts(&[
            (1, 2, 2, 2, 0, false),
            (2, 2, 2, 1, 0, true),
            (4, 3, 2, 1, 1, true),
        ])
    );
    assert_eq!(
        (stats.eager_runs, stats.captures(), stats.max_live),
        (0, 6, Some(2))
    );
    assert!(family.buckets().graph_of(1).is_none());
    assert!(family.buckets().graph_of(4).is_some());
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

// ---- A family runs through the single graph's code: verify, its debug check, islands ----

/// Elements per row of the families below.
const ROW: usize = 256;

const ROWS_SRC: &str = r#"
extern "C" __global__ void scale(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void tanh_copy(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(x[i]);
}
extern "C" __global__ void double_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * y[i];
}
"#;

/// `y = a · x` on the device.
fn scale(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    a: f32,
) -> Result<(), GraphError> {
    let f = rt.function(ROWS_SRC, "scale")?;
    let n = x.len() as i32;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`, which holds as many.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut *y)
            .arg(&a)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    Ok(())
}

/// A host schedule the bodies below read through a helper, which the compile-time checks
/// cannot see into: its value is frozen into each bucket's graph at capture (the planted
/// bug). One per test, as the tests run at once.
static EVERY_STEP: AtomicU32 = AtomicU32::new(0);
static DEBUG_STEP: AtomicU32 = AtomicU32::new(0);

fn rate(step: &AtomicU32) -> f32 {
    if step.load(Ordering::Relaxed) < 3 {
        0.5
    } else {
        0.25
    }
}

/// `y = rate · x`, the rate read from the host: every replay verifies itself.
#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4]), verify = "every")]
fn scaled_rows(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    scale(rt, x, y, rate(&EVERY_STEP))
}

/// The same bug with the default schedule: replays 1, 2, 4, … of each bucket verify
/// themselves in debug builds, none in release builds.
#[cuda_graph(warmup = 1, buckets(batch = [2, 4]))]
fn scaled_rows_by_default(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    scale(rt, x, y, rate(&DEBUG_STEP))
}

/// The mismatch of the frozen rate: the graph, the bucket, the replay and the output named.
fn assert_frozen_rate_caught(err: &GraphError, graph: &str, bucket: usize, replay: u64) {
    let text = err.to_string();
    let GraphError::VerifyMismatch { graph: g, report } = err else {
        panic!("expected a verify mismatch naming bucket {bucket}, got: {err:?}");
    };
    assert_eq!(*g, graph, "{text}");
    assert_eq!(report.bucket, Some(bucket), "{text}");
    assert_eq!(report.replay, Some(replay), "{text}");
    assert!(
        text.contains(&format!("bucket {bucket}")) && text.contains("output `y`"),
        "{text}"
    );
}

#[gpu_test]
fn verify_every_in_a_family_catches_a_frozen_host_value_and_names_the_bucket(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "verify_every_in_a_family_catches_a_frozen_host_value_and_names_the_bucket";
    let mut rng = fresh_rng(test);
    EVERY_STEP.store(0, Ordering::Relaxed);
    let mut family = ScaledRowsBuckets::capture(&rt, ROW, ROW)?;
    // A correct replay verifies clean, in every bucket, inputs changed each time; only the
    // batch's rows are handed out.
    for (step, batch) in [3usize, 1, 4, 2, 3].into_iter().enumerate() {
        let x = random_vec(&mut rng, batch * ROW);
        let got = rt.stream().clone_dtoh(&family.replay(&x)?.y)?;
        let want: Vec<f32> = x.iter().map(|v| 0.5 * v).collect();
        assert_eq!(got, want, "step {step}, batch {batch}");
    }
    let report = family.verify(&random_vec(&mut rng, 2 * ROW), Tolerance::BITWISE)?;
    assert!(report.is_ok() && report.bucket == Some(2), "{report}");
    // The schedule moves on: the next replay of any bucket differs from eager, and says so.
    EVERY_STEP.store(3, Ordering::Relaxed);
    let err = family
        .replay(&random_vec(&mut rng, 3 * ROW))
        .map(|_| ())
        .unwrap_err();
    // Bucket 4's fourth replay (steps 0, 2 and 4 were its first three; `verify` is not
    // one of its scheduled replays).
    assert_frozen_rate_caught(&err, "scaled_rows", 4, 4);
    let err = family
        .replay(&random_vec(&mut rng, ROW))
        .map(|_| ())
        .unwrap_err();
    assert_frozen_rate_caught(&err, "scaled_rows", 1, 2);
    // The family is still usable: with the schedule back, replays verify clean again.
    EVERY_STEP.store(0, Ordering::Relaxed);
    let x = random_vec(&mut rng, 3 * ROW);
    let got = rt.stream().clone_dtoh(&family.replay(&x)?.y)?;
    assert_eq!(got, x.iter().map(|v| 0.5 * v).collect::<Vec<f32>>());
    Ok(())
}

#[gpu_test]
fn debug_builds_verify_the_first_replay_of_each_bucket_in_a_family(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "debug_builds_verify_the_first_replay_of_each_bucket_in_a_family";
    let mut rng = fresh_rng(test);
    DEBUG_STEP.store(0, Ordering::Relaxed);
    let mut family = ScaledRowsByDefaultBuckets::capture(&rt, ROW, ROW)?;
    // The rate changes before any replay: the graphs keep 0.5, eager now reads 0.25.
    DEBUG_STEP.store(3, Ordering::Relaxed);
    let x = random_vec(&mut rng, 3 * ROW);
    let replayed = family.replay(&x).map(|out| out.y.len());
    if cfg!(debug_assertions) {
        let err = replayed.unwrap_err();
        assert_frozen_rate_caught(&err, "scaled_rows_by_default", 4, 1);
        // Each bucket is a graph of its own, verified on its own first replay.
        let err = family
            .replay(&random_vec(&mut rng, ROW))
            .map(|_| ())
            .unwrap_err();
        assert_frozen_rate_caught(&err, "scaled_rows_by_default", 2, 1);
    } else {
        // Release builds verify nothing unless asked: the frozen rate goes unnoticed.
        assert_eq!(replayed?, 3 * ROW);
        let got = rt.stream().clone_dtoh(&family.outputs().y)?;
        assert_eq!(got, x.iter().map(|v| 0.5 * v).collect::<Vec<f32>>());
    }
    DEBUG_STEP.store(0, Ordering::Relaxed);
    Ok(())
}

/// `y = 2 · (tanh(x) + r)` for row `r`: `tanh` on the device, the row numbers added by an eager
/// island on the host between the two segments, the doubling on the device again.
#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4, 8], fallback = "eager"))]
fn rows_through_the_host(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    let n = x.len() as i32;
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let tanh = rt.function(ROWS_SRC, "tanh_copy")?;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`, which holds as many.
    unsafe {
        rt.stream()
            .launch_builder(&tanh)
            .arg(x)
            .arg(&mut *y)
            .arg(&n)
            .launch(cfg)?
    };
    rt.eager(|| {
        let mut host = rt.stream().clone_dtoh(&y)?;
        for (i, v) in host.iter_mut().enumerate() {
            *v += (i / ROW) as f32;
        }
        rt.stream().memcpy_htod(&host, &mut y)?;
        Ok(())
    })?;
    let double = rt.function(ROWS_SRC, "double_inplace")?;
    // SAFETY: touches `n` floats of `y`, which holds as many.
    unsafe {
        rt.stream()
            .launch_builder(&double)
            .arg(&mut *y)
            .arg(&n)
            .launch(cfg)?
    };
    Ok(())
}

#[gpu_test]
fn an_island_in_a_family_replays_like_eager_in_every_bucket(rt: Runtime) -> Result<(), GraphError> {
    let test = "an_island_in_a_family_replays_like_eager_in_every_bucket";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let mut family = RowsThroughTheHostBuckets::capture(&rt, ROW, ROW)?;
    assert_eq!(family.buckets().graphs().count(), 4);
    // Several replays of every bucket, and one above them (eager), with new inputs each time.
    for (step, batch) in [3usize, 1, 8, 5, 2, 12, 4, 7, 3, 1, 6]
        .into_iter()
        .enumerate()
    {
        let x = random_vec(&mut rng, batch * ROW);
        let x_dev = s.clone_htod(&x)?;
        let mut y = s.alloc_zeros::<f32>(batch * ROW)?;
        rows_through_the_host(&rt, &x_dev, &mut y, batch)?;
        let want = s.clone_dtoh(&y)?;
        let got = s.clone_dtoh(&family.replay(&x)?.y)?;
        assert_eq!(got.len(), batch * ROW, "step {step}: only the valid rows");
        let diff = max_abs_diff(&got, &want);
        assert!(
            diff == 0.0,
            "step {step}, batch {batch}: replay differs from eager by {diff}"
        );
    }
    let report = family.verify(&random_vec(&mut rng, 6 * ROW), Tolerance::BITWISE)?;
    assert!(report.is_ok() && report.bucket == Some(8), "{report}");
    // Each bucket's graph is two segments around the island, printed as a single graph's.
    let summary = family.to_string();
    assert!(
        summary.contains("bucket 1: segment 1 of 2")
            && summary.contains("bucket 8: segment 1 of 2")
            && summary.matches("island 1 at").count() == 4,
        "{summary}"
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
