// A value read from the device earlier decides a branch later.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let host = rt.stream().clone_dtoh(x)?;
    let largest = host.iter().fold(0.0f32, |a, b| a.max(b.abs()));
    if largest > 1.0 {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

fn main() {}
