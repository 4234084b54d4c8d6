// An island that replaces a buffer the segments read by address (an output and `&mut` state),
// and one that takes a temporary of the body: refused at the island.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] kv: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let tmp = s.alloc_zeros::<f32>(x.len())?;
    s.memcpy_dtod(x, &mut *y)?;
    rt.eager(|| {
        let fresh = rt.stream().alloc_zeros::<f32>(8)?;
        y = fresh;
        *kv = rt.stream().alloc_zeros::<f32>(8)?;
        let _ = tmp.len();
        Ok(())
    })?;
    s.memcpy_dtod(&*kv, &mut *y)?;
    Ok(())
}

fn main() {}
