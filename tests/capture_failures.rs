//! What goes wrong inside a captured body comes back as a typed error, and the runtime stays
//! usable: the stream is not left capturing, the next capture and eager work succeed.
//!
//! The mistakes are made inside helper functions on purpose: the macro cannot see into them,
//! so these are the cases only the GPU (or the runtime's guard) can catch.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use graph_runtime::cudarc::driver::sys::CUstreamCaptureStatus;
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::{
    cuda_graph, is_capturing, phase, ForkedStream, GraphError, Phase, Runtime, SideMut, SideRef,
};
use workloads::kernels::ELEMENTWISE;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

fn add_scalar(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    a: f32,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let f = rt.function(ELEMENTWISE, "add_scalar")?;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`; both hold `n`.
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

/// The correct graph every test captures after its failure.
#[cuda_graph(warmup = 2)]
fn plus_two(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 2.0)
}

/// Asserts the runtime is fully usable: not capturing, eager work runs, and a fresh capture
/// replays correctly on new inputs.
fn assert_runtime_usable(rt: &Runtime, test: &str) -> Result<(), GraphError> {
    assert_eq!(
        rt.stream().capture_status()?,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        "{test}: the stream was left capturing"
    );
    assert_eq!(
        phase(),
        Phase::Eager,
        "{test}: the thread still believes it is capturing"
    );
    let mut rng = fresh_rng(test);
    let host = random_vec(&mut rng, 300);
    let x = rt.stream().clone_htod(&host)?;
    let mut y = rt.stream().alloc_zeros::<f32>(300)?;
    plus_two(rt, &x, &mut y)?;
    let want: Vec<f32> = host.iter().map(|v| v + 2.0).collect();
    assert_eq!(
        rt.stream().clone_dtoh(&y)?,
        want,
        "{test}: eager work after the failure"
    );
    let mut graph = PlusTwoGraph::capture(rt, &x, 300)?;
    for _ in 0..3 {
        let host = random_vec(&mut rng, 300);
        let got = rt.stream().clone_dtoh(graph.replay(&host)?.y)?;
        let want: Vec<f32> = host.iter().map(|v| v + 2.0).collect();
        assert_eq!(got, want, "{test}: a capture after the failure");
    }
    Ok(())
}

// --- a raw cudarc synchronize inside the body: CUDA error 900 --------------------------

fn log_progress_with_raw_sync(rt: &Runtime) -> Result<(), GraphError> {
    // Fine eagerly; while capturing, CUDA refuses it with error 900.
    rt.stream().synchronize()?;
    Ok(())
}

#[cuda_graph(warmup = 1)]
fn syncs_raw(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    log_progress_with_raw_sync(rt)
}

#[gpu_test]
fn raw_sync_in_body_is_error_900_and_the_runtime_recovers(rt: Runtime) -> Result<(), GraphError> {
    let test = "raw_sync_in_body_is_error_900_and_the_runtime_recovers";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = SyncsRawGraph::capture(&rt, &x, 64).unwrap_err();
    assert!(
        matches!(err, GraphError::CaptureUnsupported { graph: "syncs_raw" }),
        "{err:?}"
    );
    assert_eq!(err.capture_code(), Some(900));
    let msg = err.to_string();
    assert!(
        msg.contains("900") && msg.contains("syncs_raw") && msg.contains("Fix:"),
        "{msg}"
    );
    assert_runtime_usable(&rt, test)
}

// --- a device-to-host copy inside the body ---------------------------------------------

fn peek(rt: &Runtime, y: &CudaSlice<f32>) -> Result<f32, GraphError> {
    Ok(rt.stream().clone_dtoh(y)?[0])
}

#[cuda_graph(warmup = 1)]
fn reads_back(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    let first = peek(rt, y)?;
    if first.is_nan() {
        return Err(GraphError::User("NaN".into()));
    }
    Ok(())
}

#[gpu_test]
fn device_to_host_copy_in_body_is_refused(rt: Runtime) -> Result<(), GraphError> {
    // CUDA itself accepts this capture: it records a memcpy node into the `Vec`'s address,
    // which every replay would write again after the `Vec` is gone. The runtime inspects
    // the graph's copies and refuses it.
    let test = "device_to_host_copy_in_body_is_refused";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = ReadsBackGraph::capture(&rt, &x, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::PageableCopyCaptured {
                graph: "reads_back",
                direction: "device-to-host"
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("after `replay()`"), "{err}");
    assert_runtime_usable(&rt, test)
}

fn upload_bias(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let host = vec![0.5f32; y.len()];
    rt.stream().memcpy_htod(&host, y)?;
    Ok(())
}

#[cuda_graph(warmup = 1)]
fn uploads(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    upload_bias(rt, y)?;
    add_scalar(rt, x, y, 1.0)
}

#[gpu_test]
fn host_to_device_copy_in_body_is_refused(rt: Runtime) -> Result<(), GraphError> {
    let test = "host_to_device_copy_in_body_is_refused";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = UploadsGraph::capture(&rt, &x, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::PageableCopyCaptured {
                graph: "uploads",
                direction: "host-to-device"
            }
        ),
        "{err:?}"
    );
    assert_runtime_usable(&rt, test)
}

// --- the runtime's own sync, two calls deep: refused before CUDA sees it ---------------

fn inner_helper(rt: &Runtime) -> Result<(), GraphError> {
    rt.synchronize() // the line the error must name
}

fn outer_helper(rt: &Runtime) -> Result<(), GraphError> {
    inner_helper(rt)
}

#[cuda_graph(warmup = 2)]
fn syncs_guarded(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    outer_helper(rt)
}

#[gpu_test]
fn runtime_sync_two_calls_deep_names_the_line(rt: Runtime) -> Result<(), GraphError> {
    let test = "runtime_sync_two_calls_deep_names_the_line";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = SyncsGuardedGraph::capture(&rt, &x, 64).unwrap_err();
    match &err {
        GraphError::SyncInCapture {
            op,
            graph,
            location,
        } => {
            assert_eq!(*op, "Runtime::synchronize");
            assert_eq!(*graph, "syncs_guarded");
            assert!(
                location.file().ends_with("capture_failures.rs"),
                "{location}"
            );
            let line = include_str!("capture_failures.rs")
                .lines()
                .position(|l| l.contains("rt.synchronize() // the line the error must name"))
                .unwrap()
                + 1;
            assert_eq!(
                location.line() as usize,
                line,
                "the error points at the helper's line"
            );
        }
        other => panic!("expected SyncInCapture, got {other:?}"),
    }
    assert_eq!(err.capture_code(), Some(900));
    assert!(err.to_string().contains("capture_failures.rs"), "{err}");
    assert_runtime_usable(&rt, test)
}

// --- a panic inside the captured body -------------------------------------------------

#[cuda_graph(warmup = 2)]
fn panics_when_captured(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    let _tmp = rt.stream().alloc_zeros::<f32>(1024)?; // dropped while unwinding
    if is_capturing() {
        panic!("a bug in the body, found during capture");
    }
    Ok(())
}

#[gpu_test]
fn panic_in_body_leaves_the_runtime_usable(rt: Runtime) -> Result<(), GraphError> {
    let test = "panic_in_body_leaves_the_runtime_usable";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let caught = catch_unwind(AssertUnwindSafe(|| {
        PanicsWhenCapturedGraph::capture(&rt, &x, 64)
    }));
    let payload = caught.expect_err("the panic propagates to the caller");
    let text = payload.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(text.contains("found during capture"), "{text}");
    assert_runtime_usable(&rt, test)
}

// --- wrong input shape at replay --------------------------------------------------------

#[gpu_test]
fn wrong_input_length_is_typed_and_launches_nothing(rt: Runtime) -> Result<(), GraphError> {
    let test = "wrong_input_length_is_typed_and_launches_nothing";
    let mut graph = PlusTwoGraph::capture(&rt, &vec![0.0f32; 100], 100)?;
    let before = rt
        .stream()
        .clone_dtoh(graph.replay(&vec![5.0f32; 100])?.y)?;
    assert_eq!(before, vec![7.0; 100]);
    for wrong in [99usize, 101, 0] {
        let err = graph
            .replay(&vec![1.0f32; wrong])
            .expect_err("wrong length must fail");
        match &err {
            GraphError::InputShape {
                graph,
                input,
                expected,
                got,
            } => {
                assert_eq!((*graph, *input), ("plus_two", "x"));
                assert_eq!((expected.as_str(), got.clone()), ("100", wrong.to_string()));
            }
            other => panic!("expected InputShape, got {other:?}"),
        }
        assert!(err.to_string().contains("nothing was launched"), "{err}");
    }
    let after = rt.stream().clone_dtoh(graph.outputs().y)?;
    assert_eq!(after, before, "a refused replay must not launch");
    assert_runtime_usable(&rt, test)
}

// --- a temporary kept past the body ------------------------------------------------------

/// Where a careless helper keeps the buffers it is given.
static KEPT: std::sync::Mutex<Vec<CudaSlice<f32>>> = std::sync::Mutex::new(Vec::new());

fn keep(tmp: CudaSlice<f32>) {
    KEPT.lock().expect("not poisoned").push(tmp);
}

#[cuda_graph(warmup = 1)]
fn keeps_a_temporary(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let mut tmp = rt.stream().alloc_zeros::<f32>(x.len())?;
    rt.stream().memcpy_dtod(x, &mut tmp)?;
    rt.stream().memcpy_dtod(&tmp, y)?;
    keep(tmp);
    Ok(())
}

#[gpu_test]
fn a_temporary_kept_past_the_body_is_refused(rt: Runtime) -> Result<(), GraphError> {
    let test = "a_temporary_kept_past_the_body_is_refused";
    let x = rt.stream().clone_htod(&[1.0f32; 256])?;
    let err = KeepsATemporaryGraph::capture(&rt, &x, 256).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::KeptTemporary {
                graph: "keeps_a_temporary",
                bytes: 1024
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("write state in place"), "{err}");
    // The warmup's buffer is the program's; those of the recordings (one, or two where debug
    // builds record the body twice) were addresses of graphs that no longer exist.
    let mut kept = std::mem::take(&mut *KEPT.lock().expect("not poisoned"));
    std::mem::forget(kept.split_off(1));
    drop(kept);
    assert_runtime_usable(&rt, test)
}

// --- work issued on another stream: an empty graph --------------------------------------

/// A stream made once, before capture (during warmup), and reused: legal to launch on while
/// the runtime's stream captures, but that work is not recorded.
fn side_stream(rt: &Runtime) -> Result<Arc<CudaStream>, GraphError> {
    static SIDE: OnceLock<Arc<CudaStream>> = OnceLock::new();
    if let Some(s) = SIDE.get() {
        return Ok(s.clone());
    }
    let s = rt.context().new_stream()?;
    Ok(SIDE.get_or_init(|| s).clone())
}

fn copy_on_the_side(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    side_stream(rt)?.memcpy_dtod(x, y)?;
    Ok(())
}

#[cuda_graph(warmup = 1)]
fn works_elsewhere(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    copy_on_the_side(rt, x, y)
}

#[gpu_test]
fn work_on_another_stream_is_an_empty_graph_error(rt: Runtime) -> Result<(), GraphError> {
    let test = "work_on_another_stream_is_an_empty_graph_error";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = WorksElsewhereGraph::capture(&rt, &x, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::EmptyGraph {
                graph: "works_elsewhere"
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("rt.stream()"), "{err}");
    assert_runtime_usable(&rt, test)
}

fn make_a_stream_and_use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let side = rt.context().new_stream()?;
    let mut scratch = side.alloc_zeros::<f32>(x.len())?;
    side.memcpy_dtod(x, &mut scratch)?;
    Ok(())
}

#[cuda_graph(warmup = 1)]
fn makes_streams(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    make_a_stream_and_use_it(rt, x)
}

#[gpu_test]
fn stream_made_and_used_inside_the_body_is_error_900(rt: Runtime) -> Result<(), GraphError> {
    let test = "stream_made_and_used_inside_the_body_is_error_900";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = MakesStreamsGraph::capture(&rt, &x, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::CaptureUnsupported {
                graph: "makes_streams"
            }
        ),
        "{err:?}"
    );
    assert_runtime_usable(&rt, test)
}

fn copy_on_the_legacy_stream(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.context().default_stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[cuda_graph(warmup = 1)]
fn uses_legacy_stream(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    copy_on_the_legacy_stream(rt, x, y)
}

#[gpu_test]
fn legacy_default_stream_in_the_body_is_refused(rt: Runtime) -> Result<(), GraphError> {
    // The capture stream is non-blocking, so the legacy stream does not implicitly wait on
    // it: the copy runs eagerly, outside the graph (the driver of CUDA 13 does this; a
    // blocking capture stream would give error 906). It must be an error, never a graph that
    // silently lacks the copy.
    let test = "legacy_default_stream_in_the_body_is_refused";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = UsesLegacyStreamGraph::capture(&rt, &x, 64).unwrap_err();
    eprintln!("{test}: {err:?}");
    assert!(
        matches!(
            err,
            GraphError::EmptyGraph {
                graph: "uses_legacy_stream"
            }
        ),
        "{err:?}"
    );
    assert_runtime_usable(&rt, test)
}

// --- captures do not nest ----------------------------------------------------------------

fn capture_inside(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    if is_capturing() {
        let _inner = PlusTwoGraph::capture(rt, x, x.len())?;
    }
    Ok(())
}

#[cuda_graph(warmup = 1)]
fn nests(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    capture_inside(rt, x)
}

#[gpu_test]
fn nested_capture_is_refused(rt: Runtime) -> Result<(), GraphError> {
    let test = "nested_capture_is_refused";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = NestsGraph::capture(&rt, &x, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::NestedCapture {
                graph: "plus_two",
                outer: "nests"
            }
        ),
        "{err:?}"
    );
    assert_runtime_usable(&rt, test)
}

// --- a failing warmup is reported as one ------------------------------------------------

#[cuda_graph(warmup = 3)]
fn fails_in_warmup(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    if let Phase::Warmup { run: 2, .. } = phase() {
        return Err(GraphError::User("the second warmup run fails".into()));
    }
    add_scalar(rt, x, y, 1.0)
}

#[gpu_test]
fn failing_warmup_names_the_run(rt: Runtime) -> Result<(), GraphError> {
    let test = "failing_warmup_names_the_run";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = FailsInWarmupGraph::capture(&rt, &x, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::Warmup {
                graph: "fails_in_warmup",
                iteration: 2,
                warmup: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("warmup run 2 of 3"), "{err}");
    assert_runtime_usable(&rt, test)
}

// --- the scoped fork/join: a parallel branch that always rejoins the capture ------------

/// `y = x + a` on a fork's side stream, on buffers borrowed until the join.
fn add_scalar_side<'f>(
    side: &ForkedStream<'f, '_>,
    rt: &Runtime,
    x: SideRef<'f, f32>,
    y: SideMut<'f, f32>,
    a: f32,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let f = rt.function(ELEMENTWISE, "add_scalar")?;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`; both hold `n`.
    unsafe {
        side.launch_builder(&f)
            .buf(x)
            .buf_mut(y)
            .arg(a)
            .arg(n)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    Ok(())
}

fn add_into(
    rt: &Runtime,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = a.len() as i32;
    let f = rt.function(ELEMENTWISE, "add")?;
    // SAFETY: reads `n` floats of `a` and `b`, writes `n` of `c`; all hold `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(a)
            .arg(b)
            .arg(&mut *c)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    Ok(())
}

/// `a = x + 1` on a side stream while `b = x + 2` runs on the runtime's stream, then
/// `c = a + b` on the runtime's stream after the join.
#[cuda_graph(warmup = 2)]
fn forked_branches(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    b: &mut CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|side| {
        add_scalar_side(side, rt, side.read(x), side.write(a), 1.0)?;
        add_scalar(rt, x, b, 2.0)
    })?;
    add_into(rt, a, b, c)
}

