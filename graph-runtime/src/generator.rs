//! The generator itself: its device state, its identity, and how far a replay moves it.
//! The runtime holds its default generator from here; this file imports nothing of the crate
//! but the error type, so the runtime sits above it and the draws (`rng/mod.rs`,
//! `rng/draws.rs`) sit above the runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::GraphError;

/// The seed of [`Runtime::rng`](crate::Runtime::rng), the runtime's default generator.
pub const DEFAULT_SEED: u64 = 0x5eed_c0de_2026;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct GeneratorInner {
    /// `[seed, offset, arrivals (low 32 bits), 0]`.
    pub(crate) state: CudaSlice<u64>,
    pub(crate) id: u64,
}

/// A Philox4x32-10 random generator whose seed and offset live in device memory.
///
/// Create one with [`Runtime::generator`](crate::Runtime::generator), or use the runtime's default one,
/// [`Runtime::rng`](crate::Runtime::rng). Draws take `&self`: the state changes on the device, in stream order.
/// Clones share the same state.
///
/// Every draw is graph-safe with no registration, and so is a kernel of yours that draws
/// through [`Generator::kernel_arg`]: see the [module docs](crate::rng).
#[derive(Clone)]
pub struct Generator {
    pub(crate) inner: Arc<GeneratorInner>,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("id", &self.inner.id)
            .finish_non_exhaustive()
    }
}

/// How far one replay moves one generator, in Philox counters (4 values each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RngAdvance {
    /// [`Generator::id`](crate::Generator::id) of the generator.
    pub generator: u64,
    /// Counters consumed per replay.
    pub counters_per_replay: u64,
}

impl Generator {
    pub(crate) fn create(stream: &Arc<CudaStream>, seed: u64) -> Result<Self, GraphError> {
        let state = stream.clone_htod(&[seed, 0, 0, 0])?;
        Ok(Generator {
            inner: Arc::new(GeneratorInner {
                state,
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            }),
        })
    }

    pub(crate) fn downgrade(&self) -> Weak<GeneratorInner> {
        Arc::downgrade(&self.inner)
    }

    pub(crate) fn from_inner(inner: Arc<GeneratorInner>) -> Self {
        Generator { inner }
    }

    /// A number identifying this generator (and its clones) in logs and graph reports.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
}
