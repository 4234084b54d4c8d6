// A realistic body: NVRTC kernels through the runtime's cache, a temporary from
// alloc_zeros, state, a constant, several launches. None of it may trip a capture check.
// Look-alikes of: module-load-in-body
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};

const SRC: &str = r#"
extern "C" __global__ void mul(const float *a, const float *b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i];
}
extern "C" __global__ void add_scalar(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + a;
}
"#;

#[cuda_graph(warmup = 3)]
fn scale_shift(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] shift: f32,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let mul = rt.function(SRC, "mul")?;
    let add = rt.function(SRC, "add_scalar")?;
    let s = rt.stream();
    let mut tmp = s.alloc_zeros::<f32>(x.len())?;
    // SAFETY: both kernels touch exactly `n` floats of buffers that hold `n`.
    unsafe {
        s.launch_builder(&mul).arg(x).arg(w).arg(&mut tmp).arg(&n).launch(cfg)?;
        s.launch_builder(&add).arg(&tmp).arg(&mut *y).arg(&shift).arg(&n).launch(cfg)?;
    }
    s.memset_zeros(&mut tmp)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>, w: &CudaSlice<f32>) -> Result<Vec<f32>, GraphError> {
    let mut graph = ScaleShiftGraph::capture(rt, x, w, x.len(), 0.5)?;
    let mut last = Vec::new();
    for step in 0..3 {
        let input = vec![step as f32; x.len()];
        let out = graph.replay(&input)?;
        last = rt.stream().clone_dtoh(out.y)?; // reading after the replay is fine
    }
    Ok(last)
}

fn main() {}
