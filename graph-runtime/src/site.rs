//! What the generated code tells the runtime about one `#[cuda_graph]` function
//! ([`GraphSite`]: its name, warmup count, [`CaptureMode`], determinism check) and what the
//! capture procedure asks of the body ([`Step`]). Plain data, read by the buffers, the
//! capture, the graph and the collectives alike; it imports nothing of the crate but [`When`].

use cudarc::driver::sys;

use crate::error::When;

/// How strictly CUDA polices other CUDA calls while a stream captures.
///
/// See `cuStreamBeginCapture` in the CUDA driver API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// Unsafe calls (synchronizing, blocking allocation, queries) fail in every thread of the
    /// process while the capture runs. Catches a background thread that would invalidate the
    /// capture, at the price of failing that thread.
    Global,
    /// Unsafe calls fail only in the capturing thread; other threads keep working. The
    /// default: it is what a server with background threads needs.
    #[default]
    ThreadLocal,
    /// Nothing is policed; unsafe calls are allowed and their effects are your problem.
    Relaxed,
}

impl CaptureMode {
    pub(crate) fn raw(self) -> sys::CUstreamCaptureMode {
        match self {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// What the generated code tells the runtime about one `#[cuda_graph]` function.
#[derive(Debug)]
pub struct GraphSite {
    /// The annotated function's name.
    pub name: &'static str,
    /// How many eager runs precede the capture (at least 1).
    pub warmup: u32,
    /// The capture mode.
    pub mode: CaptureMode,
    /// Capture twice and compare the recordings, and compare the kernels the last warmup
    /// run and the capture looked up (`check_determinism`, on by default in debug builds).
    pub determinism: bool,
}

impl GraphSite {
    /// The same site, captured in `mode`.
    pub const fn mode(self, mode: CaptureMode) -> Self {
        GraphSite { mode, ..self }
    }
}

/// The site of function `name`, as the generated code builds it: `warmup` eager runs, then
/// a capture in [`CaptureMode::ThreadLocal`] (see [`GraphSite::mode`]), checked for
/// determinism when `determinism` is (`check_determinism`, by default
/// `cfg!(debug_assertions)` of the user's crate).
#[doc(hidden)]
pub const fn site(name: &'static str, warmup: u32, determinism: bool) -> GraphSite {
    GraphSite {
        name,
        warmup,
        mode: CaptureMode::ThreadLocal,
        determinism,
    }
}

/// What the capture procedure asks of the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Run the function once: eagerly in a warmup run, or recorded while capturing.
    Run(When),
    /// Check that the state and the outputs still hold the buffers they were recorded with
    /// (see `AddressBook::check`).
    Check(When),
}
