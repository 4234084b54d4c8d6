// More static inputs than the runtime's tuples hold (16): refused at the 17th, with what to
// write instead.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
#[allow(unused_variables)]
fn step(
    rt: &Runtime,
    x0: &CudaSlice<f32>,
    x1: &CudaSlice<f32>,
    x2: &CudaSlice<f32>,
    x3: &CudaSlice<f32>,
    x4: &CudaSlice<f32>,
    x5: &CudaSlice<f32>,
    x6: &CudaSlice<f32>,
    x7: &CudaSlice<f32>,
    x8: &CudaSlice<f32>,
    x9: &CudaSlice<f32>,
    x10: &CudaSlice<f32>,
    x11: &CudaSlice<f32>,
    x12: &CudaSlice<f32>,
    x13: &CudaSlice<f32>,
    x14: &CudaSlice<f32>,
    x15: &CudaSlice<f32>,
    x16: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x16, y)?;
    Ok(())
}

fn main() {}
