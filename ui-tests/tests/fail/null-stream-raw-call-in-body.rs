// Raw driver work on the legacy stream (a null `CUstream`): it runs once at capture and is missing from the graph.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use graph_runtime::cudarc::driver::{sys, DevicePtrMut};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let n = y.len();
    let (ptr, _sync) = y.device_ptr_mut(rt.stream());
    // SAFETY: `ptr` is `y`'s live allocation of `n` floats.
    unsafe { sys::cuMemsetD32Async(ptr, 0, n, std::ptr::null_mut()) }.result()?;
    Ok(())
}

fn main() {}
