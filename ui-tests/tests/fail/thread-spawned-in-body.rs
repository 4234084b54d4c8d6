// A thread started inside the body runs during warmup and capture only, never on replay.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let n = x.len();
    let checksum = std::thread::spawn(move || (0..n).sum::<usize>());
    rt.stream().memcpy_dtod(x, y)?;
    let _ = checksum.join();
    Ok(())
}

fn main() {}
