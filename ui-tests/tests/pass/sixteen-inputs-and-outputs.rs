// The most static buffers a graph holds: 16 inputs and 16 outputs (the runtime's tuples of
// static buffers go up to 16; `fail/too-many-inputs.rs` is one more).
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
    y0: &mut CudaSlice<f32>,
    y1: &mut CudaSlice<f32>,
    y2: &mut CudaSlice<f32>,
    y3: &mut CudaSlice<f32>,
    y4: &mut CudaSlice<f32>,
    y5: &mut CudaSlice<f32>,
    y6: &mut CudaSlice<f32>,
    y7: &mut CudaSlice<f32>,
    y8: &mut CudaSlice<f32>,
    y9: &mut CudaSlice<f32>,
    y10: &mut CudaSlice<f32>,
    y11: &mut CudaSlice<f32>,
    y12: &mut CudaSlice<f32>,
    y13: &mut CudaSlice<f32>,
    y14: &mut CudaSlice<f32>,
    y15: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x0, y15)?;
    Ok(())
}

fn main() {
    // The graph type exists with all 32 buffers; capturing it needs a GPU.
    let _ = std::mem::size_of::<StepGraph<'static>>();
}
