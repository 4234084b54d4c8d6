// `&mut` state lent back by `state_mut()` can be written into, not replaced: a `CudaSlice`
// comes back as a `CudaViewMut`, and assigning a new buffer to it does not compile.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] kv: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, kv)?;
    rt.stream().memcpy_dtod(&*kv, y)?;
    Ok(())
}

#[allow(dead_code)]
fn run(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut kv = rt.stream().alloc_zeros::<f32>(16)?;
    let mut graph = StepGraph::capture(rt, x, &mut kv, 16)?;
    let st = graph.state_mut();
    *st.kv = rt.stream().alloc_zeros::<f32>(16)?;
    Ok(())
}

fn main() {}
