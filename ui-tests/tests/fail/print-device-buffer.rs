// Printing a candle tensor: its `Debug` copies the values from the GPU, which do not exist
// yet while the body is captured (even with the host-effects opt-in). cudarc's buffers
// format without reading (`pass/cudarc-buffers-formatted.rs`).
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use ui_tests::candle::Tensor;

#[cuda_graph(warmup = 2, host_effects_not_replayed)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] logits: &Tensor,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    println!("logits = {logits:?}");
    Ok(())
}

fn main() {}
