// A `macro_rules!` declared in the body that wraps `eprintln!`.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};


#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    macro_rules! note {
        ($($t:tt)*) => { eprintln!($($t)*) };
    }
    note!("step {}", x.len());
    Ok(())
}

fn main() {}
