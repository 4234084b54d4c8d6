// Eager islands that compile: host reads, syncs and prints inside an island; host values of the
// body (a count, a kernel, a stream reference) used on both sides of an island and copied into
// its code; `#[island]` state of any `Clone` type; islands in a loop; a candle-style
// `Result<T>` alias; an island whose field names, methods and paths are named like a device
// buffer of the body (`sampled.scores`, `Sampled { scores: … }`), next to a range over a
// host value (`0..n`).
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[derive(Clone)]
struct Sampler {
    seed: u64,
}

#[cuda_graph(warmup = 1)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[island] sampler: &mut Sampler,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let n = x.len();
    let k = rt.function("extern \"C\" __global__ void k() {}", "k")?;
    s.memcpy_dtod(x, &mut *y)?;
    for turn in 0..2usize {
        rt.eager(move || {
            rt.stream().synchronize()?;
            let host = rt.stream().clone_dtoh(&y)?;
            println!("{} {} {}", host[0], n, turn);
            sampler.seed = sampler.seed.wrapping_mul(31).wrapping_add(turn as u64);
            rt.stream().memcpy_htod(&host, &mut y)?;
            let _ = w.len();
            Ok(())
        })?;
        s.memcpy_dtod(w, &mut *y)?;
    }
    let _ = (n, &k);
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>, w: &CudaSlice<f32>) -> Result<(), GraphError> {
    let mut sampler = Sampler { seed: 1 };
    let mut graph = StepGraph::capture(rt, x, w, &mut sampler, x.len())?;
    let _ = graph.replay(x)?;
    graph.state_mut().sampler.seed = 2;
    println!("{} islands, {} segments", graph.islands().len(), graph.segments().count());
    Ok(())
}

struct Sampled {
    scores: Vec<f32>,
}

#[cuda_graph(warmup = 1)]
fn fields_named_like_locals(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let scores = rt.stream().clone_dtod(x)?;
    let n = scores.len();
    rt.stream().memcpy_dtod(&scores, &mut *y)?;
    rt.eager(move || {
        let sampled = Sampled {
            scores: rt.stream().clone_dtoh(&y)?,
        };
        let best = (0..n).fold(0.0f32, |m, i| m.max(sampled.scores[i]));
        let _ = (best, std::f32::consts::PI, sampled.scores.len());
        Ok(())
    })?;
    Ok(())
}

fn main() {}
