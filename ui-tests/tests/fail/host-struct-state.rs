// A struct of host counters held as `&mut` state: `#[derive(DeviceState)]` says it holds no
// device memory (`DeviceState::HOST_ONLY`), so its updates would happen at capture only.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

#[derive(DeviceState)]
struct Progress {
    step: u64,
    #[device_state(skip)]
    label: String,
}

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] progress: &mut Progress,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    progress.step += 1;
    progress.label.clear();
    Ok(())
}

fn main() {}
