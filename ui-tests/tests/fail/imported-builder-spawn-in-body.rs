// `std::thread::Builder` imported by `use`: a named thread spawned from a builder chain.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::thread::Builder;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let _worker = Builder::new().name("w".into()).spawn(|| 1).ok();
    Ok(())
}

fn main() {}
