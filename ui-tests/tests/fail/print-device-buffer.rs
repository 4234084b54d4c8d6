// Printing a device buffer: its values are not on the host (even with the host-effects opt-in).
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2, host_effects_not_replayed)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    println!("y = {y:?}");
    Ok(())
}

fn main() {}
