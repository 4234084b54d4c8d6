// A const fn cannot launch GPU work.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, Runtime};

#[cuda_graph(warmup = 2)]
const fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) {
    let _ = (rt, x, y);
}

fn main() {}
