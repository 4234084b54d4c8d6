// Creating a stream inside the body instead of using rt.fork.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let side = rt.context().new_stream()?;
    side.join(rt.stream())?;
    side.memcpy_dtod(x, y)?;
    rt.stream().join(&side)?;
    Ok(())
}

fn main() {}
