// `lazy = N` keeps at most N graphs live: 0 would keep none (every replay would capture and
// drop its graph), and the bound is a number, not a string.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(buckets(batch = [1, 2, 4], lazy = 0))]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[cuda_graph(buckets(batch = [1, 2, 4], lazy = "2"))]
fn step2(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
