//! The seam between the runtime and a framework whose device a runtime can be made from
//! (candle's, with `Runtime::from_candle`): what the capture procedure asks of it. Each
//! framework implements [`Framework`] in its own folder and hands it to the runtimes it makes
//! (which register its error conversion, `Framework::errors`); nothing else in the runtime
//! names a framework.

use std::any::Any;

use crate::error::{FrameworkErrors, GraphError};

/// What a framework provides to the runtimes made from its devices.
/// Its module reaches its own type back through `Any` (candle: `Runtime::candle_device`).
pub(crate) trait Framework: Any + Send + Sync {
    /// Held from the first warmup run to the end of the capture, then dropped: what the
    /// framework must keep while a graph is recorded (candle: its cache of small uploads,
    /// filled by the warmup and read by the capture).
    fn hold_during_capture(&self) -> Box<dyn Any>;

    /// The framework's name and how its errors become [`GraphError`]s (registered with the
    /// error layer when a runtime is made with this framework).
    fn errors(&self) -> (&'static str, FrameworkErrors);

    /// A capture's error in the framework's terms, where the framework explains a CUDA error
    /// (candle: CUDA's invalid value is a tensor made before the capture and freed in it).
    fn explain_capture_error(&self, graph: &'static str, e: GraphError) -> GraphError;
}
