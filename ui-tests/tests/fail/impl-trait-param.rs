// impl Trait in a parameter makes the function generic.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, #[constant] n: impl Into<u32>) -> Result<(), GraphError> {
    let _ = n.into();
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
