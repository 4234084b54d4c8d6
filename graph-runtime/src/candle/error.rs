//! candle's errors as [`GraphError`]s: the CUDA or cuBLAS error one carries, typed as a cudarc
//! body's would be; candle's own errors (those that carry no CUDA error) in the user's terms: candle's refusals
//! of an upload inside a capture become [`GraphError::HostUploadInCapture`], naming the call
//! from candle's backtrace when there is one; any other candle error is kept as
//! [`GraphError::User`] without its backtrace, which candle puts into the error's text
//! (`RUST_BACKTRACE=1`). The backtrace goes to the log (`tracing`, debug level) instead.

use crate::error::{BoxError, GraphError};

/// candle's error conversion, registered with the runtime's error layer by
/// `Runtime::from_candle`: a body's `candle_core::Error` as a [`GraphError`].
pub(crate) fn convert(e: BoxError) -> Result<GraphError, BoxError> {
    e.downcast::<candle_core::Error>().map(|c| from_candle(*c))
}

/// A candle error as a [`GraphError`]: the CUDA or cuBLAS error it carries, typed as a cudarc
/// body's would be, or candle's own error in the user's terms (below).
pub(crate) fn from_candle(e: candle_core::Error) -> GraphError {
    let e = match carried(e) {
        Ok(ours) => return ours,
        Err(e) => e,
    };
    match cuda_error_of(&e) {
        Some(typed) => typed,
        None => from_candle_own(e),
    }
}

/// The [`GraphError`] a candle error carries (made by `From<GraphError>`, under any context,
/// path or backtrace wrappers), or the candle error as it was.
fn carried(e: candle_core::Error) -> Result<GraphError, candle_core::Error> {
    use candle_core::Error;
    match e {
        Error::Cuda(inner) => inner
            .downcast::<GraphError>()
            .map(|ours| *ours)
            .map_err(Error::Cuda),
        Error::WithBacktrace { inner, backtrace } => {
            carried(*inner).map_err(|inner| Error::WithBacktrace {
                inner: Box::new(inner),
                backtrace,
            })
        }
        Error::Context { inner, context } => carried(*inner).map_err(|inner| Error::Context {
            inner: Box::new(inner),
            context,
        }),
        Error::WithPath { inner, path } => carried(*inner).map_err(|inner| Error::WithPath {
            inner: Box::new(inner),
            path,
        }),
        other => Err(other),
    }
}

