// The buffers a bucket family shares between its graphs are not reachable from outside.
use graph_runtime::buckets::Rows;

fn main() {
    let _ = std::mem::size_of::<Rows<'static, f32>>();
}
