// A parameter without a name.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, _: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = (rt, y);
    Ok(())
}

fn main() {}
