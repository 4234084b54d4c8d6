// An output borrowed from one replay cannot be held across the next: the replay overwrites it.
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
    let first = graph.replay(&vec![1.0f32; 16])?;
    let second = graph.replay(&vec![2.0f32; 16])?;
    let a = rt.stream().clone_dtoh(first.y)?;
    let b = rt.stream().clone_dtoh(second.y)?;
    assert_ne!(a, b);
    Ok(())
}

fn main() {}
