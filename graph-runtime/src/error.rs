//! [`GraphError`]: every way capture, replay or the runtime can fail, in the user's terms.
//!
//! CUDA reports capture failures as bare codes (900–908). Each code gets its own variant
//! here whose message says what happened in the captured body and what to write instead.
//! [`GraphError::from_driver`] does the mapping; the capture procedure calls it with the
//! name of the graph being captured so the message names the user's function.
//!
//! This file only names the parts: `error/variants.rs` holds the error types ([`GraphError`],
//! [`When`], [`BoxError`]), `error/convert.rs` turns other errors into a [`GraphError`] and
//! classifies one, `error/body.rs` says what a body may return ([`BodyResult`], `BodyValue`).
//! The module sits at the bottom of the crate: nothing here imports the runtime, a capture or
//! a graph.

mod body;
#[cfg(feature = "nccl")]
mod collective;
mod convert;
#[cfg(test)]
mod tests;
mod variants;

pub use body::{body_result, BodyResult, BodyValue};
#[cfg(feature = "nccl")]
pub use collective::CollectiveError;
pub(crate) use convert::{register_framework_errors, FrameworkErrors};
pub(crate) use variants::bytes;
pub use variants::{BoxError, GraphError, When};
