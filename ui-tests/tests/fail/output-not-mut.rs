// #[output] on a shared reference.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, #[output] y: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = (rt, x, y);
    Ok(())
}

fn main() {}
