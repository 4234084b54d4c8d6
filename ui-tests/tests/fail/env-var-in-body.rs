// An environment variable read in the body: the value at capture is frozen.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::env;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let _scale: f32 = env::var("SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1.0);
    Ok(())
}

fn main() {}
