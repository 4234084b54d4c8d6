// A host Vec as an input: inputs are device buffers the graph owns.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &Vec<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = (rt, x, y);
    Ok(())
}

fn main() {}
