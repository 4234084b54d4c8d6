//! Shared pieces of the workspace's integration tests (`tests/`) and examples
//! (`examples/`): the NVRTC kernel sources they launch, and the helpers that decide whether
//! a GPU test runs or skips.
//!
//! This crate is not published; the library is `graph-runtime`.

pub mod bench;
pub mod kernels;
pub mod testing;
