// A buffer the side branch writes is borrowed until the join: the runtime's stream cannot
// touch it concurrently.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn branch(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.fork(|side| {
        let out = side.write(y);
        side.memcpy(side.read(x), out)?;
        rt.stream().memset_zeros(y)?;
        Ok(())
    })
}

fn main() {}
