// Methods of your own types that share a name with a CUDA operation (`synchronize`,
// `query`): the receiver is declared (or built) as your type, so the method is yours.
// Look-alikes of: host-sync, stream-or-event-query
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

/// Host-side step bookkeeping of your own.
struct Schedule {
    steps: usize,
}

impl Schedule {
    fn new(steps: usize) -> Self {
        Schedule { steps }
    }

    fn synchronize(&mut self) -> usize {
        self.steps
    }
}

/// A lookup table of your own (host data: as `#[state]` it says so with `DeviceState`).
#[derive(DeviceState)]
struct Lookup {
    table: Vec<usize>,
}

impl Lookup {
    fn query(&self, key: usize) -> Option<usize> {
        self.table.get(key).copied()
    }
}

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] lookup: &Lookup,
) -> Result<(), GraphError> {
    let mut schedule = Schedule::new(3);
    let repeats = schedule.synchronize() + lookup.query(0).unwrap_or(0);
    for _ in 0..repeats {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let lookup = Lookup { table: vec![1, 2] };
    let _ = StepGraph::capture(rt, x, x.len(), &lookup)?;
    Ok(())
}

fn main() {}
