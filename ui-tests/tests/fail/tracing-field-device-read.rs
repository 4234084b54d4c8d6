// tracing's field syntax around a device read: the read is refused even with the host-effects opt-in.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};


#[cuda_graph(warmup = 2, host_effects_not_replayed)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    tracing::info!(first = ?rt.stream().clone_dtoh(y)?.first(), "step");
    Ok(())
}

fn main() {}
