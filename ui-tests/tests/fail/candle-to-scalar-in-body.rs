#![allow(dead_code)]
// A candle tensor's single value read on the host inside the body (PyTorch's `.item()`).
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime};

/// Stands in for candle's `Tensor` and `Device`: the ui tests build without candle (its CUDA
/// kernels need nvcc at build time), and the checker sees the same tokens.
struct Tensor;
enum Device {
    Cpu,
}
impl Tensor {
    fn to_scalar<T: Default>(&self) -> Result<T, GraphError> {
        Ok(T::default())
    }
    fn to_vec1<T>(&self) -> Result<Vec<T>, GraphError> {
        Ok(Vec::new())
    }
    fn to_vec2<T>(&self) -> Result<Vec<Vec<T>>, GraphError> {
        Ok(Vec::new())
    }
    fn to_vec3<T>(&self) -> Result<Vec<Vec<Vec<T>>>, GraphError> {
        Ok(Vec::new())
    }
    fn to_device(&self, _device: &Device) -> Result<Tensor, GraphError> {
        Ok(Tensor)
    }
}
fn forward(_x: &CudaSlice<f32>) -> Result<Tensor, GraphError> {
    Ok(Tensor)
}

#[cuda_graph(warmup = 2)]
fn step(rt: &Runtime, x: &CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = rt;
    let logits = forward(x)?;
    let _loss: f32 = logits.to_scalar()?;
    Ok(())
}

fn main() {}
