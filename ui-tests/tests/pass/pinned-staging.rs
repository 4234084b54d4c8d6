// A pinned host buffer that outlives the graph, declared as state: copying from it inside
// the body is the legal host-to-device copy (every replay re-reads it).
// Look-alikes of: host-to-device, pinned-host-alloc
use graph_runtime::cudarc::driver::{CudaSlice, PinnedHostSlice};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn upload(
    rt: &Runtime,
    #[state] staging: &mut PinnedHostSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_htod(staging, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime) -> Result<(), GraphError> {
    // SAFETY: the buffer is filled below before any copy reads it.
    let mut staging = unsafe { rt.context().alloc_pinned::<f32>(256) }?;
    staging.as_mut_slice()?.fill(1.0); // outside the body: fine
    let mut graph = UploadGraph::capture(rt, &mut staging, 256)?;
    let out = graph.launch()?;
    let _y = rt.stream().clone_dtoh(out.y)?;
    Ok(())
}

fn main() {}
