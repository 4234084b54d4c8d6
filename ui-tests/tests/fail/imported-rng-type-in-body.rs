// A generator type imported by `use` (fastrand's `Rng`): its draws are frozen into the graph.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
mod fastrand {
    pub struct Rng(u32);
    impl Rng {
        pub fn new() -> Self {
            Rng(7)
        }
        pub fn u32(&mut self, r: std::ops::Range<u32>) -> u32 {
            r.start + self.0 % (r.end - r.start)
        }
    }
}
use fastrand::Rng;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let mut r = Rng::new();
    let _pick = r.u32(0..10);
    Ok(())
}

fn main() {}
