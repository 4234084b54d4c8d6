// A type of your own built around a CUDA value (an event, a stream) is not provably yours:
// its `is_complete` and `synchronize` may be the event's and the stream's (a spin that never
// ends while capturing, error 900).
use graph_runtime::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DriverError};
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::sync::Arc;

/// A fence of your own around an event.
struct Fence(CudaEvent);

impl From<CudaEvent> for Fence {
    fn from(event: CudaEvent) -> Self {
        Fence(event)
    }
}

impl Fence {
    fn is_complete(&self) -> bool {
        self.0.is_complete()
    }
}

/// A handle of your own around a stream.
struct Gpu {
    stream: Arc<CudaStream>,
}

impl Gpu {
    fn new(stream: Arc<CudaStream>) -> Self {
        Gpu { stream }
    }

    fn synchronize(&self) -> Result<(), DriverError> {
        self.stream.synchronize()
    }
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let event = rt.stream().record_event(None)?;
    let fence = Fence::from(event);
    while !fence.is_complete() {}
    let gpu = Gpu::new(rt.stream().clone());
    gpu.synchronize()?;
    let lane = Gpu {
        stream: rt.stream().clone(),
    };
    lane.synchronize()?;
    Ok(())
}

fn main() {}
