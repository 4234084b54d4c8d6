//! Eager islands (`rt.eager(|| …)` in a `#[cuda_graph]` body) against eager execution: a
//! data-dependent compaction read on the host between two segments, a host-side sampler with
//! `#[island]` state, an island that fails on a replay, islands in a loop (the last segment
//! empty), the segments' report, and `verify` catching a segment that reads what an island
//! wrote before the island writes it.
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead.

use std::sync::atomic::{AtomicU32, Ordering};

use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime, Tolerance};
use workloads::testing::{fresh_rng, gpu_test, random_vec};

const K: &str = r#"
extern "C" __global__ void affine(const float *x, float a, float b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
extern "C" __global__ void tanh_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(y[i]);
}
extern "C" __global__ void gather(const float *table, const int *idx, float *y, int dim) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < dim) y[i] = table[idx[0] * dim + i];
}
"#;

fn grid(n: i32) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// `y = a · x + b` over the `x.len()` floats of `x`, on the runtime's stream.
fn affine(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: f32,
    b: f32,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    assert!(y.len() >= x.len(), "affine: y is shorter than x");
    let n = x.len() as i32;
    let f = rt.function(K, "affine")?;
    // SAFETY: `affine` reads `n` floats of `x` and writes `n` of `y`, which hold at least `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&a)
            .arg(&b)
            .arg(y)
            .arg(&n)
            .launch(grid(n))?;
    }
    Ok(())
}

/// Segment 1 scales `x`; the island reads the result on the host, keeps the positive values
/// (a count known only there) and writes them, zero-padded, with their count; segment 2 takes
/// `tanh` of what the island wrote.
#[cuda_graph(warmup = 2)]
fn compact_then_tanh(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    scaled: &mut CudaSlice<f32>,
    kept: &mut CudaSlice<f32>,
    count: &mut CudaSlice<i32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let s = rt.stream();
    affine(rt, x, 2.0, -0.5, scaled)?;
    rt.eager(|| {
        let s = rt.stream();
        let host = s.clone_dtoh(&scaled)?;
        let mut positive: Vec<f32> = host.into_iter().filter(|v| *v > 0.0).collect();
        let found = positive.len() as i32;
        positive.resize(kept.len(), 0.0);
        s.memcpy_htod(&positive, &mut kept)?;
        s.memcpy_htod(&[found], &mut count)?;
        Ok(())
    })?;
    let tanh = rt.function(K, "tanh_inplace")?;
    // SAFETY: `tanh_inplace` touches `n` floats of `kept`, which holds `n`.
    unsafe {
        s.launch_builder(&tanh)
            .arg(&mut *kept)
            .arg(&n)
            .launch(grid(n))?;
    }
    Ok(())
}

#[gpu_test]
fn a_host_read_and_a_data_dependent_shape_between_segments(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_host_read_and_a_data_dependent_shape_between_segments");
    let n = 3001;
    let s = rt.stream().clone();
    let mut graph = CompactThenTanhGraph::capture(&rt, &random_vec(&mut rng, n), n, n, 1)?;
    assert_eq!(graph.islands().len(), 1);
    assert_eq!(graph.segments().count(), 2);
    let (mut scaled, mut kept, mut count) = (
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<i32>(1)?,
    );
    let mut counts = Vec::new();
    for replay in 0..6 {
        let host_x = random_vec(&mut rng, n);
        let out = graph.replay(&host_x)?;
        let (got_kept, got_count) = (s.clone_dtoh(out.kept)?, s.clone_dtoh(out.count)?);
        let x = s.clone_htod(&host_x)?;
        compact_then_tanh(&rt, &x, &mut scaled, &mut kept, &mut count)?;
        assert_eq!(
            got_kept,
            s.clone_dtoh(&kept)?,
            "replay {replay}: kept values"
        );
        assert_eq!(got_count, s.clone_dtoh(&count)?, "replay {replay}: count");
        // And against the host: the positive values of 2x - 0.5, in order, through tanh.
        let want: Vec<f32> = host_x
            .iter()
            .map(|v| 2.0 * v - 0.5)
            .filter(|v| *v > 0.0)
            .collect();
        assert_eq!(got_count[0] as usize, want.len(), "replay {replay}");
        for (k, w) in want.iter().enumerate() {
            assert!(
                (got_kept[k] - w.tanh()).abs() < 1e-5,
                "replay {replay}, {k}"
            );
        }
        counts.push(got_count[0]);
    }
    // The inputs changed the shape the island saw.
    counts.dedup();
    assert!(counts.len() > 1, "counts did not change: {counts:?}");
    let x = s.clone_htod(&random_vec(&mut rng, n))?;
    graph
        .verify(&x, Tolerance::BITWISE)?
        .into_result()
        .map_err(|e| GraphError::User(e.to_string().into()))?;
    let shown = graph.to_string();
    assert!(shown.contains("island 1 at"), "{shown}");
    assert!(shown.contains("segment 2 of 2"), "{shown}");
    Ok(())
}

