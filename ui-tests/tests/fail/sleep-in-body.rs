// Sleeping inside the body: replays do not wait.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    std::thread::sleep(std::time::Duration::from_millis(1));
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
