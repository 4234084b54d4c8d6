// A sync inside the arguments of a macro of your own is still a sync in the body.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

macro_rules! queued {
    ($($body:tt)*) => {{ $($body)* }};
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    queued! {
        rt.stream().memcpy_dtod(x, y)?;
        rt.stream().synchronize()?;
    }
    Ok(())
}

fn main() {}
