// Waiting for the GPU inside the body: CUDA refuses it during capture (error 900).
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    rt.stream().synchronize()?;
    Ok(())
}

fn main() {}
