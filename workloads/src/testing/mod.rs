//! How GPU tests and examples get their GPU, and seeded random data for them.
//!
//! One policy for both: with a usable GPU they run on device 0; without one a test counts as
//! *ignored* and an example exits after saying why; with `CUDA_GRAPH_REQUIRE_GPU=1` a missing
//! GPU is a failure instead.
//!
//! # GPU tests
//! A test binary with `harness = false` in `Cargo.toml` declares each test once, with
//! [`gpu_test`] (given a fresh [`Runtime`] on device 0) or [`cpu_test`], and hands its `main`
//! to [`run_tests`], a libtest-compatible runner (`--test-threads`, filters, `--list`,
//! `--ignored`, the usual summary line):
//!
//! ```no_run
//! use graph_runtime::{GraphError, Runtime};
//! use workloads::testing::gpu_test;
//!
//! #[gpu_test]
//! fn replays_like_eager(rt: Runtime) -> Result<(), GraphError> {
//!     let _graph_input = rt.stream().alloc_zeros::<f32>(64)?;
//!     Ok(())
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     workloads::testing::run_tests()
//! }
//! ```
//!
//! A function that is neither registered nor called is dead code, which the workspace's
//! clippy run (`-D warnings`) rejects: a test cannot be forgotten silently.
//!
//! # Tests of several GPUs
//! `#[gpu_test(gpus = N)]` asks for N GPUs. On a machine with fewer (but at least one) the
//! test counts as *ignored*, saying how many it needs, also with `CUDA_GRAPH_REQUIRE_GPU=1`:
//! a one-GPU machine runs the same suite as a two-GPU one. A machine without any usable GPU
//! treats it like every GPU test (ignored, or failed with `CUDA_GRAPH_REQUIRE_GPU=1`). The
//! harness runs tests of more than one GPU one at a time. With feature `nccl` the test may
//! take the group of its ranks instead of a runtime; a libnccl that cannot be loaded then
//! counts like a missing GPU (see [`GpuFixture`]):
//!
//! ```ignore
//! use graph_runtime::nccl::CommGroup;
//! use graph_runtime::GraphError;
//! use workloads::testing::gpu_test;
//!
//! #[gpu_test(gpus = 2)]
//! fn all_reduce_in_a_graph(group: CommGroup) -> Result<(), GraphError> {
//!     group.run(&[0, 1], |comm| {
//!         // …
//!         Ok(())
//!     })?;
//!     Ok(())
//! }
//! ```

use std::sync::Once;

use graph_runtime::cudarc::driver::CudaContext;
use graph_runtime::{GraphError, Runtime};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod fixture;
mod harness;

pub use fixture::GpuFixture;
pub use harness::run_tests;
pub use workloads_macros::{cpu_test, gpu_test};

/// What the expansion of [`gpu_test`] and [`cpu_test`] names. Not a public API: it changes
/// whenever the attributes do.
#[doc(hidden)]
pub mod __private {
    pub use super::harness::{attempt, outcome, Attempt, Test};
    pub use inventory;
}

/// The environment variable that turns a missing GPU from a skip into a failure.
pub const REQUIRE_GPU: &str = "CUDA_GRAPH_REQUIRE_GPU";

/// Whether a missing GPU must fail the test run.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU).is_ok_and(|v| v == "1")
}

/// Sends `tracing` output to stderr once per process (filter with `RUST_LOG`), and keeps
/// every event at level ERROR for [`logged_errors`], whatever the filter.
pub fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let printed = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(tracing_subscriber::EnvFilter::from_default_env());
        let _ = tracing_subscriber::registry()
            .with(printed)
            .with(RecordErrors)
            .try_init();
    });
}

/// The ERROR events logged so far in this process (from any thread), each as
/// `target: message field=value …`, oldest first: how a test sees what the library
/// reported through `tracing` (the capture watchdog, for one).
pub fn logged_errors() -> Vec<String> {
    ERRORS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

static ERRORS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The layer behind [`logged_errors`].
struct RecordErrors;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RecordErrors {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() != tracing::Level::ERROR {
            return;
        }
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0.push_str(&format!(" {value:?}"));
                } else {
                    self.0.push_str(&format!(" {}={value:?}", field.name()));
                }
            }
        }
        let mut text = Text(format!("{}:", event.metadata().target()));
        event.record(&mut text);
        ERRORS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(text.0);
    }
}

