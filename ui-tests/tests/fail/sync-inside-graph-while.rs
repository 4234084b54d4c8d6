// A sync and a host read written inside the closures of `graph_while` and `graph_if`: the
// constructs are accepted, their closures are checked like the rest of the body.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, Compare, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let go = rt.condition(true)?;
    rt.graph_while(&go, Some(8), |rt| {
        rt.stream().memcpy_dtod(x, &mut *y)?;
        rt.stream().synchronize()?;
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })?;
    rt.graph_if(&go, |rt| {
        let host = rt.stream().clone_dtoh(&*y)?;
        let _first = host[0];
        Ok(())
    })
}

fn main() {}
