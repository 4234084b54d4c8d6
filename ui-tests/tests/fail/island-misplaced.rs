// Islands where a replay cannot stop for host code (inside a closure, inside an expression),
// one whose closure takes parameters, and `#[island]` state used by a segment.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[island] seen: &mut Vec<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, &mut *y)?;
    let go = rt.condition(true)?;
    rt.graph_while(&go, Some(2), |rt| {
        rt.eager(|| Ok(()))?;
        go.set(rt, false)
    })?;
    let _twice = (rt.eager(|| Ok(())), 2);
    rt.eager(|y| Ok(()))?;
    seen.clear();
    Ok(())
}

fn main() {}
