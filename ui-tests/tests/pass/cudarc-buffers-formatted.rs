// cudarc's buffers format as their address, length and stream (`#[derive(Debug)]`): no
// device memory is read, so they may be formatted in the body, in `format!` or an assertion.
// Look-alikes of: device-value-formatted
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let tmp = rt.stream().alloc_zeros::<f32>(x.len())?;
    let described = format!("{tmp:?}");
    assert!(!described.is_empty(), "{x:?} {y:?}");
    assert_eq!(format!("{:?}", x).is_empty(), false);
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = StepGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
