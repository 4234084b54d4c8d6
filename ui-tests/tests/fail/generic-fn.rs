// A graph is captured for concrete types: no type parameters.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use graph_runtime::cudarc::driver::DeviceRepr;

#[cuda_graph(warmup = 2)]
fn step<T: DeviceRepr>(rt: &Runtime, x: &CudaSlice<T>, y: &mut CudaSlice<T>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
