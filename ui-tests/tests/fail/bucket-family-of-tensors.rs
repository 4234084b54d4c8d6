//! A bucket family whose body takes a tensor type of another crate and returns a value, as a
//! candle body does (a `ModelState` or a `StaticKvCache` beside it changes nothing): a family
//! splits and pads `CudaSlice` rows and hands back the valid rows of its output buffers, so
//! it takes neither (here `Rows` stands for candle's `Tensor`).
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

#[derive(DeviceState)]
struct Rows {
    data: CudaSlice<f32>,
}

#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4]))]
fn step(rt: &Runtime, x: &Rows, batch: usize) -> Result<CudaSlice<f32>, GraphError> {
    let _ = batch;
    Ok(rt.stream().clone_dtod(&x.data)?)
}

fn main() {}
