// `replays_as_captured!` says that a statement does on every replay what it did at capture.
// A synchronize, a device-to-host read and a query of the runtime's stream never do: inside
// the opt-out they are still errors, while a method of the user's own (`jobs.synchronize()`)
// is taken at its word.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, replays_as_captured, GraphError, Runtime};

struct Jobs;

impl Jobs {
    fn synchronize(&self) {}
}

#[cuda_graph(warmup = 2)]
fn hides(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let jobs = Jobs;
    replays_as_captured! { jobs.synchronize(); }
    replays_as_captured! { rt.stream().synchronize()?; }
    let s = rt.stream();
    replays_as_captured! { let _host = s.clone_dtoh(x)?; }
    Ok(())
}

fn main() {}
