// The attribute on a method: the graph must own its buffers and borrow its state separately.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

struct Model {
    w: CudaSlice<f32>,
}

impl Model {
    #[cuda_graph(warmup = 2)]
    fn forward(&self, rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
        rt.stream().memcpy_dtod(&self.w, y)?;
        Ok(())
    }
}

fn main() {}
