// A `static mut` counter written in the body: replays do not advance it.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
static mut CALLS: u64 = 0;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    // SAFETY: single-threaded example.
    unsafe { CALLS += 1 };
    Ok(())
}

fn main() {}
