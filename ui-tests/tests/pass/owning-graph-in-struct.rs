// A graph that owns or shares its state has no borrowed lifetime left (`FooGraph<'static>`),
// so it can live in an engine struct next to the model it was captured from.
use std::sync::Arc;

use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

#[derive(DeviceState)]
struct Weights {
    w: CudaSlice<f32>,
    dim: usize,
}

#[derive(DeviceState)]
struct Cache {
    kv: CudaSlice<f32>,
    #[device_state(skip)]
    _name: std::path::PathBuf,
}

#[cuda_graph(warmup = 2)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] weights: &Weights,
    #[state] cache: &mut Cache,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let _ = weights.dim;
    rt.stream().memcpy_dtod(x, &mut cache.kv)?;
    rt.stream().memcpy_dtod(&weights.w, y)?;
    Ok(())
}

struct Engine {
    rt: Runtime,
    weights: Arc<Weights>,
    graph: StepGraph<'static>,
}

impl Engine {
    #[allow(dead_code)]
    fn new(rt: &Runtime, dim: usize) -> Result<Self, GraphError> {
        let weights = Arc::new(Weights {
            w: rt.stream().alloc_zeros::<f32>(dim)?,
            dim,
        });
        let cache = Cache {
            kv: rt.stream().alloc_zeros::<f32>(dim)?,
            _name: "kv".into(),
        };
        let x = rt.stream().alloc_zeros::<f32>(dim)?;
        let graph = StepGraph::capture(rt, &x, weights.clone(), cache, dim)?;
        Ok(Engine {
            rt: rt.clone(),
            weights,
            graph,
        })
    }

    #[allow(dead_code)]
    fn run(&mut self, x: &[f32]) -> Result<Vec<f32>, GraphError> {
        let out = self.graph.replay(x)?;
        Ok(self.rt.stream().clone_dtoh(out.y)?)
    }
}

#[allow(dead_code)]
fn keep_runtime_alive(rt: Runtime, x: &[f32]) -> Result<(), GraphError> {
    let mut engine = Engine::new(&rt, x.len())?;
    drop(rt); // the engine's graph keeps the runtime alive
    let _ = engine.run(x)?;
    let _ = engine.weights.dim;
    Ok(())
}

fn main() {}
