// A `static` reached through a local that refers to it (a reference, a clone, a guard) is
// still the static: replays neither advance it nor read it.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

static STEP: AtomicU64 = AtomicU64::new(0);
static STATE: Mutex<u64> = Mutex::new(0);
static SHARED: LazyLock<Arc<AtomicU64>> = LazyLock::new(|| Arc::new(AtomicU64::new(0)));
thread_local! {
    static COUNTER: Cell<u64> = const { Cell::new(0) };
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let step = &STEP;
    step.fetch_add(1, Ordering::Relaxed);
    let s = &STATE;
    *s.lock().unwrap() += 1;
    let c = &COUNTER;
    c.set(c.get() + 1);
    let shared = Arc::clone(&SHARED);
    shared.store(7, Ordering::Relaxed);
    Ok(())
}

fn main() {}
