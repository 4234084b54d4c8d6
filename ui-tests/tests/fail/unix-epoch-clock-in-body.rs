// The clock read through `UNIX_EPOCH.elapsed()`: the time at capture is frozen.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::time::UNIX_EPOCH;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let _seed = UNIX_EPOCH.elapsed().map(|d| d.as_nanos()).unwrap_or(0);
    Ok(())
}

fn main() {}
