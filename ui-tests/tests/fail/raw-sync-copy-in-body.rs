// Synchronous copies of cudarc's lower layers: the capture records nothing for them.
use graph_runtime::cudarc::driver::{result, sys, CudaSlice};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] dst: sys::CUdeviceptr,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let bias = [0.5f32; 4];
    // SAFETY: `dst` holds four floats.
    unsafe { result::memcpy_htod_sync(dst, &bias) }?;
    let mut back = [0.0f32; 4];
    // SAFETY: as above.
    unsafe { sys::cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), dst, 16) }.result()?;
    Ok(())
}

fn main() {}
