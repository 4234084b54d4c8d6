// rand's generator under another name (`use rand::rng as fresh`): its draws are frozen.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use rand::{rng as fresh, Rng};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let mut g = fresh();
    let _scale: f32 = g.random();
    Ok(())
}

fn main() {}
