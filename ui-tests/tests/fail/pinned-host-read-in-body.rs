// Reading a pinned host buffer inside the body waits for the GPU first.
use graph_runtime::cudarc::driver::{CudaSlice, PinnedHostSlice};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn stage(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] staging: &PinnedHostSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_htod(staging, y)?; // a copy from a pinned buffer is fine
    let _first = staging.as_slice()?[0]; // reading its host side is not
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