#[gpu_test]
fn fork_join_records_a_parallel_branch_and_replays_like_eager(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "fork_join_records_a_parallel_branch_and_replays_like_eager";
    let mut rng = fresh_rng(test);
    let n = 1000;
    let s = rt.stream().clone();
    let mut graph = ForkedBranchesGraph::capture(&rt, &random_vec(&mut rng, n), n, n, n)?;
    assert!(
        graph.info().kinds.kernels >= 3,
        "both branches and the join are in the graph: {:?}",
        graph.info()
    );
    let (mut ea, mut eb, mut ec) = (
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
        s.alloc_zeros::<f32>(n)?,
    );
    for replay in 0..4 {
        let host = random_vec(&mut rng, n);
        let out = graph.replay(&host)?;
        let (ga, gb, gc) = (
            s.clone_dtoh(out.a)?,
            s.clone_dtoh(out.b)?,
            s.clone_dtoh(out.c)?,
        );
        let x = s.clone_htod(&host)?;
        forked_branches(&rt, &x, &mut ea, &mut eb, &mut ec)?; // eager, same fork
        assert_eq!(ga, s.clone_dtoh(&ea)?, "replay {replay}: side branch");
        assert_eq!(gb, s.clone_dtoh(&eb)?, "replay {replay}: main branch");
        assert_eq!(gc, s.clone_dtoh(&ec)?, "replay {replay}: after the join");
        let want: Vec<f32> = host.iter().map(|v| (v + 1.0) + (v + 2.0)).collect();
        assert_eq!(gc, want, "replay {replay}: against the CPU");
    }
    assert_runtime_usable(&rt, test)
}

