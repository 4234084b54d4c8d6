// `std::thread::scope` imported by `use` and called by its bare name.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::thread::scope;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    scope(|s| {
        s.spawn(|| x.len());
    });
    Ok(())
}

fn main() {}
