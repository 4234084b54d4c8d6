// Host control flow on a candle tensor's value: the graph replays one path.
// `ui_tests::candle` stands in for candle_core: the checks see names, not types.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use ui_tests::candle::Tensor;

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] norm: &Tensor,
) -> Result<(), GraphError> {
    // Copy only while the norm is large.
    if norm.to_scalar::<f32>()? > 1.0 {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

fn main() {}
