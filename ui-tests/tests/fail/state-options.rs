// `no_restore` is for `&mut` state only, and it is the only option of `#[state(…)]`.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn apply(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state(no_restore)] w: &CudaSlice<f32>,
    #[state(keep)] kv: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    rt.stream().memcpy_dtod(w, kv)?;
    Ok(())
}

fn main() {}
