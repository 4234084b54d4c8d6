// A pinned buffer held in a field of a state struct of yours: copying into it and out of it
// inside the body is recorded and replayed (the runtime would refuse a pageable field at
// capture). A macro of yours whose name only contains a logging word (`catalog!`) is not a log.
// Look-alikes of: pinned-host-read, host-log
use graph_runtime::cudarc::driver::{CudaSlice, PinnedHostSlice};
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

#[derive(DeviceState)]
struct Stage {
    host: PinnedHostSlice<f32>,
}

macro_rules! catalog {
    ($n:expr) => {
        $n + 1
    };
}

#[cuda_graph(warmup = 2)]
fn roundtrip(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] stage: &mut Stage,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtoh(x, &mut stage.host)?;
    rt.stream().memcpy_htod(&stage.host, y)?;
    let _entries = catalog!(x.len());
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    // SAFETY: the body writes the buffer before reading it.
    let host = unsafe { rt.context().alloc_pinned::<f32>(x.len()) }?;
    let mut stage = Stage { host };
    let mut graph = RoundtripGraph::capture(rt, x, &mut stage, x.len())?;
    let _ = graph.replay(x)?;
    Ok(())
}

fn main() {}
