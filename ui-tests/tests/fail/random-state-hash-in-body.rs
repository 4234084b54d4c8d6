// std's `RandomState` seeds its hasher from the OS: the seed at capture is frozen.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::hash::{BuildHasher, RandomState};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let _h = RandomState::new().hash_one(x.len());
    Ok(())
}

fn main() {}
