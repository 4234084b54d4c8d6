// Work on the legacy default stream is not recorded by the capture.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.context().default_stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
