// Islands inside the closures of `graph_if` and `graph_if_else`: a branch is one conditional
// node of the graph, which a replay cannot stop for host code.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, Compare, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, &mut *y)?;
    let positive = rt.condition(false)?;
    positive.set_from(rt, x, Compare::Gt, 0.0)?;
    rt.graph_if(&positive, |rt| {
        rt.eager(|| Ok(()))?;
        rt.stream().memset_zeros(&mut *y)?;
        Ok(())
    })?;
    let again = rt.condition(false)?;
    again.set_from(rt, x, Compare::Gt, 0.0)?;
    rt.graph_if_else(&again, |rt, positive| {
        if positive {
            rt.eager(|| Ok(()))?;
        } else {
            rt.stream().memset_zeros(&mut *y)?;
        }
        Ok(())
    })
}

fn main() {}
