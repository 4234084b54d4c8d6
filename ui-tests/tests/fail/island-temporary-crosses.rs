// A temporary of the segment before an island, read by the segment after it: each segment is
// its own graph, so device data crosses an island only in a buffer the graph owns.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let s = rt.stream();
    let mut tmp = s.alloc_zeros::<f32>(x.len())?;
    s.memcpy_dtod(x, &mut tmp)?;
    rt.eager(|| Ok(()))?;
    s.memcpy_dtod(&tmp, &mut *y)?;
    Ok(())
}

fn main() {}
