// NCCL set-up inside a captured body: a group, a communicator from the launcher's
// environment, a symmetric buffer and a host barrier are made or met before the capture.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph]
fn reduce(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let _ = rt;
    let _group = CommGroup::new(2)?;
    let _own = Communicator::from_env()?;
    let _window = comm.symmetric_buffer::<f32>(1024)?;
    comm.barrier()?;
    comm.all_reduce(x, y, ReduceOp::Sum)
}

fn main() {}
