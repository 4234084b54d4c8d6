// A graph may move to another thread (it is Send) and be replayed there, one thread at a time.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn copy(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut graph = CopyGraph::capture(rt, x, x.len())?;
    std::thread::scope(|s| s.spawn(move || graph.launch().map(|_| ())).join().expect("no panic"))?;
    Ok(())
}

fn main() {}
