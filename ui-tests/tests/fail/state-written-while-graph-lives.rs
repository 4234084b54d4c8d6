// Read-only state cannot be written while the graph borrows it.
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
    let mut w = rt.stream().alloc_zeros::<f32>(16)?;
    let mut graph = ScaleGraph::capture(rt, x, &w, 16)?;
    rt.stream().memcpy_htod(&[2.0f32; 16], &mut w)?;
    graph.launch()?;
    Ok(())
}

fn main() {}
