// Uploading a host Vec inside the body: the graph would keep reading its address.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let bias = rt.stream().clone_htod(&vec![0.5f32; x.len()])?;
    rt.stream().memcpy_dtod(&bias, y)?;
    Ok(())
}

fn main() {}
