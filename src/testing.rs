//! Helpers for GPU tests: run on a GPU when there is one, skip (and say why) when there is
//! not, and fail instead of skipping when `CUDA_GRAPH_REQUIRE_GPU=1`.

use std::sync::Once;

use graph_runtime::{GraphError, Runtime};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The environment variable that turns a missing GPU from a skip into a failure.
pub const REQUIRE_GPU: &str = "CUDA_GRAPH_REQUIRE_GPU";

/// Whether a missing GPU must fail the test run.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU).is_ok_and(|v| v == "1")
}

/// Sends `tracing` output to stderr once per process (filter with `RUST_LOG`).
pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    });
}

/// A runtime on device 0, or `None` (after printing why) when this machine has no GPU.
///
/// # Panics
/// When there is no GPU and `CUDA_GRAPH_REQUIRE_GPU=1`, or when the runtime fails for any
/// other reason.
pub fn runtime_or_skip(test: &str) -> Option<Runtime> {
    init_tracing();
    match Runtime::new(0) {
        Ok(rt) => Some(rt),
        Err(
            e @ (GraphError::NoDriver
            | GraphError::NoDevice { .. }
            | GraphError::MissingLibrary { .. }),
        ) => {
            if gpu_required() {
                panic!("{test}: {REQUIRE_GPU}=1 but there is no usable GPU: {e}");
            }
            eprintln!("skipped {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: the runtime failed to start: {e}"),
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

/// The largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
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
        assert_eq!(max_abs_diff(&a, &b), 0.0);
    }
}
