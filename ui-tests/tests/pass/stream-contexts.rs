// The three execution contexts a body may take: `&Runtime`, `&Arc<CudaStream>`, `&CudaStream`.
// Look-alikes of: legacy-default-stream
use std::sync::Arc;

use graph_runtime::cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn with_arc(s: &Arc<CudaStream>, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let mut tmp = s.alloc_zeros::<f32>(x.len())?;
    s.memcpy_dtod(x, &mut tmp)?;
    s.memcpy_dtod(&tmp, y)?;
    Ok(())
}

#[cuda_graph(warmup = 1, mode = "global")]
fn with_stream(
    s: &CudaStream,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] copy: &CudaFunction,
) {
    let n = x.len() as i32;
    // SAFETY: the kernel copies `n` floats from `x` to `y`, which both hold `n`.
    unsafe { s.launch_builder(copy).arg(x).arg(&mut *y).arg(&n).launch(LaunchConfig::for_num_elems(n as u32)) }
        .expect("launch");
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    const SRC: &str = "extern \"C\" __global__ void copy(const float *x, float *y, int n) { }";
    let copy = rt.function(SRC, "copy")?;
    let mut a = WithArcGraph::capture(rt, x, x.len())?;
    let mut b = WithStreamGraph::capture(rt, x, x.len(), &copy)?;
    let _ = a.replay(x)?;
    let _ = b.launch()?;
    // The functions are still ordinary functions.
    let mut y = rt.stream().alloc_zeros::<f32>(x.len())?;
    with_arc(rt.stream(), x, &mut y)?;
    with_stream(rt.stream(), x, &mut y, &copy);
    Ok(())
}

fn main() {}
