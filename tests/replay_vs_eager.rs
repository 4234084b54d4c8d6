//! Graph replay against eager execution on fresh random inputs, several replays, inputs
//! changed between them: element-wise kernels with a temporary, cuBLAS, state read by
//! address, warmup accounting, and every kind of input source.
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use graph_runtime::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, phase, GraphError, Phase, Runtime};
use workloads::check::max_abs_diff;
use workloads::kernels::ELEMENTWISE;
use workloads::testing::{cpu_test, fresh_rng, gpu_test, random_vec};

fn grid(n: i32) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// `y = tanh(w * x + b)`, through a temporary the body allocates (a graph allocation node).
#[cuda_graph(warmup = 3)]
fn affine_tanh(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let s = rt.stream();
    let mut tmp = s.alloc_zeros::<f32>(x.len())?;
    let (mul, add, tanh) = (
        rt.function(ELEMENTWISE, "mul")?,
        rt.function(ELEMENTWISE, "add")?,
        rt.function(ELEMENTWISE, "tanh_inplace")?,
    );
    // SAFETY: every kernel reads and writes exactly `n` floats of buffers that hold `n`.
    unsafe {
        s.launch_builder(&mul)
            .arg(x)
            .arg(w)
            .arg(&mut tmp)
            .arg(&n)
            .launch(grid(n))?;
        s.launch_builder(&add)
            .arg(&tmp)
            .arg(b)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(n))?;
        s.launch_builder(&tanh)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(n))?;
    }
    Ok(())
}

#[gpu_test]
fn replay_equals_eager_on_changing_inputs(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("replay_equals_eager_on_changing_inputs");
    let n = 4099; // not a multiple of the block size
    let s = rt.stream().clone();
    let w = s.clone_htod(&random_vec(&mut rng, n))?;
    let b = s.clone_htod(&random_vec(&mut rng, n))?;
    let x0 = s.clone_htod(&random_vec(&mut rng, n))?;

    let mut graph = AffineTanhGraph::capture(&rt, &x0, &w, &b, n)?;
    assert!(
        graph.info().nodes() >= 3,
        "three kernels at least: {:?}",
        graph.info()
    );

    let mut eager_y = s.alloc_zeros::<f32>(n)?;
    for replay in 0..6 {
        let host_x = random_vec(&mut rng, n);
        let x = s.clone_htod(&host_x)?;
        // Alternate between the input sources a replay accepts.
        let out = match replay % 3 {
            0 => graph.replay(&x)?,
            1 => graph.replay(&host_x)?,
            _ => graph.replay(host_x.as_slice())?,
        };
        let got = s.clone_dtoh(out.y)?;
        affine_tanh(&rt, &x, &w, &b, &mut eager_y)?;
        let want = s.clone_dtoh(&eager_y)?;
        assert_eq!(got, want, "replay {replay} differs from eager");
        // And against the host, so that eager itself is right.
        let (hw, hb) = (s.clone_dtoh(&w)?, s.clone_dtoh(&b)?);
        let cpu: Vec<f32> = (0..n).map(|i| (hw[i] * host_x[i] + hb[i]).tanh()).collect();
        assert!(
            max_abs_diff(&got, &cpu) < 1e-5,
            "replay {replay} differs from the CPU"
        );
    }
    Ok(())
}

