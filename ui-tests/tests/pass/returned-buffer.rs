// A body that returns its result (`-> Result<T, E>`, as candle code returns a `Tensor`): the
// graph copies the returned buffer into a static one inside the graph, and `replay` lends it
// as `result`.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn doubled(rt: &Runtime, x: &CudaSlice<f32>) -> Result<CudaSlice<f32>, GraphError> {
    let mut y = rt.stream().alloc_zeros::<f32>(x.len())?;
    rt.stream().memcpy_dtod(x, &mut y)?;
    Ok(y)
}

fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<Vec<f32>, GraphError> {
    let mut graph = DoubledGraph::capture(rt, x)?;
    let out = graph.replay(x)?;
    let y: &CudaSlice<f32> = out.result;
    Ok(rt.stream().clone_dtoh(y)?)
}

fn main() {
    let _ = use_it;
}
