// A sync written as a path call on a cudarc or runtime type is still a sync (error 900).
use graph_runtime::cudarc::driver::{CudaSlice, CudaStream};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    CudaStream::synchronize(rt.stream())?;
    Runtime::synchronize(rt)?;
    Ok(())
}

fn main() {}
