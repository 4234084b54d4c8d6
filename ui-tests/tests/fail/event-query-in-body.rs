// Asking whether an event has completed inside the body.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let done = rt.stream().record_event(None)?;
    while !done.is_complete() {
        std::hint::spin_loop();
    }
    Ok(())
}

fn main() {}
