//! Support for the code `#[cuda_graph]` generates.
//!
//! **Not a public API.** Everything here exists so that the expansion can name it; it may
//! change in any release without notice. Write against the types re-exported at the crate
//! root instead.

pub use crate::buckets::{BatchBuffer, BatchedSlot, Buckets, Pick};
pub use crate::buffer::{InputSource, StaticBuffer};
pub use crate::capture::{CaptureMode, GraphSite};
pub use crate::error::{BoxError, GraphError};
pub use crate::graph::{Graph, GraphInfo, Staging};
pub use crate::runtime::Runtime;
pub use crate::FromRuntime;

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;

/// Warmup, capture, instantiate: the procedure behind every generated `capture`.
#[inline]
pub fn capture(
    rt: &Runtime,
    site: &'static GraphSite,
    static_bytes: usize,
    body: &mut dyn FnMut() -> Result<(), GraphError>,
) -> Result<Graph, GraphError> {
    crate::capture::capture_graph(rt, site, static_bytes, body)
}

/// Compares a replay input's shape with its static buffer before anything is queued.
#[inline]
pub fn check_shape<B: StaticBuffer, S: InputSource<B> + ?Sized>(
    site: &'static GraphSite,
    input: &'static str,
    dst: &B,
    src: &S,
) -> Result<(), GraphError> {
    crate::buffer::check_shape(site.name, input, dst, src)
}

/// Allocates a zeroed static buffer of `shape` for graph `site` (capture only); out of
/// memory names the graph, the buffer and its size.
pub fn alloc_static<B: StaticBuffer>(
    rt: &Runtime,
    site: &'static GraphSite,
    name: &'static str,
    shape: B::Shape,
) -> Result<B, GraphError> {
    B::alloc_static(rt, shape).map_err(|e| {
        e.with_oom_context(
            rt,
            || format!("allocating the static buffer `{name}` of `{}`", site.name),
            Some(B::bytes_for(shape)),
        )
    })
}

/// Bytes a static buffer takes, for the graph's memory report.
pub fn static_bytes<B: StaticBuffer>(b: &B) -> usize {
    B::bytes_for(b.shape())
}

/// Allocates a static buffer shaped like `src` and copies `src` into it (capture only).
pub fn stage_input<B: StaticBuffer, S: InputSource<B> + ?Sized>(
    rt: &Runtime,
    site: &'static GraphSite,
    name: &'static str,
    src: &S,
) -> Result<B, GraphError> {
    let mut dst = alloc_static::<B>(rt, site, name, src.shape())?;
    crate::graph::copy_outside_replay(rt, src, &mut dst)?;
    Ok(dst)
}

/// What a `#[cuda_graph]` function may return: `()` or `Result<(), E>` for any error type
/// that converts into a boxed error (cudarc's errors, [`GraphError`], `anyhow::Error`, yours).
#[diagnostic::on_unimplemented(
    message = "a `#[cuda_graph]` function must return `()` or `Result<(), E>`, not `{Self}`",
    label = "graph outputs are `&mut` parameters; the return value carries only success or an error"
)]
pub trait BodyResult {
    /// Converts the body's return value.
    fn into_graph_result(self) -> Result<(), GraphError>;
}

impl BodyResult for () {
    #[inline]
    fn into_graph_result(self) -> Result<(), GraphError> {
        Ok(())
    }
}

impl<E: Into<BoxError>> BodyResult for Result<(), E> {
    #[inline]
    fn into_graph_result(self) -> Result<(), GraphError> {
        self.map_err(|e| into_graph_error(e.into()))
    }
}

fn into_graph_error(e: BoxError) -> GraphError {
    let e = match e.downcast::<GraphError>() {
        Ok(g) => return *g,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_errors_keep_their_kind() {
        use cudarc::driver::sys::CUresult;
        let r: Result<(), DriverError> =
            Err(DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        let e = r.into_graph_result().unwrap_err();
        assert!(matches!(e, GraphError::Driver(_)));
        let mapped = GraphError::in_capture("f", e);
        assert!(matches!(
            mapped,
            GraphError::CaptureUnsupported { graph: "f" }
        ));

        let r: Result<(), GraphError> = Err(GraphError::EmptyGraph { graph: "g" });
        assert!(matches!(
            r.into_graph_result(),
            Err(GraphError::EmptyGraph { graph: "g" })
        ));

        #[derive(Debug)]
        struct Mine;
        impl std::fmt::Display for Mine {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("my error")
            }
        }
        impl std::error::Error for Mine {}
        let r: Result<(), Mine> = Err(Mine);
        let e = GraphError::in_capture("f", r.into_graph_result().unwrap_err());
        assert_eq!(
            e.to_string(),
            "capturing `f` failed inside the body: my error"
        );
        assert!(().into_graph_result().is_ok());
    }
}