/// A host random generator kept between replays as `#[island]` state.
#[derive(Clone, Debug, PartialEq)]
struct HostRng(u64);

impl HostRng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Top-p sampling on the host: the smallest set of most likely tokens whose probability
/// reaches `p`, then one of them drawn with `rng`.
fn top_p(logits: &[f32], p: f32, rng: &mut HostRng) -> i32 {
    let max = logits.iter().cloned().fold(f32::MIN, f32::max);
    let mut probs: Vec<(usize, f32)> = logits.iter().map(|l| (l - max).exp()).enumerate().collect();
    let total: f32 = probs.iter().map(|(_, q)| q).sum();
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kept = Vec::new();
    let mut mass = 0.0;
    for (i, q) in probs {
        kept.push((i, q));
        mass += q / total;
        if mass >= p {
            break;
        }
    }
    let sum: f32 = kept.iter().map(|(_, q)| q).sum();
    let mut u = rng.next_f32() * sum;
    for (i, q) in &kept {
        if u < *q {
            return *i as i32;
        }
        u -= q;
    }
    kept.last().map_or(0, |(i, _)| *i as i32)
}

/// A graphed step with a host-side sampler between two segments: segment 1 turns the
/// logits into scores, the island draws a token from them with top-p on the host, segment 2
/// gathers that token's embedding row.
#[cuda_graph(warmup = 2)]
#[allow(clippy::too_many_arguments)]
fn sample_step(
    rt: &Runtime,
    logits: &CudaSlice<f32>,
    #[state] table: &CudaSlice<f32>,
    #[island] rng: &mut HostRng,
    #[constant] p: f32,
    scores: &mut CudaSlice<f32>,
    token: &mut CudaSlice<i32>,
    row: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let dim = row.len() as i32;
    let s = rt.stream();
    affine(rt, logits, 4.0, 0.0, scores)?;
    rt.eager(|| {
        let host = rt.stream().clone_dtoh(&scores)?;
        let t = top_p(&host, p, rng);
        rt.stream().memcpy_htod(&[t], &mut token)?;
        Ok(())
    })?;
    let gather = rt.function(K, "gather")?;
    // SAFETY: `gather` reads row `token[0]` (< vocab) of the `vocab x dim` table and writes
    // `dim` floats of `row`, which holds `dim`.
    unsafe {
        s.launch_builder(&gather)
            .arg(table)
            .arg(&*token)
            .arg(&mut *row)
            .arg(&dim)
            .launch(grid(dim))?;
    }
    Ok(())
}

