// Reading a file inside the body: replays do not read it again.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let _config = std::fs::read_to_string("model.toml").map_err(|e| GraphError::User(e.into()))?;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
