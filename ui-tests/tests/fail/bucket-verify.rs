// A bucket family does not verify its replays yet: `verify`, `verify_every` and
// `verify_tolerance` are refused on it rather than accepted and ignored.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(buckets(batch = [1, 2, 4]), verify = "every", verify_tolerance = 1e-5)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[cuda_graph(verify_every = 4, buckets(batch = [8, 16]))]
fn step2(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
