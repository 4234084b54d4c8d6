// A candle tensor's value read on the host inside the body (PyTorch's `.item()`).
// `ui_tests::candle` stands in for candle_core: the checks see names, not types.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use ui_tests::candle::Tensor;

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] loss: &Tensor,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let _total: f32 = loss.sum_all()?.to_scalar()?;
    Ok(())
}

fn main() {}
