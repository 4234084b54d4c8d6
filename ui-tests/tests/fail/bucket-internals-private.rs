// The buffers a bucket family shares between its graphs are not reachable from outside.
use graph_runtime::buckets::BatchedSlot;

fn main() {
    let _ = std::mem::size_of::<BatchedSlot<f32>>();
}
