// Printing a value read from the device: the read is the first error, and the host-effects
// opt-in that would allow the print does not fix it.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    println!("y[0] = {}", rt.stream().clone_dtoh(y)?[0]);
    Ok(())
}

fn main() {}
