// Printing inside the body: it runs at capture, never on replay.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    println!("step on {} elements", x.len());
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
