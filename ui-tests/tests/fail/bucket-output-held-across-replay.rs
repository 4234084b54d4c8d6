use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(buckets(batch = [1, 2, 4]))]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, batch: usize) -> Result<(), GraphError> {
    let _ = batch;
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn use_it(rt: &Runtime) -> Result<(), GraphError> {
    let mut family = StepBuckets::capture(rt, 8, 8)?;
    let first = family.replay(&vec![1.0f32; 8])?;
    let second = family.replay(&vec![2.0f32; 16])?;
    let _ = (first.y.len(), second.y.len());
    Ok(())
}

fn main() {
    let _ = use_it;
}
