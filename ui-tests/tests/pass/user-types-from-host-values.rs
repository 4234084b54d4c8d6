// Types of your own built from host values (a number, a constant of the body, a length)
// keep their methods named like CUDA operations: `Timer::new(5)`, `Job::from(id)`.
// Look-alikes of: host-sync, stream-or-event-query
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

/// A countdown of your own.
struct Timer {
    left: u32,
}

impl Timer {
    fn new(left: u32) -> Self {
        Timer { left }
    }

    fn is_complete(&self) -> bool {
        self.left == 0
    }

    fn synchronize(&mut self) -> u32 {
        self.left = self.left.saturating_sub(1);
        self.left
    }
}

/// A job id of your own.
struct Job {
    id: u32,
}

impl From<u32> for Job {
    fn from(id: u32) -> Self {
        Job { id }
    }
}

impl Job {
    fn query(&self) -> u32 {
        self.id * 2
    }
}

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] id: u32,
) -> Result<(), GraphError> {
    let mut timer = Timer::new(5);
    let job = Job::from(id);
    let sized = Timer::new(x.len() as u32);
    let rounds = Timer { left: job.query() };
    while !timer.is_complete() && !sized.is_complete() && !rounds.is_complete() {
        timer.synchronize();
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

fn main() {}