/// Whether `e`, from `Runtime::new`, means that this machine has no usable GPU (no driver, no
/// device, no CUDA library) rather than that the runtime failed on a GPU that is there.
pub fn means_no_gpu(e: &GraphError) -> bool {
    matches!(
        e,
        GraphError::NoDriver | GraphError::NoDevice { .. } | GraphError::MissingLibrary { .. }
    )
}

/// How many GPUs this machine has, or why it has no usable one (no driver, no device, a CUDA
/// library missing: what [`means_no_gpu`] says about `Runtime::new(0)`). A GPU that is there
/// but fails to start a runtime still counts: what uses it reports the failure.
pub fn usable_gpus() -> Result<usize, GraphError> {
    match Runtime::new(0) {
        Err(e) if means_no_gpu(&e) => Err(e),
        _ => Ok(CudaContext::device_count().map_or(1, |n| n.max(1) as usize)),
    }
}

/// Whether this machine has the `gpus` GPUs the multi-GPU program `program` needs; when not,
/// after printing why: what a multi-GPU example calls first. Fewer GPUs than `gpus` is a skip
/// also with `CUDA_GRAPH_REQUIRE_GPU=1` (a one-GPU machine runs every example).
///
/// # Panics
/// When there is no usable GPU at all and `CUDA_GRAPH_REQUIRE_GPU=1`.
pub fn gpus_or_skip(program: &str, gpus: usize) -> bool {
    init_tracing();
    match usable_gpus() {
        Ok(have) if have >= gpus => true,
        Ok(have) => {
            eprintln!("skipped {program}: it needs {gpus} GPUs, this machine has {have}");
            false
        }
        Err(e) => {
            if gpu_required() {
                panic!("{program}: {REQUIRE_GPU}=1 but there is no usable GPU: {e}");
            }
            eprintln!("skipped {program}: {e}");
            false
        }
    }
}

/// Ends a program whose work returned `result`: an error is printed with its `Display` (a
/// typed error's words: what happened and what to do) and the process exits with status 1.
/// For the programs whose errors come from several GPUs or libraries (NCCL), where `main`
/// returning the error would print its `Debug` form.
pub fn exit_on_error(result: Result<(), graph_runtime::BoxError>) {
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// A runtime on device 0 for the program `program`, or `None` (after printing why) when this
/// machine has no GPU: what an example calls first.
///
/// # Panics
/// When there is no GPU and `CUDA_GRAPH_REQUIRE_GPU=1`, or when the runtime fails for any
/// other reason.
pub fn runtime_or_skip(program: &str) -> Option<Runtime> {
    init_tracing();
    match Runtime::new(0) {
        Ok(rt) => {
            pad_allocations(&rt);
            Some(rt)
        }
        Err(e) if means_no_gpu(&e) => {
            if gpu_required() {
                panic!("{program}: {REQUIRE_GPU}=1 but there is no usable GPU: {e}");
            }
            eprintln!("skipped {program}: {e}");
            None
        }
        Err(e) => panic!("{program}: the runtime failed to start: {e}"),
    }
}

/// The environment variable that shifts where a benchmark's buffers land:
/// [`runtime_or_skip`] allocates (and keeps) that many bytes before the program allocates
/// anything, so that the same program can be measured with its buffers at other addresses.
pub const PAD_BYTES: &str = "BENCH_PAD_BYTES";

fn pad_allocations(rt: &Runtime) {
    let Some(bytes) = std::env::var(PAD_BYTES)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&b| b > 0)
    else {
        return;
    };
    match rt.stream().alloc_zeros::<u8>(bytes) {
        Ok(pad) => {
            eprintln!(
                "{PAD_BYTES}={bytes}: the program's buffers start after a pad of {bytes} bytes"
            );
            // Kept for the life of the process: the point is that later buffers sit after it.
            std::mem::forget(pad);
        }
        Err(e) => eprintln!("{PAD_BYTES}={bytes}: the pad could not be allocated ({e})"),
    }
}

/// A random generator with a fresh seed, printed so that a failure can be replayed with
/// [`seeded_rng`].
pub fn fresh_rng(test: &str) -> SmallRng {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed);
    eprintln!("{test}: random seed {seed}");
    seeded_rng(seed)
}

/// A random generator with a fixed seed.
pub fn seeded_rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// `n` floats uniform in `[-1, 1)`.
pub fn random_vec(rng: &mut SmallRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_reproducible() {
        let a = random_vec(&mut seeded_rng(7), 16);
        let b = random_vec(&mut seeded_rng(7), 16);
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
    }
}
