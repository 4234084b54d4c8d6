// Syncs through cudarc's lower layers (`result`, `sys`): error 900 while capturing.
use graph_runtime::cudarc::driver::{result, sys, CudaSlice};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let raw = rt.stream().cu_stream();
    // SAFETY: `raw` is the runtime's live stream.
    unsafe { result::stream::synchronize(raw) }?;
    result::ctx::synchronize()?;
    // SAFETY: as above.
    unsafe { sys::cuStreamSynchronize(raw) }.result()?;
    Ok(())
}

fn main() {}