#[gpu_test]
fn a_host_sampler_with_island_state_matches_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_host_sampler_with_island_state_matches_eager");
    let (vocab, dim) = (257, 64);
    let s = rt.stream().clone();
    let table = s.clone_htod(&random_vec(&mut rng, vocab * dim))?;
    let logits0 = random_vec(&mut rng, vocab);
    let mut graph_rng = HostRng(0x9e37_79b9_7f4a_7c15);
    let mut eager_rng = graph_rng.clone();
    let mut graph =
        SampleStepGraph::capture(&rt, &logits0, &table, &mut graph_rng, 0.9, vocab, 1, dim)?;
    // The warmup's draws were undone: the graph starts where the eager program does.
    assert_eq!(*graph.state_mut().rng, eager_rng);
    let (mut scores, mut token, mut row) = (
        s.alloc_zeros::<f32>(vocab)?,
        s.alloc_zeros::<i32>(1)?,
        s.alloc_zeros::<f32>(dim)?,
    );
    let mut tokens = Vec::new();
    for step in 0..8 {
        let host_logits = random_vec(&mut rng, vocab);
        let out = graph.replay(&host_logits)?;
        let (got_token, got_row) = (s.clone_dtoh(out.token)?, s.clone_dtoh(out.row)?);
        let l = s.clone_htod(&host_logits)?;
        sample_step(
            &rt,
            &l,
            &table,
            &mut eager_rng,
            0.9,
            &mut scores,
            &mut token,
            &mut row,
        )?;
        assert_eq!(got_token, s.clone_dtoh(&token)?, "step {step}: token");
        assert_eq!(got_row, s.clone_dtoh(&row)?, "step {step}: row");
        tokens.push(got_token[0]);
    }
    assert_eq!(
        *graph.state_mut().rng,
        eager_rng,
        "both drew the same numbers"
    );
    tokens.dedup();
    assert!(tokens.len() > 1, "the sampler always drew {tokens:?}");
    // `verify` undoes what its eager run did to the island state before the replay.
    let before = graph.state_mut().rng.clone();
    let l = s.clone_htod(&random_vec(&mut rng, vocab))?;
    graph
        .verify(&l, Tolerance::BITWISE)?
        .into_result()
        .map_err(|e| GraphError::User(e.to_string().into()))?;
    let mut once = before.clone();
    once.next_f32();
    assert_eq!(*graph.state_mut().rng, once, "one draw: the replay's");
    Ok(())
}

/// An island that fails when its state says so.
#[cuda_graph(warmup = 1)]
fn may_fail(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[island] fail: &mut bool,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    affine(rt, x, 1.0, 1.0, y)?;
    rt.eager(|| {
        if *fail {
            return Err(GraphError::User("the island was told to fail".into()));
        }
        Ok(())
    })?;
    let tanh = rt.function(K, "tanh_inplace")?;
    // SAFETY: `tanh_inplace` touches `n` floats of `y`, which holds `n`.
    unsafe {
        rt.stream()
            .launch_builder(&tanh)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(n))?;
    }
    Ok(())
}

#[gpu_test]
fn an_island_that_fails_names_itself_and_the_graph_goes_on(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("an_island_that_fails_names_itself_and_the_graph_goes_on");
    let n = 1000;
    let s = rt.stream().clone();
    let mut graph = MayFailGraph::capture(&rt, &random_vec(&mut rng, n), false, n)?;
    *graph.state_mut().fail = true;
    let err = graph.replay(&random_vec(&mut rng, n)).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::Island {
                island: 1,
                graph: "may_fail",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("told to fail"), "{err}");
    *graph.state_mut().fail = false;
    let host_x = random_vec(&mut rng, n);
    let got = s.clone_dtoh(graph.replay(&host_x)?.y)?;
    let want: Vec<f32> = host_x.iter().map(|v| (v + 1.0).tanh()).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5);
    }
    Ok(())
}

/// Islands in a loop: each turn takes `tanh` of `y` on the device, then the island adds the turn's
/// number on the host side (a read, a change, a write back). The last segment records
/// nothing; the capture is checked twice, segment by segment (`check_determinism`).
#[cuda_graph(warmup = 1, check_determinism)]
fn looped(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let s = rt.stream();
    s.memcpy_dtod(x, &mut *y)?;
    for turn in 0..3 {
        let tanh = rt.function(K, "tanh_inplace")?;
        // SAFETY: `tanh_inplace` touches `n` floats of `y`, which holds `n`.
        unsafe {
            s.launch_builder(&tanh)
                .arg(&mut *y)
                .arg(&n)
                .launch(grid(n))?;
        }
        rt.eager(move || {
            let mut host = rt.stream().clone_dtoh(&y)?;
            for v in &mut host {
                *v += turn as f32;
            }
            rt.stream().memcpy_htod(&host, &mut y)?;
            Ok(())
        })?;
    }
    Ok(())
}

