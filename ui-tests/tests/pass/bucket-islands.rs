// Eager islands in a bucket family: the island sees the bucket's rows of the outputs and the
// batch, `#[island]` state is lent back between replays through the family's state view.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[derive(Clone)]
struct Counter {
    seen: usize,
}

#[cuda_graph(warmup = 1, buckets(batch = [2, 4], fallback = "eager"))]
fn count_rows(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[island] counter: &mut Counter,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, &mut *y)?;
    rt.eager(|| {
        let mut host = rt.stream().clone_dtoh(&y)?;
        counter.seen += batch;
        for v in &mut host {
            *v += w.len() as f32;
        }
        rt.stream().memcpy_htod(&host, &mut y)?;
        Ok(())
    })?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, w: &CudaSlice<f32>) -> Result<usize, GraphError> {
    let mut counter = Counter { seen: 0 };
    let mut family = CountRowsBuckets::capture(rt, 16, w, &mut counter, 16)?;
    let _ = family.replay(&vec![0.0f32; 3 * 16])?.y.len();
    let seen = family.state_mut().counter.seen;
    println!("{family}");
    Ok(seen)
}

fn main() {}
