// Generic helpers declared in the body that do host arithmetic, and a type of your own
// declared there whose methods share names with CUDA operations, compile.
// Look-alikes of: host-sync, stream-or-event-query
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    fn total<T: Into<u64> + Copy>(xs: &[T]) -> u64 {
        xs.iter().map(|&v| v.into()).sum()
    }
    struct Plan {
        rounds: u64,
    }
    impl Plan {
        fn query(&self) -> u64 {
            self.rounds
        }
        fn synchronize(&self) -> u64 {
            self.query() * 2
        }
    }
    let plan = Plan {
        rounds: total(&[1u32, 2]),
    };
    for _ in 0..plan.synchronize() {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

fn main() {}
