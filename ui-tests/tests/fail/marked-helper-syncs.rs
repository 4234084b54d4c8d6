// A helper marked `#[graph_helper]` is checked like a body: its sync, its read of device
// memory and its print are errors at their lines, all reported at once.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{graph_helper, GraphError, Runtime};

#[graph_helper]
fn settle(rt: &Runtime, y: &CudaSlice<f32>) -> Result<f32, GraphError> {
    rt.stream().synchronize()?;
    let host = rt.stream().clone_dtoh(y)?;
    println!("first value {}", host[0]);
    Ok(host[0])
}

fn main() {}
