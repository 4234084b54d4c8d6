// An input type that is not a device buffer: the runtime's trait says what it needs.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

pub struct Weights(CudaSlice<f32>);

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &Weights, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(&x.0, y)?;
    Ok(())
}

fn main() {}
