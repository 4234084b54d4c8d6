// Pinned host memory allocated through cudarc's lower layers (error 900 while capturing).
use graph_runtime::cudarc::driver::{result, sys, CudaSlice};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    // SAFETY: the buffer is freed below and never read.
    let staging = unsafe { result::malloc_host(4096, 0) }?;
    let mut other = std::ptr::null_mut();
    // SAFETY: as above.
    unsafe { sys::cuMemHostAlloc(&mut other, 4096, 0) }.result()?;
    // SAFETY: both were allocated above.
    unsafe {
        result::free_host(staging)?;
        result::free_host(other)?;
    }
    Ok(())
}

fn main() {}
