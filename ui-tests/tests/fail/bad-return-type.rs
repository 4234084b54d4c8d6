// Outputs are &mut parameters; the return value only carries success or an error.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> f32 {
    let _ = (rt, x, y);
    0.0
}

fn main() {}
