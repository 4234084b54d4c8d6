//! How other errors become a [`GraphError`]: cudarc's driver and cuBLAS errors, a captured
//! body's boxed error, candle's errors; and the methods that classify a [`GraphError`]
//! (out of memory, capture code) or re-read it in the terms of a capture.

use cudarc::cublas::result::CublasError;
use cudarc::driver::{sys::CUresult, DriverError};

#[cfg(feature = "nccl")]
use super::collective::CollectiveError;
use super::variants::{BoxError, GraphError};

impl From<DriverError> for GraphError {
    fn from(e: DriverError) -> Self {
        match e.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => GraphError::OutOfMemory {
                during: "running a CUDA call".to_owned(),
                requested_bytes: None,
                free_bytes: None,
            },
            _ => GraphError::Driver(e),
        }
    }
}

impl From<CublasError> for GraphError {
    fn from(e: CublasError) -> Self {
        GraphError::Cublas(e)
    }
}

impl GraphError {
    /// The error inside a warmup, body, conditional-body or bucket error: every question
    /// below (out of memory? which capture code? which collective?) is asked of it too.
    fn wrapped(&self) -> Option<&GraphError> {
        match self {
            GraphError::Warmup { source, .. }
            | GraphError::Body { source, .. }
            | GraphError::ConditionalBody { source, .. }
            | GraphError::Island { source, .. }
            | GraphError::Bucket { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Whether this is an out-of-memory error (also inside a warmup, body, conditional-body
    /// or bucket error).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            GraphError::OutOfMemory { .. } => true,
            other => other.wrapped().is_some_and(GraphError::is_out_of_memory),
        }
    }

    /// The size an out-of-memory error asked for, where it is known (also inside a
    /// warmup, body, conditional-body or bucket error).
    pub fn requested_bytes(&self) -> Option<usize> {
        match self {
            GraphError::OutOfMemory {
                requested_bytes, ..
            } => *requested_bytes,
            other => other.wrapped()?.requested_bytes(),
        }
    }

    /// The CUDA capture error code this error stands for (900–908), if it is one.
    pub fn capture_code(&self) -> Option<u32> {
        Some(match self {
            GraphError::CaptureUnsupported { .. } => 900,
            GraphError::CaptureInvalidated { .. } => 901,
            GraphError::CaptureMerge { .. } => 902,
            GraphError::CaptureUnmatched { .. } => 903,
            GraphError::CaptureUnjoined { .. } => 904,
            GraphError::CaptureIsolation { .. } => 905,
            GraphError::CaptureImplicit { .. } => 906,
            GraphError::CapturedEvent { .. } => 907,
            GraphError::CaptureWrongThread { .. } => 908,
            GraphError::SyncInCapture { .. } | GraphError::SideStreamInCapture { .. } => 900,
            other => return other.wrapped()?.capture_code(),
        })
    }

    /// Maps a driver error seen while capturing `graph` to its variant.
    ///
    /// Capture codes 900–908 get their own variants; any other code stays
    /// [`GraphError::Driver`] (or [`GraphError::OutOfMemory`]).
    pub fn from_driver(graph: &'static str, e: DriverError) -> Self {
        match e.0 {
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => {
                GraphError::CaptureUnsupported { graph }
            }
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => {
                GraphError::CaptureInvalidated { graph }
            }
            CUresult::CUDA_ERROR_STREAM_CAPTURE_MERGE => GraphError::CaptureMerge { graph },
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => GraphError::CaptureUnmatched { graph },
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED => GraphError::CaptureUnjoined { graph },
            CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION => GraphError::CaptureIsolation { graph },
            CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => GraphError::CaptureImplicit { graph },
            CUresult::CUDA_ERROR_CAPTURED_EVENT => GraphError::CapturedEvent { graph },
            CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => {
                GraphError::CaptureWrongThread { graph }
            }
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => GraphError::OutOfMemory {
                during: format!("capturing `{graph}`"),
                requested_bytes: None,
                free_bytes: None,
            },
            _ => GraphError::Driver(e),
        }
    }

    /// Re-reads an error that came out of a captured body: driver errors with a capture code
    /// become their capture variant (naming `graph`), anything else is wrapped in
    /// [`GraphError::Body`].
    pub(crate) fn in_capture(graph: &'static str, e: GraphError) -> Self {
        match e {
            GraphError::Driver(d) => match GraphError::from_driver(graph, d) {
                GraphError::Driver(d) => GraphError::Body {
                    graph,
                    source: Box::new(GraphError::Driver(d)),
                },
                mapped => mapped,
            },
            GraphError::OutOfMemory {
                requested_bytes,
                free_bytes,
                ..
            } => GraphError::OutOfMemory {
                during: format!("capturing `{graph}`"),
                requested_bytes,
                free_bytes,
            },
            e if e.capture_code().is_some() => e,
            // Already about this capture, in the user's terms: pass them through unwrapped.
            e @ (GraphError::NestedCapture { .. }
            | GraphError::EmptyGraph { .. }
            | GraphError::PageableCopyCaptured { .. }
            | GraphError::RngHostStateInCapture { .. }
            | GraphError::GeneratorInCapture { .. }
            | GraphError::ConditionalUnsupported { .. }
            | GraphError::ForbiddenInConditional { .. }
            | GraphError::ConditionalBody { .. }
            | GraphError::ConditionMisuse { .. }
            | GraphError::IslandMisuse { .. }
            | GraphError::UnusedCondition { .. }) => e,
            other => GraphError::Body {
                graph,
                source: Box::new(other),
            },
        }
    }
}

pub(super) fn into_graph_error(e: BoxError) -> GraphError {
    let e = match e.downcast::<GraphError>() {
        Ok(g) => return *g,
        Err(e) => e,
    };
    #[cfg(feature = "candle")]
    let e = match e.downcast::<candle_core::Error>() {
        Ok(c) => return from_candle(*c),
        Err(e) => e,
    };
    let e = match e.downcast::<DriverError>() {
        Ok(d) => return GraphError::from(*d),
        Err(e) => e,
    };
    match e.downcast::<CublasError>() {
        Ok(c) => GraphError::from(*c),
        Err(e) => GraphError::User(e),
    }
}

/// A candle error as a [`GraphError`]: the CUDA or cuBLAS error it carries, typed as a cudarc
/// body's would be, or candle's own error in the user's terms (`error/candle.rs`).
#[cfg(feature = "candle")]
pub(crate) fn from_candle(e: candle_core::Error) -> GraphError {
    match cuda_error_of(&e) {
        Some(typed) => typed,
        None => super::candle::from_candle_own(e),
    }
}

/// The CUDA or cuBLAS error a candle error carries, typed as a cudarc body's would be.
#[cfg(feature = "candle")]
fn cuda_error_of(e: &candle_core::Error) -> Option<GraphError> {
    use candle_core::cuda_backend::CudaError;
    let mut cur = e;
    loop {
        match cur {
            candle_core::Error::Context { inner, .. }
            | candle_core::Error::WithPath { inner, .. }
            | candle_core::Error::WithBacktrace { inner, .. } => cur = inner,
            candle_core::Error::Cuda(inner) => {
                let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&**inner);
                while let Some(err) = source {
                    if let Some(d) = err.downcast_ref::<cudarc::driver::DriverError>() {
                        return Some(GraphError::Driver(*d));
                    }
                    match err.downcast_ref::<CudaError>() {
                        Some(CudaError::Cuda(d)) => return Some(GraphError::Driver(*d)),
                        Some(CudaError::Cublas(c)) => return Some(GraphError::Cublas(*c)),
                        _ => {}
                    }
                    source = err.source();
                }
                return None;
            }
            _ => return None,
        }
    }
}

#[cfg(feature = "nccl")]
impl From<CollectiveError> for GraphError {
    fn from(e: CollectiveError) -> Self {
        GraphError::Collective(Box::new(e))
    }
}

#[cfg(feature = "nccl")]
impl GraphError {
    /// The collective error in this error, also when it is wrapped in a warmup, body,
    /// conditional-body or bucket error.
    pub fn collective(&self) -> Option<&CollectiveError> {
        match self {
            GraphError::Collective(c) => Some(c),
            other => other.wrapped()?.collective(),
        }
    }
}
