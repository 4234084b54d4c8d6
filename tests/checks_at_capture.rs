//! The classes of capture mistakes that compile on purpose, because the tokens cannot tell
//! them from correct code, and that the runtime refuses at capture with a typed error
//! (`graph_runtime::coverage` lists them as "typed at capture"): a stream behind a type of
//! the user's that derefs to it, a stream in a field of a state struct under a name of the
//! user's, and a pageable field of a state struct as the host end of a copy. Each test
//! checks the variant and that the runtime is usable afterwards, with a correct capture
//! replayed on fresh inputs.

use std::ops::Deref;
use std::sync::Arc;

use graph_runtime::cudarc::driver::sys::CUstreamCaptureStatus;
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, phase, DeviceState, GraphError, Phase, Runtime};
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

#[cuda_graph(warmup = 2)]
fn plus_two(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 2.0)
}

/// Not capturing, eager work right, and a fresh capture replaying right on new inputs.
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
    let host = random_vec(&mut rng, 257);
    let x = rt.stream().clone_htod(&host)?;
    let mut y = rt.stream().alloc_zeros::<f32>(257)?;
    plus_two(rt, &x, &mut y)?;
    let want: Vec<f32> = host.iter().map(|v| v + 2.0).collect();
    assert_eq!(
        rt.stream().clone_dtoh(&y)?,
        want,
        "{test}: eager work after the failure"
    );
    let mut graph = PlusTwoGraph::capture(rt, &x, 257)?;
    for _ in 0..3 {
        let host = random_vec(&mut rng, 257);
        let got = rt.stream().clone_dtoh(graph.replay(&host)?.y)?;
        let want: Vec<f32> = host.iter().map(|v| v + 2.0).collect();
        assert_eq!(got, want, "{test}: a capture after the failure");
    }
    Ok(())
}

// --- a stream behind a type of the user's ------------------------------------------------

/// A type of the user's that derefs to the runtime's stream: its `synchronize` is
/// `CudaStream::synchronize`, which the tokens cannot see when the value comes in as a
/// parameter of the user's type (built in the body from `rt.stream()`, the macro refuses it).
#[derive(DeviceState)]
struct Lane(Arc<CudaStream>);

impl Lane {
    fn new(s: &Arc<CudaStream>) -> Self {
        Lane(s.clone())
    }
}

impl Deref for Lane {
    type Target = CudaStream;
    fn deref(&self) -> &CudaStream {
        &self.0
    }
}

#[cuda_graph(warmup = 1)]
fn syncs_through_newtype(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] lane: &Lane,
) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    lane.synchronize()?;
    Ok(())
}

#[gpu_test]
fn a_stream_behind_a_newtype_is_refused_at_capture(rt: Runtime) -> Result<(), GraphError> {
    let test = "a_stream_behind_a_newtype_is_refused_at_capture";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    // Eagerly the sync is legal and the body is right.
    let mut y = rt.stream().alloc_zeros::<f32>(64)?;
    let lane = Lane::new(rt.stream());
    syncs_through_newtype(&rt, &x, &mut y, &lane)?;
    assert_eq!(
        rt.stream().clone_dtoh(&y)?,
        vec![2.0f32; 64],
        "{test}: eager"
    );
    let err = SyncsThroughNewtypeGraph::capture(&rt, &x, 64, &lane).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::CaptureUnsupported {
                graph: "syncs_through_newtype"
            }
        ),
        "{test}: {err:?}"
    );
    assert_eq!(err.capture_code(), Some(900), "{test}");
    assert_runtime_usable(&rt, test)
}

// --- a stream in a field of a state struct, under a name of the user's -------------------

#[derive(DeviceState)]
struct Worker {
    lane: Arc<CudaStream>,
}

#[cuda_graph(warmup = 1)]
fn syncs_through_state_field(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] w: &Worker,
) -> Result<(), GraphError> {
    add_scalar(rt, x, y, 1.0)?;
    // A field not named like a CUDA object: the macro takes `synchronize` for the user's.
    w.lane.synchronize()?;
    Ok(())
}

#[gpu_test]
fn a_stream_in_a_state_field_is_refused_at_capture(rt: Runtime) -> Result<(), GraphError> {
    let test = "a_stream_in_a_state_field_is_refused_at_capture";
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let w = Worker {
        lane: rt.stream().clone(),
    };
    let err = SyncsThroughStateFieldGraph::capture(&rt, &x, 64, &w).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::CaptureUnsupported {
                graph: "syncs_through_state_field"
            }
        ),
        "{test}: {err:?}"
    );
    assert_runtime_usable(&rt, test)
}

// --- a pageable field of a state struct as the host end of a copy ------------------------

/// A device buffer and a pageable host field: not host-only state (`DeviceState::HOST_ONLY`
/// is false), so it compiles, and only the capture can see which kind of host memory the
/// field is.
#[derive(DeviceState)]
struct Stage {
    scratch: CudaSlice<f32>,
    host: Vec<f32>,
}

#[cuda_graph(warmup = 1)]
fn copies_into_state_field(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] stage: &mut Stage,
) -> Result<(), GraphError> {
    add_scalar(rt, x, &mut stage.scratch, 0.0)?;
    add_scalar(rt, x, y, 1.0)?;
    // Legal when the field is pinned; this one is a `Vec`, which the runtime refuses.
    rt.stream().memcpy_dtoh(&*y, &mut stage.host)?;
    Ok(())
}

#[gpu_test]
fn a_pageable_state_field_as_a_copy_end_is_refused(rt: Runtime) -> Result<(), GraphError> {
    let test = "a_pageable_state_field_as_a_copy_end_is_refused";
    let mut rng = fresh_rng(test);
    let host = random_vec(&mut rng, 64);
    let x = rt.stream().clone_htod(&host)?;
    let mut stage = Stage {
        scratch: rt.stream().alloc_zeros::<f32>(64)?,
        host: vec![0.0; 64],
    };
    // Eagerly the copy is real.
    let mut y = rt.stream().alloc_zeros::<f32>(64)?;
    copies_into_state_field(&rt, &x, &mut y, &mut stage)?;
    rt.stream().synchronize()?;
    let want: Vec<f32> = host.iter().map(|v| v + 1.0).collect();
    assert_eq!(stage.host, want, "{test}: eager");
    let err = CopiesIntoStateFieldGraph::capture(&rt, &x, 64, &mut stage).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::PageableCopyCaptured {
                graph: "copies_into_state_field",
                direction: "device-to-host"
            }
        ),
        "{test}: {err:?}"
    );
    assert_runtime_usable(&rt, test)
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
