// Module-level macros of yours in a body: one that queues GPU work, one that formats and
// asserts with the standard library's macros; and one that prints, in a body that opts into
// host effects. None of them prints through a bare `eprintln!` in a checked body.
// Look-alikes of: host-print
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

macro_rules! copy {
    ($rt:expr, $x:expr, $y:expr) => {
        $rt.stream().memcpy_dtod($x, $y)?
    };
}

macro_rules! checked_label {
    ($n:expr) => {{
        let label = format!("n = {}", $n);
        assert!(!label.is_empty(), "{}", label);
        debug_assert_eq!(label.len(), label.len());
        label
    }};
}

macro_rules! note {
    ($($t:tt)*) => {
        eprintln!($($t)*)
    };
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    copy!(rt, x, y);
    let _label = checked_label!(x.len());
    Ok(())
}

#[cuda_graph(warmup = 2, host_effects_not_replayed)]
fn noisy(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    copy!(rt, x, y);
    note!("copied {} floats", x.len());
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = StepGraph::capture(rt, x, x.len())?;
    let _ = NoisyGraph::capture(rt, x, x.len())?;
    Ok(())
}

fn main() {}
