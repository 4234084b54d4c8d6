// Reading a device buffer back to the host inside the body.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let host = rt.stream().clone_dtoh(y)?;
    let _total: f32 = host.iter().sum();
    Ok(())
}

fn main() {}
