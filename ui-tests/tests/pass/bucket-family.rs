//! A bucket family: one graph per batch size, the batch parameter named in `buckets(…)`.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2, buckets(batch = [1, 2, 4, 8], fallback = "eager"))]
fn rows_plus_one(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = (w, batch);
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, w: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut family = RowsPlusOneBuckets::capture(rt, 64, w, 64)?;
    assert_eq!(RowsPlusOneBuckets::BUCKETS, &[1, 2, 4, 8]);
    let out = family.replay(&vec![0.0f32; 3 * 64])?;
    let _valid_rows: usize = out.y.len();
    Ok(())
}

fn main() {}
