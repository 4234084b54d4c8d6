// With `host_effects_not_replayed`, printing, logging and reading the clock are allowed:
// they run during warmup and capture, never on replay, and the attribute says so.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, phase, GraphError, Runtime};

#[cuda_graph(warmup = 2, host_effects_not_replayed)]
fn traced(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let started = std::time::Instant::now();
    println!("{:?}: copying {} floats", phase(), x.len());
    tracing::debug!(n = y.len(), "queued");
    rt.stream().memcpy_dtod(x, y)?;
    eprintln!("queued in {:?}", started.elapsed());
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut graph = TracedGraph::capture(rt, x, x.len())?; // prints 3 times
    let _ = graph.replay(x)?; // prints nothing
    Ok(())
}

fn main() {}
