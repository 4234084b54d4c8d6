// Correct code shaped like the mistakes of the rules no other case stands for: methods of
// your own types named like a legacy stream, capture control, a module load and a channel
// receive; a collection of the body's own (not a parameter) filled in the body; an
// immutable static read by value; another graph function called eagerly from the body
// (its work is recorded into this graph); a barrier and a buffer of your own named like
// NCCL's set-up.
// Look-alikes of: legacy-default-stream, capture-control, module-load-in-body, host-input, host-bookkeeping, host-static-state, nested-graph-capture, collective-setup-in-body
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

/// A scheduler of your own whose methods share names with CUDA's.
struct Plan {
    lanes: usize,
}

impl Plan {
    fn new(lanes: usize) -> Self {
        Plan { lanes }
    }
    fn default_stream(&self) -> usize {
        0
    }
    fn begin_capture(&self) -> usize {
        self.lanes
    }
    fn end_capture(&self) -> usize {
        self.lanes
    }
    fn load_module(&self, name: &str) -> usize {
        name.len()
    }
    fn recv(&self) -> Option<usize> {
        Some(self.lanes)
    }
    fn barrier(&self) -> usize {
        self.lanes
    }
    fn symmetric_buffer(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }
}

/// A fixed table, read by value (nothing is written).
static SCALES: [usize; 4] = [1, 1, 2, 2];

#[cuda_graph(warmup = 1)]
fn copy_once(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let plan = Plan::new(2);
    let lanes = plan.default_stream() + plan.begin_capture() + plan.end_capture();
    let _kernels = plan.load_module("copy") + plan.recv().unwrap_or(0);
    let _phase = plan.barrier() + plan.symmetric_buffer(4).len();
    // A list of the body's own, rebuilt by every run (a parameter would be the host's).
    let mut sizes = Vec::new();
    sizes.push(x.len());
    sizes.push(lanes);
    for _ in 0..SCALES[sizes.len()] {
        // Another graph function, called eagerly: its copy is recorded into this graph.
        copy_once(rt, x, y)?;
    }
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = StepGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
