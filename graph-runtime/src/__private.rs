//! Support for the code `#[cuda_graph]` generates.
//!
//! **Not a public API.** Everything here exists so that the expansion can name it; it may
//! change in any release without notice. Write against the types re-exported at the crate
//! root instead. This module only re-exports: each item lives in the module of its concept.

pub use crate::__graph_type_impls as graph_type_impls;
pub use crate::buckets::{
    rows, BatchBuffer, BatchList, BatchSources, Buckets, Capture, Family, Rows, TypedFamily,
    ValidRows,
};
pub use crate::buffer::{
    alloc_static, check_shape, copy_result, feed_input, stage_input, static_bytes, store_result,
    InputSource, Staging, StaticBuffer,
};
pub use crate::capture::{
    capture, island, misplaced_island, Captured, CrossesIsland, DeviceValue, HostValue, Probe,
    ProbeDevice, ProbeHost, ProbeOther, TakenByIsland,
};
pub use crate::constant::constant;
pub use crate::error::GraphError;
pub use crate::error::{body_result, BodyResult, BodyValue, When};
pub use crate::graph::{launch_as_is, replay, Graph};
pub use crate::inputs::InputNodes;
pub use crate::report::VerifyReport;
pub use crate::runtime::{FromRuntime, Runtime};

/// The result of every generated method: `Result<T, GraphError>`.
pub type Result<T> = core::result::Result<T, crate::GraphError>;
pub use crate::site::{site, CaptureMode, GraphSite, Step};
pub use crate::state::{
    AddressBook, DeviceState, Held, HeldMut, Recorded, StateArg, StateArgMut, StateVisitor,
};
pub use crate::typed::{
    Batch, GraphBody, NoResult, ResultOf, StaticList, Statics, StaticsOf, TypedGraph,
};
pub use crate::verify::{Tolerance, Verifier, VerifySchedule};
