// Reading the clock inside the body: the time read at capture is frozen.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let started = std::time::Instant::now();
    rt.stream().memcpy_dtod(x, y)?;
    let _spent = started.elapsed();
    Ok(())
}

fn main() {}
