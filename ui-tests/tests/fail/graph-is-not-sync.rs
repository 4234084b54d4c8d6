// A graph is Send but not Sync: it cannot be shared between threads, even read-only.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn copy(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn run(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let graph = CopyGraph::capture(rt, x, x.len())?;
    std::thread::scope(|s| {
        s.spawn(|| graph.info().nodes());
        s.spawn(|| graph.info().nodes());
    });
    Ok(())
}

fn main() {}
