//! How other errors become a [`GraphError`]: cudarc's driver and cuBLAS errors, a captured
//! body's boxed error, a framework's errors (as the framework registered); and the methods that classify a [`GraphError`]
//! (out of memory, capture code) or re-read it in the terms of a capture.

use std::sync::Mutex;

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
            _ if loses_the_context(e.0) => GraphError::ContextLost(e),
            _ => GraphError::Driver(e),
        }
    }
}

/// Whether CUDA reports `code` for a kernel that faulted: the context is then unusable, and
/// every later call returns the same code (CUDA's "sticky" errors).
pub(crate) fn loses_the_context(code: CUresult) -> bool {
    matches!(
        code,
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
            | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
            | CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUresult::CUDA_ERROR_INVALID_PC
            | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUresult::CUDA_ERROR_ASSERT
            | CUresult::CUDA_ERROR_LAUNCH_FAILED
            | CUresult::CUDA_ERROR_LAUNCH_TIMEOUT
            | CUresult::CUDA_ERROR_EXTERNAL_DEVICE
    )
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
            _ => GraphError::from(e),
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
            | GraphError::UnusedCondition { .. }
            | GraphError::ContextLost(_)) => e,
            other => GraphError::Body {
                graph,
                source: Box::new(other),
            },
        }
    }
}

/// How a framework's error becomes a [`GraphError`]: `Ok` when `e` is the framework's,
/// else `e` back.
pub(crate) type FrameworkErrors = fn(BoxError) -> Result<GraphError, BoxError>;

/// The frameworks' error conversions, registered when a runtime is made from a framework's
/// device (before any body of that framework runs): this layer names no framework (see
/// `crate::framework`).
static FRAMEWORK_ERRORS: Mutex<Vec<(&str, FrameworkErrors)>> = Mutex::new(Vec::new());

/// Registers framework `name`'s error conversion (once per name).
pub(crate) fn register_framework_errors(name: &'static str, convert: FrameworkErrors) {
    let mut all = FRAMEWORK_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    if !all.iter().any(|(n, _)| *n == name) {
        all.push((name, convert));
    }
}

fn framework_error(mut e: BoxError) -> Result<GraphError, BoxError> {
    let all = FRAMEWORK_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    for (_, convert) in all.iter() {
        match convert(e) {
            Ok(g) => return Ok(g),
            Err(other) => e = other,
        }
    }
    Err(e)
}

pub(super) fn into_graph_error(e: BoxError) -> GraphError {
    let e = match e.downcast::<GraphError>() {
        Ok(g) => return *g,
        Err(e) => e,
    };
    let e = match framework_error(e) {
        Ok(g) => return g,
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
