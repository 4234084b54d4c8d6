// Recording into a host collection inside the body: replays do not run it.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] lengths: &mut Vec<usize>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    lengths.push(x.len());
    Ok(())
}

fn main() {}
