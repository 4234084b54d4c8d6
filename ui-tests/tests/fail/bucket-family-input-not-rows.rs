//! A bucket family whose input is not a `CudaSlice` of rows (a struct of yours here): the
//! family cannot split it into rows and pad it to a bucket. Its inputs and outputs are
//! `CudaSlice` rows, so candle bodies (tensors in, a tensor returned) are not families.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

#[derive(DeviceState)]
struct Rows {
    data: CudaSlice<f32>,
}

#[cuda_graph(warmup = 1, buckets(batch = [1, 2, 4]))]
fn step(rt: &Runtime, x: &Rows, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memcpy_dtod(&x.data, y)?;
    Ok(())
}

fn main() {}
