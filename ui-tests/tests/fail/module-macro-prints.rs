// A module-level macro of yours that wraps `eprintln!`: the body shows only `note!(…)`, and
// the print it expands to runs in the warmup runs and the capture only.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

macro_rules! note {
    ($($t:tt)*) => {
        eprintln!($($t)*)
    };
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    note!("copied {} floats", x.len());
    Ok(())
}

fn main() {}