/// The CUDA or cuBLAS error a candle error carries, typed as a cudarc body's would be.
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
                        return Some(GraphError::from(*d));
                    }
                    match err.downcast_ref::<CudaError>() {
                        Some(CudaError::Cuda(d)) => return Some(GraphError::from(*d)),
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

/// What candle-core 0.11 says when an upload inside a capture is larger than its cache takes.
const ABOVE_CAP: &str = "CUDA graph capture cannot upload uncached host data";
/// What it says when an upload inside a capture has bytes the warmup did not upload.
const NOT_CACHED: &str = "CUDA graph capture missing cached host data";

/// A candle error that carries no CUDA error, as a [`GraphError`].
pub(crate) fn from_candle_own(e: candle_core::Error) -> GraphError {
    let (e, backtrace) = strip_backtrace(e);
    if let Some(bt) = &backtrace {
        tracing::debug!(error = %e, backtrace = %bt, "candle error");
    }
    let text = innermost(&e).to_string();
    let above_cap = text.contains(ABOVE_CAP);
    if above_cap || text.contains(NOT_CACHED) {
        let op = backtrace
            .as_deref()
            .and_then(upload_call)
            .unwrap_or_else(|| {
                "a host tensor made on the device inside the body (`Tensor::new`, `from_vec`, \
                 `from_slice`, `to_device`, …); run with RUST_BACKTRACE=1 to have the call named here"
                    .to_owned()
            });
        return GraphError::HostUploadInCapture { op, above_cap };
    }
    GraphError::User(Box::new(e))
}

/// `e` without candle's backtrace wrappers (at any depth under context and path wrappers),
/// and the innermost backtrace's text.
fn strip_backtrace(e: candle_core::Error) -> (candle_core::Error, Option<String>) {
    use candle_core::Error;
    match e {
        Error::WithBacktrace { inner, backtrace } => {
            let (inner, deeper) = strip_backtrace(*inner);
            (inner, deeper.or_else(|| Some(backtrace.to_string())))
        }
        Error::Context { inner, context } => {
            let (inner, bt) = strip_backtrace(*inner);
            (
                Error::Context {
                    inner: Box::new(inner),
                    context,
                },
                bt,
            )
        }
        Error::WithPath { inner, path } => {
            let (inner, bt) = strip_backtrace(*inner);
            (
                Error::WithPath {
                    inner: Box::new(inner),
                    path,
                },
                bt,
            )
        }
        other => (other, None),
    }
}

/// The error under candle's context and path wrappers.
fn innermost(mut e: &candle_core::Error) -> &candle_core::Error {
    use candle_core::Error;
    while let Error::Context { inner, .. }
    | Error::WithPath { inner, .. }
    | Error::WithBacktrace { inner, .. } = e
    {
        e = inner;
    }
    e
}

/// The call that uploaded, from a backtrace's text: the candle operation (the outermost frame
/// of candle's `Tensor` or `Device`) and the first frame outside candle, the standard library,
/// cudarc and this crate (the model's code).
fn upload_call(backtrace: &str) -> Option<String> {
    let frames = backtrace.lines().filter_map(|line| {
        let (index, name) = line.trim_start().split_once(": ")?;
        index
            .chars()
            .all(|c| c.is_ascii_digit())
            .then_some(name.trim())
    });
    let library = [
        "candle_core::",
        "core::",
        "std::",
        "alloc::",
        "cudarc::",
        "graph_runtime::",
        "__",
        "_start",
        "main",
    ];
    let outside = |name: &str| {
        let plain = name.trim_start_matches('<').trim_start_matches('&');
        !library.iter().any(|p| plain.starts_with(p))
    };
    let mut op = None;
    let mut caller = None;
    for name in frames {
        for prefix in ["candle_core::tensor::", "candle_core::device::"] {
            if let Some(short) = name.strip_prefix(prefix) {
                op = Some(short.to_owned());
            }
        }
        if outside(name) {
            caller = Some(name.to_owned());
            break;
        }
    }
    match (op, caller) {
        (Some(op), Some(caller)) => Some(format!("`{op}` called from `{caller}`")),
        (Some(op), None) => Some(format!("`{op}`")),
        (None, Some(caller)) => Some(format!("called from `{caller}`")),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKTRACE: &str = "   0: candle_core::error::Error::bt
             at /registry/candle-core-0.11.1/src/error.rs:260:25
   1: candle_core::cuda_backend::device::CudaDevice::cached_htod_slice
             at /registry/candle-core-0.11.1/src/cuda_backend/device.rs:211:17
   2: <candle_core::cuda_backend::device::CudaDevice as candle_core::backend::BackendDevice>::storage_from_slice
   3: candle_core::device::Device::storage_from_slice
   4: candle_core::tensor::Tensor::from_slice
             at /registry/candle-core-0.11.1/src/tensor.rs:503:23
   5: candle_transformers::models::qwen2::Model::prepare_decoder_attention_mask
             at /registry/candle-transformers-0.11.1/src/models/qwen2.rs:300:9
   6: candle_transformers::models::qwen2::Model::forward
   7: my_server::qwen_step
   8: core::ops::function::FnOnce::call_once
";

    #[test]
    fn a_graph_error_comes_back_typed_through_candles_wrappers() {
        let ours = GraphError::KeptTemporary {
            graph: "step",
            bytes: 4096,
        };
        let text = ours.to_string();
        let e: candle_core::Error = ours.into();
        assert_eq!(e.to_string(), text, "candle shows the library's own text");
        let e = candle_core::Error::WithBacktrace {
            inner: Box::new(e),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        }
        .context("in the body");
        let back = from_candle(e);
        assert!(
            matches!(
                back,
                GraphError::KeptTemporary {
                    graph: "step",
                    bytes: 4096
                }
            ),
            "{back:?}"
        );
        // A CUDA error of candle's own is still typed as a driver error.
        let cuda = candle_core::Error::Cuda(Box::new(cudarc::driver::DriverError(
            cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        )));
        assert!(matches!(from_candle(cuda), GraphError::Driver(_)));
    }

    #[test]
    fn a_graph_error_returned_by_a_candle_body_is_typed() {
        fn body() -> candle_core::Result<()> {
            Err::<(), GraphError>(GraphError::EventTracking { during: "a fork" })?;
            Ok(())
        }
        crate::error::register_framework_errors("candle", convert);
        let back = crate::error::body_result(body());
        assert!(
            matches!(back, Err(GraphError::EventTracking { during: "a fork" })),
            "{back:?}"
        );
    }

    #[test]
    fn the_upload_is_named_from_candles_backtrace() {
        assert_eq!(
            upload_call(BACKTRACE).as_deref(),
            Some(
                "`Tensor::from_slice` called from \
                 `candle_transformers::models::qwen2::Model::prepare_decoder_attention_mask`"
            )
        );
        assert_eq!(upload_call("no frames here"), None);
    }

    #[test]
    fn uploads_above_the_cap_are_typed_and_no_backtrace_reaches_the_text() {
        let e = candle_core::Error::Msg(ABOVE_CAP.into());
        let e = candle_core::Error::WithBacktrace {
            inner: Box::new(e),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        }
        .context("qwen2 forward");
        let typed = from_candle_own(e);
        let GraphError::HostUploadInCapture { op, above_cap } = &typed else {
            panic!("{typed:?}");
        };
        assert!(above_cap);
        // This test's own backtrace names no candle operation, only its caller.
        assert!(
            op.contains("called from") || op.contains("RUST_BACKTRACE"),
            "{op}"
        );
        let text = typed.to_string();
        assert!(text.contains("4096 bytes"), "{text}");
        assert!(text.contains("#[state]"), "{text}");

        let missing = from_candle_own(candle_core::Error::Msg(NOT_CACHED.into()));
        assert!(
            matches!(
                &missing,
                GraphError::HostUploadInCapture {
                    above_cap: false,
                    ..
                }
            ),
            "{missing:?}"
        );
        assert!(missing.to_string().contains("RUST_BACKTRACE=1"));

        // Any other candle error keeps its text, and loses the backtrace candle put into it.
        let plain = candle_core::Error::WithBacktrace {
            inner: Box::new(candle_core::Error::Msg("shape mismatch in matmul".into())),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        // candle's own text carries the backtrace on lines of their own.
        assert!(plain.to_string().contains('\n'));
        let typed = from_candle_own(plain);
        let text = typed.to_string();
        assert!(text.contains("shape mismatch in matmul"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}
