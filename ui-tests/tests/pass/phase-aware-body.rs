// Things that are legal while capturing: asking the phase, the capture status, asserting on
// host values (lengths), panicking, returning errors, joining and waiting on streams.
// Look-alikes of: host-branch-on-device-data
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, is_capturing, phase, GraphError, Phase, Runtime};

#[cuda_graph(warmup = 2)]
fn careful(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    assert_eq!(x.len(), y.len(), "x and y must have the same length");
    if x.is_empty() {
        return Err(GraphError::User("empty input".into()));
    }
    match phase() {
        Phase::Warmup { run, .. } if run > 100 => panic!("unexpected warmup run {run}"),
        _ => {}
    }
    let status = rt.stream().capture_status()?;
    debug_assert!(is_capturing() || format!("{status:?}").contains("NONE"));
    let done = rt.stream().record_event(None)?;
    rt.stream().wait(&done)?;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = CarefulGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
