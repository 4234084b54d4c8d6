// A candle tensor moved to the CPU device inside the body (PyTorch's `.cpu()`).
// `ui_tests::candle` stands in for candle_core: the checks see names, not types.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use ui_tests::candle::{Device, Tensor};

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] logits: &Tensor,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let _on_host = logits.to_device(&Device::Cpu)?;
    Ok(())
}

fn main() {}
