// Compiling and loading a module inside the body: again at every warmup run and at capture,
// and the graph keeps pointing into a module the body drops.
use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::cudarc::nvrtc::compile_ptx;
use graph_runtime::{cuda_graph, GraphError, Runtime};

const SRC: &str = "extern \"C\" __global__ void copy(const float *x, float *y, int n) { }";

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let ptx = compile_ptx(SRC).expect("the kernel compiles");
    let module = rt.context().load_module(ptx)?;
    let f = module.load_function("copy")?;
    let n = x.len() as i32;
    // SAFETY: the kernel copies `n` floats from `x` to `y`, which both hold `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut *y)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    Ok(())
}

fn main() {}
