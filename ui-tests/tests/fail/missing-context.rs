// No execution context: the graph has nowhere to pass its runtime.
use graph_runtime::{cuda_graph, GraphError};

#[cuda_graph(warmup = 2)]
fn step() -> Result<(), GraphError> {
    Ok(())
}

fn main() {}
