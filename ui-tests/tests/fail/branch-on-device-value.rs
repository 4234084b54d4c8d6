// Host control flow on a value read from the device: the graph replays one path.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    if rt.stream().clone_dtoh(y)?[0].is_nan() {
        return Err(GraphError::User("NaN in y".into()));
    }
    Ok(())
}

fn main() {}
