// A copy of a static is the body's own value: writing into `DEFAULTS.clone()` or
// `TABLE.clone()` changes the copy, not the static; and an iterator's `take` over a static
// only read (`CONFIG.layers.iter().take(2)`, through a local or not) is not a cell's `take`.
// Look-alikes of: host-static-state
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::sync::{Arc, LazyLock};

#[derive(Clone)]
struct Settings {
    batch: usize,
    layers: Vec<usize>,
}

static DEFAULTS: LazyLock<Settings> = LazyLock::new(|| Settings {
    batch: 1,
    layers: vec![1, 2, 3],
});
static CONFIG: LazyLock<Arc<Settings>> = LazyLock::new(|| Arc::new(DEFAULTS.clone()));
static TABLE: [usize; 3] = [1, 2, 3];

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let mut settings = DEFAULTS.clone();
    settings.batch = 8;
    let mut row = TABLE;
    row[0] = 4;
    let mut copy = TABLE.clone();
    copy[1] = 5;
    let cfg = Arc::clone(&CONFIG);
    let first: usize = cfg.layers.iter().take(2).sum();
    let t = &TABLE;
    let head: usize = t.iter().take(2).sum();
    let direct: usize = TABLE.iter().take(1).sum();
    for _ in 0..(settings.batch + row[0] + copy[1] + first + head + direct) % 3 {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

fn main() {}
