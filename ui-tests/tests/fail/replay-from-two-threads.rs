// One graph cannot be replayed from two threads at once.
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
    std::thread::scope(|s| {
        s.spawn(|| graph.launch().map(|_| ()));
        s.spawn(|| graph.launch().map(|_| ()));
    });
    Ok(())
}

fn main() {}
