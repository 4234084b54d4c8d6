// A graph whose body issues collectives borrows its communicator: dropping the communicator
// while the graph lives (NCCL >= 2.26 would wait forever in the next replay) does not compile.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::nccl::{Communicator, ReduceOp};
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph]
fn reduce(
    _rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, y, ReduceOp::Sum)
}

fn serve(rt: &Runtime, x: &CudaSlice<f32>, comm: Communicator) -> Result<(), GraphError> {
    let mut graph = comm.capture(|| ReduceGraph::capture(rt, x, &comm, x.len()))?;
    drop(comm);
    graph.replay(x)?;
    Ok(())
}

fn main() {}
