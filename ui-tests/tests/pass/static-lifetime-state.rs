// State whose type names only the `'static` lifetime owns what it uses (candle-nn's
// `Func<'static>`, a model holding `&'static str` names): accepted, read-only and `&mut`.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, DeviceState, GraphError, Runtime};

#[derive(DeviceState)]
struct Func<'a> {
    w: CudaSlice<f32>,
    #[device_state(skip)]
    name: &'a str,
}

#[cuda_graph(warmup = 1)]
fn apply(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] net: &Func<'static>,
    #[state] scratch: &mut Func<'static>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, &mut scratch.w)?;
    rt.stream().memcpy_dtod(&net.w, y)?;
    let _ = (net.name, scratch.name);
    Ok(())
}

fn main() {}
