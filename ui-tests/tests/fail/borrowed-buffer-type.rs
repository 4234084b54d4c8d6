// A view as an input (here with its lifetime written; `CudaView<f32>` with it elided gets
// the same error): the graph must own its static buffers.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use graph_runtime::cudarc::driver::CudaView;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaView<'_, f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
