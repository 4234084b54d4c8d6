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

/// A lazy family (each bucket captured on its first use, at most one live) with `&mut` state
/// and a constant, which the family's capture on a replay reaches through its own fields.
#[cuda_graph(buckets(batch = [1, 2], lazy = 1))]
fn accumulate(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] acc: &mut CudaSlice<f32>,
    #[constant] scale: f32,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = (scale, batch);
    rt.stream().memcpy_dtod(x, acc)?;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_the_lazy_one(rt: &Runtime, acc: &mut CudaSlice<f32>) -> Result<String, GraphError> {
    let mut family = AccumulateBuckets::capture(rt, 64, acc, 2.0, 64)?;
    family.replay(&vec![0.0f32; 64])?;
    let stats: graph_runtime::BucketStats = family.buckets().stats();
    Ok(stats.to_string())
}

fn main() {}
