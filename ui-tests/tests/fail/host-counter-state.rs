// A step counter held as `&mut` host state: the increment runs in warmup and capture only.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] step: &mut u64,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    *step += 1;
    Ok(())
}

fn main() {}
