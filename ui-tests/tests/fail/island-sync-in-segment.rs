// Next to an island, the segments are still checked: a sync and a host read in a segment are
// refused, while the same calls inside the island are fine.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let s = rt.stream();
    s.memcpy_dtod(x, &mut *y)?;
    rt.eager(|| {
        rt.stream().synchronize()?;
        let host = rt.stream().clone_dtoh(&y)?;
        println!("{}", host[0]);
        Ok(())
    })?;
    s.synchronize()?;
    let _host = s.clone_dtoh(&*y)?;
    Ok(())
}

fn main() {}
