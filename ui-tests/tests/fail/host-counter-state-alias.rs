// A step counter held as `&mut` state under a type alias: the macro cannot see through the
// alias, the type can (`DeviceState::HOST_ONLY`), and the error points at the parameter.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

type Step = u64;

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] step: &mut Step,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    *step += 1;
    Ok(())
}

fn main() {}
