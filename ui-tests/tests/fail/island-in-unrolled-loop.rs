// An island inside a step of `graph_while_unrolled`: the loop is one conditional node of the
// graph, whose steps a replay cannot stop for host code.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, Compare, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, &mut *y)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while_unrolled(&go, Some(8), 4, |rt| {
        rt.eager(|| Ok(()))?;
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })
}

fn main() {}
