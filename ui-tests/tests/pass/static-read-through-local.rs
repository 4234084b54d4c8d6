// Statics only read through a local reference stay legal, as reading them is: a table, a
// cache looked up under its lock.
// Look-alikes of: host-static-state
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

static TABLE: [usize; 3] = [1, 2, 3];
static KERNELS: LazyLock<Mutex<HashMap<&'static str, usize>>> =
    LazyLock::new(|| Mutex::new(HashMap::from([("copy", 2)])));

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let table = &TABLE;
    let k = &KERNELS;
    let repeats = table[0] + k.lock().unwrap().get("copy").copied().unwrap_or(1);
    for _ in 0..repeats {
        rt.stream().memcpy_dtod(x, y)?;
    }
    Ok(())
}

fn main() {}
