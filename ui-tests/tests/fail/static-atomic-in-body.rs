// A `static` atomic counter updated in the body: replays do not advance it.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::sync::atomic::{AtomicU64, Ordering};
static STEP: AtomicU64 = AtomicU64::new(0);

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    STEP.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn main() {}