#[gpu_test]
fn islands_in_a_loop_replay_in_order(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("islands_in_a_loop_replay_in_order");
    let n = 777;
    let s = rt.stream().clone();
    let mut graph = LoopedGraph::capture(&rt, &random_vec(&mut rng, n), n)?;
    assert_eq!(graph.islands().len(), 3);
    let mut y = s.alloc_zeros::<f32>(n)?;
    for replay in 0..4 {
        let host_x = random_vec(&mut rng, n);
        let got = s.clone_dtoh(graph.replay(&host_x)?.y)?;
        looped(&rt, &s.clone_htod(&host_x)?, &mut y)?;
        assert_eq!(got, s.clone_dtoh(&y)?, "replay {replay}");
    }
    Ok(())
}

/// Two islands in a row before any work of the body (the first segment holds only the input's
/// copy, the second nothing), counting their runs in `#[island]` state.
#[cuda_graph(warmup = 2, check_determinism)]
fn islands_first(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[island] runs: &mut u32,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.eager(|| {
        *runs += 1;
        Ok(())
    })?;
    rt.eager(|| {
        *runs += 10;
        Ok(())
    })?;
    affine(rt, x, 3.0, 1.0, y)
}

#[gpu_test]
fn islands_before_any_work_and_in_a_row(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("islands_before_any_work_and_in_a_row");
    let n = 513;
    let s = rt.stream().clone();
    let mut graph = IslandsFirstGraph::capture(&rt, &random_vec(&mut rng, n), 0u32, n)?;
    assert_eq!(*graph.state_mut().runs, 0, "the warmup's runs were undone");
    assert_eq!(graph.islands().len(), 2);
    assert_eq!(
        graph.segments().count(),
        2,
        "the empty middle segment is not launched"
    );
    for replay in 1..=3u32 {
        let host_x = random_vec(&mut rng, n);
        let got = s.clone_dtoh(graph.replay(&host_x)?.y)?;
        for (g, v) in got.iter().zip(&host_x) {
            assert!((g - (3.0 * v + 1.0)).abs() < 1e-5, "replay {replay}");
        }
        assert_eq!(*graph.state_mut().runs, 11 * replay);
    }
    // `launch` with the inputs as they are runs the islands too.
    graph.launch()?;
    assert_eq!(*graph.state_mut().runs, 44);
    Ok(())
}

/// What the island of the planted bug below wrote last, for the segment after it.
static SCALE_BITS: AtomicU32 = AtomicU32::new(0);

/// A planted island bug: the island works out a scale on the host from what segment 1 wrote
/// (a value that changes with the input) and hands it to segment 2 through a host value,
/// which segment 2 passes to its kernel. Eagerly segment 2 reads the scale this call's island
/// wrote; on a replay segment 2 is not run, it is launched, and its kernel argument is the
/// scale the capture read: a segment reading what the island wrote before the island writes
/// it (the compile-time checks were opted out of for the read, as a careless user would).
#[cuda_graph(
    warmup = 1,
    verify = "never",
    check_determinism = false,
    host_effects_not_replayed
)]
fn stale_scale(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    mid: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    affine(rt, x, 1.0, 0.0, mid)?;
    rt.eager(|| {
        let first = rt.stream().clone_dtoh(&mid)?[0];
        SCALE_BITS.store(first.to_bits(), Ordering::SeqCst);
        Ok(())
    })?;
    // The bug: a host read of what the island wrote, frozen into the graph at capture.
    let scale = f32::from_bits(SCALE_BITS.load(Ordering::SeqCst));
    affine(rt, mid, scale, 0.0, y)
}

#[gpu_test]
fn verify_catches_a_segment_reading_before_the_island_wrote(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("verify_catches_a_segment_reading_before_the_island_wrote");
    let n = 4096;
    let s = rt.stream().clone();
    let x0 = s.clone_htod(&random_vec(&mut rng, n))?;
    let mut graph = StaleScaleGraph::capture(&rt, &x0, n, n)?;
    // Another input: its first value, the island's scale, differs from the capture's.
    let x = s.clone_htod(&random_vec(&mut rng, n))?;
    let report = graph.verify(&x, Tolerance::BITWISE)?;
    let err = report
        .into_result()
        .expect_err("verify did not see the segment read before the island wrote");
    assert!(matches!(err, GraphError::VerifyMismatch { .. }), "{err}");
    assert!(err.to_string().contains('y'), "{err}");
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