/// The side branch queues a kernel and then fails; the body handles the error. The join
/// must still happen: without it the capture would end with unjoined work (CUDA error 904).
#[cuda_graph(warmup = 1)]
fn fork_error_handled(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let side = rt.fork(|side| {
        add_scalar_side(side, rt, side.read(x), side.write(y), 3.0)?;
        Err::<(), _>(GraphError::User(
            "the side branch gives up after its kernel".into(),
        ))
    });
    if side.is_ok() {
        return Err(GraphError::User(
            "the side branch was expected to fail".into(),
        ));
    }
    Ok(())
}

#[gpu_test]
fn fork_rejoins_when_the_side_branch_fails(rt: Runtime) -> Result<(), GraphError> {
    let test = "fork_rejoins_when_the_side_branch_fails";
    let mut rng = fresh_rng(test);
    let mut graph = ForkErrorHandledGraph::capture(&rt, &random_vec(&mut rng, 256), 256)?;
    for _ in 0..3 {
        let host = random_vec(&mut rng, 256);
        let got = rt.stream().clone_dtoh(graph.replay(&host)?.y)?;
        let want: Vec<f32> = host.iter().map(|v| v + 3.0).collect();
        assert_eq!(got, want, "the side kernel is in the graph");
    }
    drop(graph);
    assert_runtime_usable(&rt, test)
}

