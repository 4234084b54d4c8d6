// Whether a file exists, asked in the body: the answer at capture is frozen.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::path::Path;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    if Path::new("/tmp/skip-copy").exists() {
        rt.stream().memset_zeros(y)?;
    }
    Ok(())
}

fn main() {}
