// Names that only look like the capture checks' names: locals called `rng`, `random`,
// `stdout`, `sleep`, `query`, methods of your own, host values formatted (not printed).
// Look-alikes of: cpu-randomness, host-sleep, host-io
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

struct Schedule {
    steps: usize,
}

impl Schedule {
    fn queue_len(&self) -> usize {
        self.steps
    }
}

#[cuda_graph(warmup = 2)]
fn lookalikes(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] schedule: usize,
) -> Result<(), GraphError> {
    let rng = schedule % 7;
    let random = rng + 1;
    let stdout = random * 2;
    let sleep = stdout + 1;
    let query = Schedule { steps: sleep }.queue_len();
    let label = format!("{query} steps over {} floats", x.len());
    if label.is_empty() || x.len() != y.len() {
        return Err(GraphError::User(label.into()));
    }
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = LookalikesGraph::capture(rt, x, x.len(), 3)?;
    Ok(())
}

fn main() {}
