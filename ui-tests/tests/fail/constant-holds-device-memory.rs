// Device memory smuggled in as a #[constant]: the graph records the buffer's address at
// capture, and code holding the other `Arc` could replace the buffer afterwards with nothing
// to stop it. Constants must be plain `Copy` host data; device memory is #[state].
use std::sync::{Arc, Mutex};

use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] w: Arc<Mutex<CudaSlice<f32>>>,
) -> Result<(), GraphError> {
    let w = w.lock().unwrap();
    rt.stream().memcpy_dtod(&*w, y)?;
    let _ = x;
    Ok(())
}

fn main() {}
