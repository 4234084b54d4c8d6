// An island inside a fork's closure: the side branch runs beside the main one inside one
// segment of the graph, which a replay cannot stop for host code.
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

#[cuda_graph(warmup = 1)]
fn step(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: &mut CudaSlice<f32>,
    b: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.fork(|side| {
        side.memcpy(side.read(x), side.write(a))?;
        rt.eager(|| Ok(()))?;
        rt.stream().memcpy_dtod(x, &mut *b)?;
        Ok(())
    })
}

fn main() {}