/// Every way a replay can get its input, mixed in one sequence: a device buffer of the
/// runtime's stream (the graph's input node is pointed at it: no copy launch), a view at an
/// unaligned offset of a larger buffer (the same, copied byte by byte), host data (copied
/// before the launch), a buffer freed right after the replay, and `launch` after writing the
/// static input in place (the node copies nothing).
#[gpu_test]
fn every_input_source_feeds_the_graph(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("every_input_source_feeds_the_graph");
    let n = 4099;
    let s = rt.stream().clone();
    let w = s.clone_htod(&random_vec(&mut rng, n))?;
    let b = s.clone_htod(&random_vec(&mut rng, n))?;
    let mut graph = AffineTanhGraph::capture(&rt, &random_vec(&mut rng, n), &w, &b, n)?;
    assert_eq!(graph.info().kinds.input_copies, 1, "{:?}", graph.info());
    let mut eager_y = s.alloc_zeros::<f32>(n)?;
    let mut check = |graph: &mut AffineTanhGraph<'_>, host_x: &[f32], what: &str| {
        let got = s.clone_dtoh(graph.outputs().y)?;
        let x = s.clone_htod(host_x)?;
        affine_tanh(&rt, &x, &w, &b, &mut eager_y)?;
        assert_eq!(got, s.clone_dtoh(&eager_y)?, "{what}");
        Ok::<(), GraphError>(())
    };
    for round in 0..3 {
        let host_x = random_vec(&mut rng, n);
        let x = s.clone_htod(&host_x)?;
        graph.replay(&x)?;
        check(
            &mut graph,
            &host_x,
            &format!("round {round}: device buffer"),
        )?;

        let host_x = random_vec(&mut rng, n);
        let mut padded = vec![0.0f32; n + 3];
        padded[1..=n].copy_from_slice(&host_x);
        let big = s.clone_htod(&padded)?;
        graph.replay(&big.slice(1..=n))?; // 4 bytes off the allocation's alignment
        check(
            &mut graph,
            &host_x,
            &format!("round {round}: unaligned view"),
        )?;

        let host_x = random_vec(&mut rng, n);
        graph.replay(&host_x)?;
        check(&mut graph, &host_x, &format!("round {round}: host data"))?;

        let host_x = random_vec(&mut rng, n);
        {
            let gone = s.clone_htod(&host_x)?;
            graph.replay(&gone)?;
        } // freed on the runtime's stream, after the graph has read it
        let reuse = s.clone_htod(&vec![9.0f32; n])?;
        check(
            &mut graph,
            &host_x,
            &format!("round {round}: source freed after replay"),
        )?;
        drop(reuse);

        let host_x = random_vec(&mut rng, n);
        s.memcpy_htod(&host_x, &mut graph.inputs_mut().x)?;
        graph.launch()?;
        check(
            &mut graph,
            &host_x,
            &format!("round {round}: written in place, launched"),
        )?;
    }
    Ok(())
}

/// `y = x * w` with mutable state: the test changes `w` between replays.
#[cuda_graph(warmup = 2)]
fn scale(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let mul = rt.function(ELEMENTWISE, "mul")?;
    // SAFETY: reads `n` floats of `x` and `w`, writes `n` of `y`; all hold `n`.
    unsafe {
        rt.stream()
            .launch_builder(&mul)
            .arg(x)
            .arg(&*w)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(n))?;
    }
    Ok(())
}

#[gpu_test]
fn state_is_read_by_address(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("state_is_read_by_address");
    let n = 1000;
    let s = rt.stream().clone();
    let mut w = s.clone_htod(&random_vec(&mut rng, n))?;
    let host_x = random_vec(&mut rng, n);
    let mut graph = ScaleGraph::capture(&rt, &host_x, &mut w, n)?;
    for round in 0..4 {
        let host_w = random_vec(&mut rng, n);
        // The graph lends its state back between replays; it reads it by address.
        s.memcpy_htod(&host_w, &mut graph.state_mut().w)?;
        let got = s.clone_dtoh(graph.replay(&host_x)?.y)?;
        let want: Vec<f32> = host_x.iter().zip(&host_w).map(|(a, b)| a * b).collect();
        assert_eq!(
            got, want,
            "round {round}: the output did not follow the new weights"
        );
    }
    drop(graph);
    // The borrow has ended: the weights are the caller's again.
    let _ = s.clone_dtoh(&w)?;
    Ok(())
}

static WARMUP_RUNS: AtomicU32 = AtomicU32::new(0);
static CAPTURE_RUNS: AtomicU32 = AtomicU32::new(0);
static EAGER_RUNS: AtomicU32 = AtomicU32::new(0);
static SEEN_STREAM: AtomicUsize = AtomicUsize::new(0);
static OTHER_STREAM: AtomicU32 = AtomicU32::new(0);
static CAPTURE_STREAM: AtomicUsize = AtomicUsize::new(0);

