// `#[derive(DeviceState)]` on the shapes a model takes: nested structs, vectors of layers,
// generic parameters, enums, tuple structs, skipped host fields.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, Generator, GraphError, Runtime};

#[derive(DeviceState)]
struct Layer<T> {
    w: CudaSlice<T>,
    b: Option<CudaSlice<T>>,
}

#[derive(DeviceState)]
struct Model {
    layers: Vec<Layer<f32>>,
    embed: [CudaSlice<f32>; 2],
    rng: Generator,
    norm: Norm,
    #[device_state(skip)]
    handle: std::collections::HashMap<String, u32>,
    eps: f32,
}

#[derive(DeviceState)]
struct Norm(CudaSlice<f32>, #[device_state(skip)] &'static str);

#[derive(DeviceState)]
enum Cache {
    Empty,
    Filled { kv: CudaSlice<f32>, len: usize },
    Paged(Vec<CudaSlice<f32>>),
}

#[cuda_graph(warmup = 1)]
fn forward(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] model: &Model,
    #[state] cache: &mut Cache,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, y)?;
    let _ = (&model.layers, &model.embed, &model.handle, model.eps, &model.norm.1);
    if let Cache::Filled { kv, len } = cache {
        let _ = len;
        rt.stream().memcpy_dtod(x, kv)?;
    }
    model.rng.uniform(rt, y, 0.0, 1.0)?;
    Ok(())
}

#[allow(dead_code)]
fn use_it(rt: &Runtime, x: &CudaSlice<f32>, model: &Model, cache: &mut Cache) -> Result<(), GraphError> {
    let mut graph = ForwardGraph::capture(rt, x, model, cache, x.len())?;
    let st = graph.state_mut();
    let _: &Model = st.model;
    let _: &mut Cache = st.cache;
    graph.replay(x)?;
    Ok(())
}

fn main() {
    let _ = Cache::Empty;
    let _ = Cache::Paged(Vec::new());
}
