// A fork-join function (rayon's `join`) imported by `use`: two closures run on two threads.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
mod pool {
    pub fn join<A: FnOnce() -> RA, B: FnOnce() -> RB, RA, RB>(a: A, b: B) -> (RA, RB) {
        (a(), b())
    }
}
use pool::join;

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let (_a, _b) = join(|| x.len(), || 2);
    Ok(())
}

fn main() {}