/// Counts its runs per phase and records the stream it is given: host effects that run only
/// in the warmup runs and the capture, which is what it counts (hence the opt-in). The
/// determinism check is off so that the capture is one run in every build (in a debug build
/// it would capture the body a second time to compare the two recordings).
#[cuda_graph(warmup = 4, host_effects_not_replayed, check_determinism = false)]
fn counted(
    stream: &Arc<CudaStream>,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    match phase() {
        Phase::Warmup { graph, run } => {
            assert_eq!(graph, "counted");
            let before = WARMUP_RUNS.fetch_add(1, Ordering::SeqCst);
            assert_eq!(run, before + 1, "warmup runs are numbered from 1, in order");
        }
        Phase::Capture { graph } => {
            assert_eq!(graph, "counted");
            CAPTURE_RUNS.fetch_add(1, Ordering::SeqCst);
            CAPTURE_STREAM.store(stream.cu_stream() as usize, Ordering::SeqCst);
        }
        Phase::Eager => {
            EAGER_RUNS.fetch_add(1, Ordering::SeqCst);
        }
    }
    let cu = stream.cu_stream() as usize;
    let warmup = matches!(phase(), Phase::Warmup { .. });
    if warmup {
        if let Err(first) = SEEN_STREAM.compare_exchange(0, cu, Ordering::SeqCst, Ordering::SeqCst)
        {
            if first != cu {
                OTHER_STREAM.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    stream.memcpy_dtod(x, y)?;
    Ok(())
}

#[gpu_test]
fn warmup_runs_exactly_n_times_on_the_runtimes_stream(rt: Runtime) -> Result<(), GraphError> {
    let x = rt.stream().clone_htod(&[1.0f32, 2.0, 3.0])?;
    let mut graph = CountedGraph::capture(&rt, &x, 3)?;
    assert_eq!(CountedGraph::WARMUP, 4);
    assert_eq!(
        WARMUP_RUNS.load(Ordering::SeqCst),
        4,
        "warmup = 4 runs the body 4 times"
    );
    assert_eq!(
        CAPTURE_RUNS.load(Ordering::SeqCst),
        1,
        "the body is captured once"
    );
    assert_eq!(
        OTHER_STREAM.load(Ordering::SeqCst),
        0,
        "every warmup run saw one stream"
    );
    let seen = SEEN_STREAM.load(Ordering::SeqCst);
    assert_eq!(
        seen,
        rt.stream().cu_stream() as usize,
        "the warmup runs on the runtime's stream"
    );
    let captured_on = CAPTURE_STREAM.load(Ordering::SeqCst);
    assert_ne!(
        captured_on, seen,
        "the capture records on the runtime's capture stream, which other threads never use"
    );
    assert!(
        seen != 0 && captured_on != 0,
        "never the legacy default stream"
    );

    for v in [4.0f32, 5.0, 6.0] {
        let out = graph.replay(&[v, v, v])?;
        assert_eq!(rt.stream().clone_dtoh(out.y)?, vec![v; 3]);
    }
    assert_eq!(
        WARMUP_RUNS.load(Ordering::SeqCst) + CAPTURE_RUNS.load(Ordering::SeqCst),
        5,
        "replays do not run the body"
    );
    assert_eq!(phase(), Phase::Eager);

    // The function is still an ordinary function (a debug build's first replay verified
    // itself against one eager run already).
    let mut y = rt.stream().alloc_zeros::<f32>(3)?;
    let before = EAGER_RUNS.load(Ordering::SeqCst);
    counted(rt.stream(), &x, &mut y)?;
    assert_eq!(EAGER_RUNS.load(Ordering::SeqCst), before + 1);
    assert_eq!(rt.stream().clone_dtoh(&y)?, vec![1.0, 2.0, 3.0]);
    Ok(())
}

/// A linear layer and GELU: `y = gelu(x · wᵀ + b)` for row-major `x: [batch, inp]`,
/// `w: [out, inp]`, `y: [batch, out]`.
#[cuda_graph(warmup = 3)]
fn linear_gelu(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] dims: (usize, usize, usize),
) -> Result<(), GraphError> {
    let (batch, inp, out) = dims;
    let mut tmp = rt.stream().alloc_zeros::<f32>(batch * out)?;
    // Column-major view: tmpᵀ [out, batch] = w [out, inp] (stored as wᵀ col-major) · xᵀ [inp, batch].
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: out as i32,
        n: batch as i32,
        k: inp as i32,
        alpha: 1.0f32,
        lda: inp as i32,
        ldb: inp as i32,
        beta: 0.0f32,
        ldc: out as i32,
    };
    // SAFETY: the dimensions match the buffers' lengths (batch·inp, out·inp, batch·out).
    unsafe { rt.blas().gemm(cfg, w, x, &mut tmp) }?;
    let f = rt.function(ELEMENTWISE, "bias_gelu")?;
    let (rows, cols) = (batch as i32, out as i32);
    // SAFETY: reads rows·cols floats of `tmp`, cols of `b`; writes rows·cols of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&tmp)
            .arg(b)
            .arg(&mut *y)
            .arg(&rows)
            .arg(&cols)
            .launch(grid(rows * cols))?;
    }
    Ok(())
}

