// Methods passed as values that are not CUDA operations: methods of your own types named
// like one (`Job::query`, `Job::synchronize`), and cudarc's methods that read nothing from
// the device (`CudaSlice::len`).
// Look-alikes of: host-sync, stream-or-event-query
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

/// A host-side work item of your own.
#[derive(DeviceState, Clone, Copy)]
struct Job {
    id: usize,
}

impl Job {
    fn query(&self) -> usize {
        self.id
    }

    fn synchronize(&self) -> bool {
        self.id > 0
    }
}

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] jobs: &Vec<Job>,
) -> Result<(), GraphError> {
    let total: usize = jobs.iter().map(Job::query).sum();
    let ready = jobs.iter().all(Job::synchronize);
    let lengths: Vec<usize> = [x].into_iter().map(CudaSlice::len).collect();
    if ready && total >= lengths.len() {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

fn main() {}
