// Role attributes take no arguments.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, #[state(read_only)] w: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = w;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
