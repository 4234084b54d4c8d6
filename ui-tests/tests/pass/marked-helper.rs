// A helper that bodies call, marked `#[graph_helper]`: checked like a body, and correct.
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, graph_helper, GraphError, Runtime};

const K: &str = "extern \"C\" __global__ void twice(const float *x, float *y, int n) { int i = threadIdx.x; if (i < n) y[i] = 2.0f * x[i]; }";

#[graph_helper]
fn twice(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let f = rt.function(K, "twice")?;
    let n = x.len() as i32;
    // SAFETY: reads `n` floats of `x` and writes `n` of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(y)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    Ok(())
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    twice(rt, x, y)
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = StepGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
