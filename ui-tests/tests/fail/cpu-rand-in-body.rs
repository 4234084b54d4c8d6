// A CPU random number drawn in the body is frozen into the graph.
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SRC: &str = "extern \"C\" __global__ void scale(const float *x, float *y, float a, int n) { }";

#[cuda_graph(warmup = 2)]
fn jitter(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let mut rng = SmallRng::seed_from_u64(7);
    let a: f32 = rng.random_range(0.9..1.1);
    let n = x.len() as i32;
    let f = rt.function(SRC, "scale")?;
    // SAFETY: the kernel touches `n` floats of `x` and `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut *y)
            .arg(&a)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    Ok(())
}

fn main() {}
