// Beginning a capture by hand inside a body the runtime is capturing.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use graph_runtime::cudarc::driver::sys::CUstreamCaptureMode;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
