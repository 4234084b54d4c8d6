// The attribute on something that is not a function.
use graph_runtime::cuda_graph;

#[cuda_graph(warmup = 2)]
struct Step;

fn main() {}