fn gelu(v: f32) -> f32 {
    0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044715 * v * v * v)).tanh())
}

#[gpu_test]
fn cublas_gemm_inside_the_graph(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("cublas_gemm_inside_the_graph");
    let (batch, inp, out) = (8, 256, 128);
    let s = rt.stream().clone();
    let host_w = random_vec(&mut rng, out * inp);
    let host_b = random_vec(&mut rng, out);
    let (w, b) = (s.clone_htod(&host_w)?, s.clone_htod(&host_b)?);
    let x0 = random_vec(&mut rng, batch * inp);
    let dims = (batch, inp, out);
    let mut graph = LinearGeluGraph::capture(&rt, &x0, &w, &b, batch * out, dims)?;
    let mut eager_y = s.alloc_zeros::<f32>(batch * out)?;
    for replay in 0..5 {
        let host_x = random_vec(&mut rng, batch * inp);
        let x = s.clone_htod(&host_x)?;
        let got = s.clone_dtoh(graph.replay(&x)?.y)?;
        linear_gelu(&rt, &x, &w, &b, &mut eager_y, dims)?;
        assert_eq!(
            got,
            s.clone_dtoh(&eager_y)?,
            "replay {replay}: cuBLAS graph differs from eager"
        );
        let cpu: Vec<f32> = (0..batch * out)
            .map(|i| {
                let (r, c) = (i / out, i % out);
                let dot: f32 = (0..inp)
                    .map(|k| host_x[r * inp + k] * host_w[c * inp + k])
                    .sum();
                gelu(dot + host_b[c])
            })
            .collect();
        assert!(
            max_abs_diff(&got, &cpu) < 1e-3,
            "replay {replay}: differs from the CPU"
        );
    }
    Ok(())
}

#[gpu_test]
fn inputs_from_another_stream_are_ordered(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("inputs_from_another_stream_are_ordered");
    let n = 1 << 20;
    let s = rt.stream().clone();
    let w = s.clone_htod(&random_vec(&mut rng, n))?;
    let b = s.clone_htod(&random_vec(&mut rng, n))?;
    let x0 = random_vec(&mut rng, n);
    let mut graph = AffineTanhGraph::capture(&rt, &x0, &w, &b, n)?;
    let side = rt.context().new_stream()?;
    let mut eager_y = s.alloc_zeros::<f32>(n)?;
    for _ in 0..3 {
        let host_x = random_vec(&mut rng, n);
        // Written (asynchronously) on the side stream, read by the replay's copy, then freed
        // on the side stream: the copy must wait for the write and the free for the copy.
        let x = side.clone_htod(&host_x)?;
        let got = graph.replay(&x)?.y.clone();
        drop(x);
        let got = s.clone_dtoh(&got)?;
        let x = s.clone_htod(&host_x)?;
        affine_tanh(&rt, &x, &w, &b, &mut eager_y)?;
        assert_eq!(got, s.clone_dtoh(&eager_y)?);
    }
    Ok(())
}

#[gpu_test]
fn launch_replays_what_was_written_in_place(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("launch_replays_what_was_written_in_place");
    let n = 512;
    let s = rt.stream().clone();
    let mut w = s.clone_htod(&random_vec(&mut rng, n))?;
    let mut graph = ScaleGraph::capture(&rt, &vec![0.0f32; n], &mut w, n)?;
    let host_w = s.clone_dtoh(&graph.state_mut().w)?;
    for _ in 0..3 {
        let host_x = random_vec(&mut rng, n);
        s.memcpy_htod(&host_x, &mut graph.inputs_mut().x)?;
        let got = s.clone_dtoh(graph.launch()?.y)?;
        let want: Vec<f32> = host_x.iter().zip(&host_w).map(|(a, b)| a * b).collect();
        assert_eq!(got, want);
    }
    Ok(())
}

#[cpu_test]
fn graphs_are_send() {
    fn assert_send<T: Send>() {}
    assert_send::<AffineTanhGraph<'static>>();
    assert_send::<ScaleGraph<'static>>();
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
