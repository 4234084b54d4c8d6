// A struct of buffers as state must say where its buffers are (`#[derive(DeviceState)]`),
// so the graph can check them before every replay.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

struct Model {
    w: CudaSlice<f32>,
}

#[cuda_graph(warmup = 2)]
fn apply(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] m: &Model,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    rt.stream().memcpy_dtod(&m.w, y)?;
    Ok(())
}

fn main() {}
