// A side-branch handle cannot leave its fork: after the join nothing orders its buffer.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{GraphError, Runtime};

#[allow(dead_code)]
fn run(rt: &Runtime) -> Result<(), GraphError> {
    let scratch = rt.fork(|side| side.scratch::<f32>(16))?;
    let _ = scratch;
    let _: Option<CudaSlice<f32>> = None;
    Ok(())
}

fn main() {}
