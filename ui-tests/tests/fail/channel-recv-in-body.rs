// A message taken from a channel in the body: taken once, at capture, and frozen.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};


#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    tx.send(3).ok();
    let _n = rx.recv().unwrap_or(0);
    Ok(())
}

fn main() {}
