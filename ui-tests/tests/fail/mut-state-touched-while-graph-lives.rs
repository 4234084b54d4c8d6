// Mutable state is reached through graph.state_mut() while the graph lives, not directly.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn decode(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] cache: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, cache)?;
    rt.stream().memcpy_dtod(cache, y)?;
    Ok(())
}

#[allow(dead_code)]
fn run(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut cache = rt.stream().alloc_zeros::<f32>(16)?;
    let mut graph = DecodeGraph::capture(rt, x, &mut cache, 16)?;
    rt.stream().memset_zeros(&mut cache)?;
    graph.launch()?;
    Ok(())
}

fn main() {}
