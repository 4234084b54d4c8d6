// A buffer made inside the fork's closure cannot be handed to the side branch: it would be
// freed when the closure returns, before the join, while the side stream still reads it.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn branch(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.fork(|side| {
        let tmp = rt.stream().clone_dtod(x)?;
        side.memcpy(side.read(&tmp), side.write(y))?;
        Ok(())
    })
}

fn main() {}
