//! Every parameter role in one function, and the generated type used as documented.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] cache: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] scale: f32,
) -> Result<(), GraphError> {
    let _ = (w, cache, scale);
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>, w: &CudaSlice<f32>, cache: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let mut graph = StepGraph::capture(rt, x, w, cache, 16, 0.5)?;
    let out = graph.replay(&vec![0.0f32; 16])?;
    let _y: &CudaSlice<f32> = out.y;
    let _ = graph.state_mut().cache;
    let _ = graph.launch()?;
    Ok(())
}

fn main() {}
