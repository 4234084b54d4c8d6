// State the graph reads by address cannot be freed while the graph lives.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn scale(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    rt.stream().memcpy_dtod(w, y)?;
    Ok(())
}

#[allow(dead_code)]
fn run(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let w = rt.stream().alloc_zeros::<f32>(16)?;
    let mut graph = ScaleGraph::capture(rt, x, &w, 16)?;
    drop(w);
    graph.launch()?;
    Ok(())
}

fn main() {}
