// A parameter named `rt` after the context clashes with the generated capture(rt, …).
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(ctx: &Runtime, rt: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    ctx.stream().memcpy_dtod(rt, y)?;
    Ok(())
}

fn main() {}
