// A first parameter that is not an execution context.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError};

#[cuda_graph(warmup = 2)]
fn step(n: &u32, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = (n, x, y);
    Ok(())
}

fn main() {}
