// rand 0.9's names for CPU draws (`random`, `sample`, `choose`): frozen into the graph.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};
use rand::distr::StandardUniform;
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

#[cuda_graph(warmup = 2)]
fn jitter(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let mut rng = SmallRng::seed_from_u64(7);
    let scale: f32 = rng.random();
    let shift: f32 = rng.sample(StandardUniform);
    let lane = [0usize, 1, 2, 3].choose(&mut rng).copied();
    let _ = (scale, shift, lane);
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

fn main() {}
