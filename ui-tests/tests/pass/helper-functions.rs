// The macro checks the body's own tokens. A call it cannot see into (a helper function) is
// where a deliberate exception goes; the runtime's guards check those at run time
// (`Runtime::synchronize` inside a capture returns `GraphError::SyncInCapture`).
// Look-alikes of: host-sync
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, ensure_not_capturing, GraphError, Runtime};

fn checkpoint(rt: &Runtime) -> Result<(), GraphError> {
    ensure_not_capturing("checkpoint")?;
    rt.synchronize()
}

#[cuda_graph(warmup = 1)]
fn with_helper(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    if !graph_runtime::is_capturing() {
        checkpoint(rt)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = WithHelperGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
