// `inputs_mut()` lends the static inputs as views: a new buffer cannot be put in their place.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn copy(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn run(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut graph = CopyGraph::capture(rt, x, x.len())?;
    let inputs = graph.inputs_mut();
    *inputs.x = rt.stream().alloc_zeros::<f32>(x.len())?;
    Ok(())
}

fn main() {}
