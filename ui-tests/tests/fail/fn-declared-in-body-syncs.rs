// A function declared inside the body runs in the capture: its sync is the body's.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};


#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    fn settle(rt: &Runtime) -> Result<(), GraphError> {
        rt.stream().synchronize()?;
        Ok(())
    }
    settle(rt)?;
    Ok(())
}

fn main() {}
