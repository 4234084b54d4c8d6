// A candle tensor copied to a host `Vec` inside the body (`to_vec1`, `to_vec2`, PyTorch's
// `.tolist()`). `ui_tests::candle` stands in for candle_core: the checks see names, not types.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use ui_tests::candle::Tensor;

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] logits: &Tensor,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let _rows: Vec<Vec<f32>> = logits.to_vec2()?;
    let _flat: Vec<f32> = logits.flatten_all()?.to_vec1()?;
    Ok(())
}

fn main() {}
