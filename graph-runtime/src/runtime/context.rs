//! [`FromRuntime`]: what a body's first parameter may borrow out of the runtime. candle's
//! `Device` and `CudaDevice` implement it in `crate::candle`, behind the `candle` feature.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::GraphError;
use crate::runtime::Runtime;

/// Types the first parameter of a `#[cuda_graph]` function may borrow: what the body uses to
/// reach the GPU. The graph passes the runtime's own objects, so the body's work lands on
/// the capture stream.
///
/// Support for the code `#[cuda_graph]` generates: not for direct use.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "the first parameter of a `#[cuda_graph]` function must borrow the execution context, not `{Self}`",
    label = "expected `&Runtime`, `&Arc<CudaStream>`, `&CudaStream`, or candle's `&Device` (feature `candle`)",
    note = "the graph passes its runtime (or the runtime's stream) here during warmup and capture"
)]
pub trait FromRuntime {
    /// Borrows `Self` out of the runtime.
    fn from_runtime(rt: &Runtime) -> &Self;

    /// [`FromRuntime::from_runtime`] for contexts a runtime may lack (candle's `Device` on a
    /// runtime not made from one): what the generated code calls.
    fn try_from_runtime(rt: &Runtime) -> Result<&Self, GraphError> {
        Ok(Self::from_runtime(rt))
    }
}

impl FromRuntime for Runtime {
    fn from_runtime(rt: &Runtime) -> &Self {
        rt
    }
}

impl FromRuntime for Arc<CudaStream> {
    fn from_runtime(rt: &Runtime) -> &Self {
        rt.stream()
    }
}

impl FromRuntime for CudaStream {
    fn from_runtime(rt: &Runtime) -> &Self {
        rt.stream()
    }
}
