// Timing with CUDA events inside the body: reading the time waits for the GPU.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use graph_runtime::cudarc::driver::sys::CUevent_flags;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let start = rt.stream().record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    rt.stream().memcpy_dtod(x, y)?;
    let end = rt.stream().record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let _ms = start.elapsed_ms(&end)?;
    Ok(())
}

fn main() {}
