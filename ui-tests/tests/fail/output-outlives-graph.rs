// An output cannot outlive its graph: the graph owns the buffer.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn copy(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn run(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let y = {
        let mut graph = CopyGraph::capture(rt, x, x.len())?;
        graph.replay(x)?.y
    };
    let _host = rt.stream().clone_dtoh(y)?;
    Ok(())
}

fn main() {}
