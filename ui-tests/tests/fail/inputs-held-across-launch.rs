// The static inputs lent by inputs_mut cannot be written while the graph runs.
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
    let mut inputs = graph.inputs_mut();
    let _out = graph.launch()?;
    rt.stream().memcpy_htod(&[1.0f32; 16], &mut inputs.x)?;
    Ok(())
}

fn main() {}
