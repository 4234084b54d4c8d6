// Allocating pinned host memory inside the body.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    // SAFETY: the buffer is filled before it is read.
    let mut staging = unsafe { rt.context().alloc_pinned::<f32>(x.len()) }?;
    staging.as_mut_slice()?.fill(0.0);
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
