// Parallel branches through the runtime's scoped fork/join: the side stream is made before
// the capture and always rejoins it. Also with a stream as the context (`fork_join`).
// Look-alikes of: stream-created-in-body
use std::sync::Arc;

use graph_runtime::cudarc::driver::{CudaSlice, CudaStream};
use graph_runtime::{cuda_graph, fork_join, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn two_branches(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    b: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|side| {
        side.memcpy(side.read(x), side.write(a))?; // side branch, borrowed until the join
        rt.stream().memcpy_dtod(x, b)?; // concurrently, on the runtime's stream
        Ok(())
    })?;
    // After the fork both copies are done, in stream order.
    rt.stream().memcpy_dtod(&*a, b)?;
    Ok(())
}

#[cuda_graph(warmup = 2)]
fn on_a_stream(
    stream: &Arc<CudaStream>,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = fork_join(stream, |side| {
        let scratch = side.scratch::<f32>(x.len())?; // freed on the side stream before the join
        side.memcpy(side.read(x), scratch)?;
        Ok(x.len())
    })?;
    assert_eq!(n, y.len());
    stream.memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut graph = TwoBranchesGraph::capture(rt, x, x.len(), x.len())?;
    let out = graph.replay(x)?;
    let _ = (out.a, out.b);
    let _ = OnAStreamGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
