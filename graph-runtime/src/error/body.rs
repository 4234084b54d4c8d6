//! What a `#[cuda_graph]` body may return ([`BodyResult`], [`BodyValue`]) and how its error
//! becomes a [`GraphError`].

use super::convert::into_graph_error;
use super::variants::{BoxError, GraphError};

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

/// [`BodyResult::into_graph_result`] as a function: what the expansion calls on the body's
/// return value.
#[doc(hidden)]
#[inline]
pub fn body_result<R: BodyResult>(value: R) -> Result<(), GraphError> {
    value.into_graph_result()
}

/// A body's return value with a result (`-> Result<Tensor, E>`): the value, or the error
/// converted as [`BodyResult`] converts it.
#[doc(hidden)]
pub trait BodyValue<T> {
    /// Converts the body's return value.
    fn into_graph_value(self) -> Result<T, GraphError>;
}

impl<T, E: Into<BoxError>> BodyValue<T> for Result<T, E> {
    #[inline]
    fn into_graph_value(self) -> Result<T, GraphError> {
        self.map_err(|e| into_graph_error(e.into()))
    }
}
