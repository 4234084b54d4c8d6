//! Stand-ins for the `candle_core` items the candle cases use, with candle-core 0.11's names
//! and signatures (`Tensor`, `Device`, `Result`).
//!
//! The checks of `#[cuda_graph]` see a body's tokens, not its types: a case written against
//! these reads exactly like candle code and gets the same errors, without making the ui tests
//! depend on candle (whose CUDA build needs nvcc). Nothing here runs; the cases only compile,
//! so every method body is `unimplemented!()`.

use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{DeviceState, GraphError};

/// candle's `Result`, with the error type the cases' bodies return.
pub type Result<T> = std::result::Result<T, GraphError>;

/// candle's `Device`: the host, or a CUDA device (candle holds a `CudaDevice` there).
pub enum Device {
    /// The host.
    Cpu,
    /// A CUDA device, by ordinal.
    Cuda(usize),
}

/// candle's `Tensor`: values in device memory, with their device.
#[derive(DeviceState)]
pub struct Tensor {
    data: CudaSlice<f32>,
    #[device_state(skip)]
    device: Device,
}

/// candle's `Debug` for a tensor copies its values to the host to show them.
impl std::fmt::Debug for Tensor {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        unimplemented!("a stand-in for candle_core::Tensor's Debug, which reads the values")
    }
}

impl Tensor {
    /// The device the values live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The sum of all elements, as a tensor of rank 0 (on the tensor's device).
    pub fn sum_all(&self) -> Result<Tensor> {
        unimplemented!("a stand-in for candle_core::Tensor::sum_all")
    }

    /// The tensor flattened to one dimension (on the tensor's device).
    pub fn flatten_all(&self) -> Result<Tensor> {
        unimplemented!("a stand-in for candle_core::Tensor::flatten_all")
    }

    /// 1 where the element is at least `rhs`, else 0 (on the tensor's device).
    pub fn ge(&self, rhs: f64) -> Result<Tensor> {
        let _ = rhs;
        unimplemented!("a stand-in for candle_core::Tensor::ge")
    }

    /// Picks `on_true` where `self` is not 0, else `on_false` (on the tensor's device).
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let _ = (on_true, on_false);
        unimplemented!("a stand-in for candle_core::Tensor::where_cond")
    }

    /// Zeros shaped like `self` (on the tensor's device).
    pub fn zeros_like(&self) -> Result<Tensor> {
        unimplemented!("a stand-in for candle_core::Tensor::zeros_like")
    }

    /// The single value of a rank-0 tensor, copied to the host.
    pub fn to_scalar<S>(&self) -> Result<S> {
        unimplemented!("a stand-in for candle_core::Tensor::to_scalar")
    }

    /// The values of a rank-1 tensor, copied to the host.
    pub fn to_vec1<S>(&self) -> Result<Vec<S>> {
        unimplemented!("a stand-in for candle_core::Tensor::to_vec1")
    }

    /// The values of a rank-2 tensor, copied to the host.
    pub fn to_vec2<S>(&self) -> Result<Vec<Vec<S>>> {
        unimplemented!("a stand-in for candle_core::Tensor::to_vec2")
    }

    /// A copy on `device` (the same tensor when it is already there).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        let _ = device;
        unimplemented!("a stand-in for candle_core::Tensor::to_device")
    }
}
