//! `name = …` renames the generated types: a user's own `DecodeState` next to `fn decode`
//! does not collide with the graph's state view, which is now `DecodeStepState`.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

/// The user's own type, with the name `#[cuda_graph]` would give the state view by default.
#[allow(dead_code)]
pub struct DecodeState {
    pub position: usize,
}

#[cuda_graph(warmup = 2, name = DecodeStep)]
fn decode(
    rt: &Runtime,
    token: &CudaSlice<f32>,
    #[state] cache: &mut CudaSlice<f32>,
    logits: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let _ = cache;
    rt.stream().memcpy_dtod(token, logits)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, token: &CudaSlice<f32>, cache: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let mut graph: DecodeStepGraph<'_> = DecodeStepGraph::capture(rt, token, cache, 16)?;
    let out: DecodeStepOutputs<'_> = graph.replay(token)?;
    let _logits: &CudaSlice<f32> = out.logits;
    let _inputs: DecodeStepInputs<'_> = graph.inputs_mut();
    let _state: DecodeStepState<'_> = graph.state_mut();
    let mine = DecodeState { position: 0 };
    let _ = mine.position;
    Ok(())
}

fn main() {}
