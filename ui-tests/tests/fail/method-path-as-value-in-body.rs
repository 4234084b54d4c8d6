// A method of a cudarc or runtime type passed as a value (to an iterator, or bound to a
// local and called) runs in the body like the call written on the type: still a sync or a
// query.
use graph_runtime::cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] streams: &Vec<CudaStream>,
    #[state] events: &Vec<CudaEvent>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    streams.iter().try_for_each(CudaStream::synchronize)?;
    let ready = events.iter().all(CudaEvent::is_complete);
    let wait = CudaStream::synchronize;
    if ready {
        wait(rt.stream())?;
    }
    let settle = Runtime::synchronize;
    settle(rt)?;
    Ok(())
}

fn main() {}
