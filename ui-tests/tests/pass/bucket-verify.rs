// A bucket family verifies its replays as a single graph does: `verify`, `verify_every` and
// `verify_tolerance` beside `buckets(…)` are accepted, and the family has `verify`, whose
// report names the bucket, and prints its graphs.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime, Tolerance, VerifyReport};

#[cuda_graph(buckets(batch = [1, 2, 4]), verify = "every", verify_tolerance = 1e-5)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[cuda_graph(verify_every = 4, buckets(batch = [8, 16]))]
fn step2(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

/// A family without inputs is given its batch, in `replay` and `verify` alike.
#[cuda_graph(buckets(batch = [1, 2]), verify = "first")]
fn fill(rt: &Runtime, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memset_zeros(y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime) -> Result<String, GraphError> {
    let mut family = StepBuckets::capture(rt, 8, 8)?;
    let report: VerifyReport = family.verify(&vec![1.0f32; 3 * 8], Tolerance::BITWISE)?;
    let bucket: Option<usize> = report.bucket;
    let _ = (bucket, family.replay(&vec![1.0f32; 8])?.y.len());
    let mut empty = FillBuckets::capture(rt, 4)?;
    empty.verify(2, Tolerance::new(1e-6, 1e-6))?.into_result()?;
    let _ = empty.replay(1)?.y.len();
    Ok(format!("{family}\n{empty}"))
}

fn main() {}
