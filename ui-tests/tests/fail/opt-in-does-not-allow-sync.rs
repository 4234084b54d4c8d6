// The host-effects opt-in allows printing, not waiting for the GPU.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2, host_effects_not_replayed)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    println!("queued the copy");
    rt.synchronize()?;
    Ok(())
}

fn main() {}