/// Forks only while capturing, so no side stream was made before the capture.
#[cuda_graph(warmup = 1)]
fn forks_only_while_capturing(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    if is_capturing() {
        rt.fork(|side| add_scalar_side(side, rt, side.read(x), side.write(y), 1.0))?;
    }
    Ok(())
}

#[gpu_test]
fn fork_that_would_create_a_stream_in_capture_is_refused(rt: Runtime) -> Result<(), GraphError> {
    let test = "fork_that_would_create_a_stream_in_capture_is_refused";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let err = ForksOnlyWhileCapturingGraph::capture(&rt, &x, 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::SideStreamInCapture {
                graph: "forks_only_while_capturing",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.capture_code(), Some(900));
    let msg = err.to_string();
    assert!(
        msg.contains("needs a side stream") && msg.contains("capture_failures.rs"),
        "{msg}"
    );
    assert_runtime_usable(&rt, test)
}

#[gpu_test]
fn fork_reuses_its_side_stream_and_nests_on_another(rt: Runtime) -> Result<(), GraphError> {
    let first = rt.fork(|side| Ok(side.cu_stream() as usize))?;
    let again = rt.fork(|side| Ok(side.cu_stream() as usize))?;
    assert_eq!(first, again, "one side stream, created once and reused");
    assert_ne!(first, rt.stream().cu_stream() as usize);
    let (outer, inner) = rt.fork(|outer| {
        let inner = rt.fork(|inner| Ok(inner.cu_stream() as usize))?;
        Ok((outer.cu_stream() as usize, inner))
    })?;
    assert_eq!(outer, first);
    assert_ne!(inner, outer, "a nested fork gets a stream of its own");
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
