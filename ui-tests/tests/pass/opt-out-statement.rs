// The per-statement opt-out: `replays_as_captured!` is your word that a statement does on
// every replay what it did at capture, for code of yours named like what the checks reject.
// Look-alikes of: thread-spawned-in-body, cpu-randomness
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, replays_as_captured, GraphError, Runtime};

/// Fills a table of your own deterministically (named like `getrandom::fill`).
fn fill(table: &mut [u32]) {
    for (i, v) in table.iter_mut().enumerate() {
        *v = i as u32;
    }
}

struct Tasks;

impl Tasks {
    /// Runs the closure now, on this thread (named like a thread spawn).
    fn spawn<R>(&self, f: impl FnOnce() -> R) -> R {
        f()
    }
}

fn tasks() -> Tasks {
    Tasks
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let mut table = [0u32; 4];
    replays_as_captured! { fill(&mut table); }
    let n = graph_runtime::replays_as_captured!(tasks().spawn(|| x.len()));
    if n > table.len() {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = StepGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
