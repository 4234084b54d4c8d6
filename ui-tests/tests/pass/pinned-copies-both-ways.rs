// A pinned host buffer that outlives the graph, held as `#[state]`: copies into it and out
// of it inside the body are recorded into the graph, and every replay repeats them.
// Look-alikes of: device-to-host, pinned-host-read
use graph_runtime::cudarc::driver::{CudaSlice, PinnedHostSlice};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn roundtrip(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] staging: &mut PinnedHostSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtoh(x, staging)?;
    rt.stream().memcpy_htod(staging, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    // SAFETY: the body writes the buffer before reading it.
    let mut staging = unsafe { rt.context().alloc_pinned::<f32>(x.len()) }?;
    let mut graph = RoundtripGraph::capture(rt, x, &mut staging, x.len())?;
    let _ = graph.replay(x)?;
    Ok(())
}

fn main() {}
