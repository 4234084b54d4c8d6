// Every mistake is reported in one compilation, each where it is written.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 0, warmpu = 3)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    println!("step");
    rt.stream().memcpy_dtod(x, y)?;
    rt.stream().synchronize()?;
    let _host = rt.stream().clone_dtoh(y)?;
    Ok(())
}

fn main() {}
