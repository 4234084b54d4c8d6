// A new cuBLAS handle inside the body instead of rt.blas().
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use graph_runtime::cudarc::cublas::CudaBlas;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let blas = CudaBlas::new(rt.stream().clone())?;
    let _ = blas.handle();
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
