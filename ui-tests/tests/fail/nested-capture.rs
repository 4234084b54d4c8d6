// Capturing a graph inside the body of another graph.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn inner(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[cuda_graph(warmup = 2)]
fn outer(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let mut graph = InnerGraph::capture(rt, x, y.len())?;
    let out = graph.replay(x)?;
    rt.stream().memcpy_dtod(out.y, y)?;
    Ok(())
}

fn main() {}
