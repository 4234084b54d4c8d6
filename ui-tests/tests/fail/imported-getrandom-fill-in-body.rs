// `getrandom::fill` imported by `use`: host randomness frozen into the graph.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
mod getrandom {
    pub fn fill(buf: &mut [u8]) -> Result<(), std::io::Error> {
        buf.fill(4);
        Ok(())
    }
}
use getrandom::fill;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let mut seed = [0u8; 8];
    fill(&mut seed).ok();
    Ok(())
}

fn main() {}
