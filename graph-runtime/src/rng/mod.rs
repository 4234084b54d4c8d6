//! Graph-safe random numbers: Philox4x32-10 generators whose seed and offset live on the
//! device and advance on the device, the distributions they draw, and the device API that
//! lets your own kernels draw from them.
//!
//! # Why this is graph-safe by construction
//! A random kernel needs a seed and a position (offset) in the random stream. If the offset
//! were a host value passed as a kernel argument, capture would bake it into the graph and
//! every replay would draw the same numbers: the silent failure PyTorch guards against by
//! asking users to register generators with each graph.
//!
//! Here a generator's state is 32 bytes of device memory: `[seed, offset, arrivals, 0]`.
//! Every random kernel reads seed and offset through a pointer, draws from Philox at
//! `offset + g`, and the last of its blocks to finish moves the offset past what the kernel
//! consumed. The advance is part of the kernel, so it is part of any graph that captured the
//! kernel: each replay reads the offset the previous one left and moves it on, with no host
//! involvement, no registration and no replay prologue. Eager calls and replays run the
//! same kernels and therefore draw the same sequence.
//!
//! # Warmup policy
//! Warmup runs the body eagerly, so it draws. The runtime snapshots every generator created
//! from it before the warmup runs and restores them afterwards (the capture itself draws
//! nothing: it only records). A program therefore draws the same numbers whether it calls
//! the function eagerly or captures it and replays the graph: the first replay draws what
//! the first eager call would have. This holds for your own kernels too, as long as they
//! draw through [`Generator::kernel_arg`].
//!
//! # Draws, counter layout and host references
//! Counter `g` of a draw from a generator at `offset` is Philox with key = seed (low, high
//! 32 bits) and counter = `(lo32(offset + g), hi32(offset + g), 0, 0)`; it gives four 32-bit
//! words `x, y, z, w`. A draw that uses `groups` counters moves the offset by `groups`. No
//! result depends on the launch configuration.
//!
//! | draw | element types | counters for `n` values | value `i` | host reference | agreement |
//! | --- | --- | --- | --- | --- | --- |
//! | [`uniform`](Generator::uniform) | `f32`, `f16`, `bf16` | `ceil(n / 4)` | word `i % 4` of counter `i / 4`, top 24 bits, `fma(hi − lo, u, lo)` | [`reference_uniform_in`] | bit for bit |
//! | [`normal`](Generator::normal) | `f32`, `f16`, `bf16` | `ceil(n / 4)` | Box–Muller on words `(x, y)` for values `4g, 4g + 1`, `(z, w)` for `4g + 2, 4g + 3` | [`reference_normal`] | within [`NORMAL_TOLERANCE`] × `abs(std)` (fast `__logf`, `__sincosf`) |
//! | [`bernoulli`](Generator::bernoulli), [`bernoulli_per_element`](Generator::bernoulli_per_element) | `u8`, `f32` (0 or 1) | `ceil(n / 4)` | `uniform < p` | [`reference_bernoulli`] | bit for bit |
//! | [`exponential`](Generator::exponential) | `f32` | `ceil(n / 4)` | `−logf(u) / λ`, `u` in `(0, 1)` | [`reference_exponential`] | within [`EXPONENTIAL_MAX_ULPS`] ulp |
//! | [`integers`](Generator::integers) | `u32`, `i32` | `ceil(n / 2)` | 64 bits: words `2(i % 2)`, `2(i % 2) + 1` of counter `i / 2` | [`reference_integer`] | bit for bit |
//! | [`integers`](Generator::integers) | `i64` | `n` | the 128 bits of counter `i` | [`reference_integer`] | bit for bit |
//! | [`dropout`](Generator::dropout) | `f32`, mask `u8` | `ceil(n / 4)` | keep when `uniform < 1 − p` | [`reference_bernoulli`] with `1 − p` | mask bit for bit |
//!
//! A 16-bit draw is the `f32` draw rounded to nearest even ([`RandomFloat`]); a uniform value
//! that rounds to `hi` becomes `lo`, as in PyTorch, so every value stays in `[lo, hi)`.
//!
//! # Drawing in your own kernels
//! A kernel of yours draws from a generator through the CUDA device API in
//! [`PHILOX_DEVICE_API`] and the generator's state pointer, [`Generator::kernel_arg`]. It then
//! stays graph-safe the way the library's kernels are: it reads the offset on the device and
//! moves it on the device, so every replay draws fresh numbers, warmup draws are undone, and
//! [`GraphInfo::rng`](crate::GraphInfo::rng) counts what it consumes. (PyTorch's custom
//! kernels get the same from `philox_cuda_state(increment)` and `philox::unpack`, where the
//! host reserves the counters at launch and a graph's replay prologue moves the offset.)
//!
//! 1. Prepend the device API to the kernel source. [`Runtime::function`] wants a
//!    `&'static str`, so build the source at compile time:
//!    `concat!(graph_runtime::philox_device_api!(), r#"…your kernels…"#)`.
//! 2. Pass `g.kernel_arg(rt)` as an `unsigned long long *` parameter.
//! 3. Keep the contract:
//!    * **Read before drawing.** Every thread calls `PhiloxDraw d = philox_begin(state)` before
//!      it draws (in an [early-launched](crate::launch) kernel, after `griddepcontrol.wait`).
//!    * **Draw only what you reserve.** A kernel reserves `groups` counters and uses
//!      `philox_group(d, g)` for `g < groups` only (or `philox_bits(d, i)` for
//!      `i < 4 × groups`). Two threads that compute the same group get the same numbers, so
//!      give each random value to one thread.
//!    * **End once, in every thread, last.** Every thread of every block calls
//!      `philox_end(state, d, groups)` exactly once, after its last draw, with the same
//!      `groups` in every block. It holds a `__syncthreads()`: guard work with
//!      `if (i < n) { … }`, never `if (i >= n) return;`.
//!    * **One stream at a time.** Kernels that draw from one generator run one after
//!      another: on the runtime's stream, or on a side stream joined before the next draw.
//!
//! To draw exactly what the library draws, use its layout and conversions: value `i` is
//! `philox_uniform(philox_bits(d, i), lo, hi)` for [`Generator::uniform`], the four values of
//! group `g` are `philox_normal4(philox_group(d, g), mean, std)` for [`Generator::normal`],
//! and `groups = (n + 3) / 4`. Then the same seed and offset give the same bits
//! (`examples/09-user-rng-kernel.rs` checks it on the GPU).
//!
//! What breaking the contract does:
//! * **No `philox_end`:** the offset never moves. Every eager call and every replay draws
//!   the same numbers, and so does the next draw from the generator.
//! * **A block that skips `philox_end`** (every thread of it returned early): the arrival
//!   count is left wrong, so in later kernels the offset moves too early (before all their
//!   blocks have read it: draws that overlap and depend on scheduling) or not at all, until
//!   [`Generator::set_seed_and_offset`] or [`Generator::manual_seed`] resets the state. A thread that
//!   returns early while others call `philox_end` is a `__syncthreads()` that not every
//!   thread reaches: undefined behavior.
//! * **Counters past `groups`:** the next draw from the generator draws them again, so the
//!   two draws are correlated.
//! * **Two streams at once:** two kernels that draw from one generator concurrently race on
//!   its offset and its arrival count: they may draw the same numbers, and the count can be
//!   corrupted. Give each concurrent stream its own generator.
//! * **Host reads in the body:** [`Generator::seed_and_offset`] inside a capture is refused
//!   ([`GraphError::RngHostStateInCapture`]); save and restore on the device instead.
//!
//! ```no_run
//! use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
//! use graph_runtime::{cuda_graph, Generator, GraphError, Runtime};
//!
//! // Random masking: keeps x[i] with probability keep[i], drawing the value that
//! // `Generator::uniform(.., 0.0, 1.0)` would draw at index i.
//! const MASK: &str = concat!(graph_runtime::philox_device_api!(), r#"
//! extern "C" __global__ void random_mask(unsigned long long *rng, const float *x, const float *keep,
//!                                        float *y, unsigned long long n) {
//!     PhiloxDraw d = philox_begin(rng);               // every thread, before drawing
//!     unsigned long long groups = (n + 3) / 4;        // 4 values per counter
//!     unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < n) {                                    // no early return: philox_end syncs
//!         float u = philox_uniform(philox_bits(d, i), 0.0f, 1.0f);
//!         y[i] = u < keep[i] ? x[i] : 0.0f;
//!     }
//!     philox_end(rng, d, groups);                     // every thread, once, last
//! }
//! "#);
//!
//! #[cuda_graph(warmup = 2)]
//! fn random_mask(
//!     rt: &Runtime,
//!     #[state] g: &Generator,
//!     x: &CudaSlice<f32>,
//!     #[state] keep: &CudaSlice<f32>,
//!     y: &mut CudaSlice<f32>,
//! ) -> Result<(), GraphError> {
//!     let f = rt.function(MASK, "random_mask")?;
//!     let n = x.len() as u64;
//!     let rng = g.kernel_arg(rt);
//!     let mut launch = rt.stream().launch_builder(&f);
//!     launch.arg(&rng).arg(x).arg(keep).arg(y).arg(&n);
//!     // SAFETY: the kernel reads `n` floats of `x` and `keep`, writes `n` of `y`, and draws
//!     // from `g` by the contract of `graph_runtime::rng`.
//!     unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32)) }?;
//!     Ok(())
//! }
//! # fn main() {}
//! ```

use std::marker::PhantomData;
use std::panic::Location;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};

use crate::error::GraphError;
use crate::phase::refuse_while_capturing;
use crate::runtime::Runtime;
use crate::state::{lent_shared, DeviceRegion, DeviceState};

mod device;
mod draws;
mod host;
mod types;

pub use crate::generator::{Generator, RngAdvance, DEFAULT_SEED};
pub use device::{PHILOX_DEVICE_API, RNG_KERNELS};
pub use host::{
    philox4x32_10, reference_bernoulli, reference_bits, reference_exponential, reference_group,
    reference_integer, reference_normal, reference_uniform, reference_uniform_in,
    EXPONENTIAL_MAX_ULPS, NORMAL_TOLERANCE,
};
pub use types::{BernoulliOutput, RandomFloat, RandomInt};

/// A generator's device state as a kernel argument: the `unsigned long long *state` that
/// `philox_begin` and `philox_end` of [`PHILOX_DEVICE_API`] take.
///
/// Get it from [`Generator::kernel_arg`] and push it like any scalar argument
/// (`launch.arg(&rng)` with cudarc's launch builder, `.arg(rng)` with
/// [`EarlyLaunch`](crate::EarlyLaunch)). It borrows the generator, so the generator cannot be
/// dropped while a launch is being built with it; its memory is freed in stream order, after
/// the kernels already queued.
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct RngKernelArg<'g> {
    ptr: u64,
    _generator: PhantomData<&'g Generator>,
}

// SAFETY: `RngKernelArg` is a single `u64` (transparent; the marker has no size), a device
// address that kernels take as an `unsigned long long *` parameter of the same size.
unsafe impl DeviceRepr for RngKernelArg<'_> {}

impl RngKernelArg<'_> {
    /// The device address of the generator's state (`[seed, offset, arrivals, 0]`, 4 × u64),
    /// for launch APIs that take raw parameters.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

/// A device-side snapshot of a generator's seed and offset, taken by
/// [`Generator::save_state`] and put back by [`Generator::restore_state`]. Both are device
/// copies, so they work inside a captured body: each replay saves and restores the state the
/// generator has at that point of that replay.
pub struct RngState {
    buf: CudaSlice<u64>,
}

impl std::fmt::Debug for RngState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RngState").finish_non_exhaustive()
    }
}

impl RngState {
    /// An empty snapshot buffer on the runtime's stream, to be filled by `save_state`.
    pub fn new(rt: &Runtime) -> Result<Self, GraphError> {
        Ok(RngState {
            buf: rt.stream().alloc_zeros::<u64>(2)?,
        })
    }
}

fn refuse_in_capture(
    op: &'static str,
    instead: &'static str,
    location: &'static Location<'static>,
) -> Result<(), GraphError> {
    refuse_while_capturing(|graph| GraphError::RngHostStateInCapture {
        op,
        instead,
        graph,
        location,
    })
}

// SAFETY: one region, the generator's state buffer, which its `Arc` keeps allocated.
lent_shared!(
    /// A generator's device state is what a graph that draws from it reads by address. It is
    /// lent back as `&Generator`: every draw takes `&self`, and a shared borrow cannot
    /// replace the generator under the graph.
    Generator,
    |g, visit| g.inner.state.regions(visit),
);

/// The snapshot buffer a graph's `save_state`/`restore_state` copy into and out of.
// SAFETY: one region, the snapshot buffer it owns.
unsafe impl DeviceState for RngState {
    type Lent<'a>
        = &'a mut RngState
    where
        Self: 'a;

    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        self.buf.regions(visit);
    }

    fn lend(&mut self) -> &mut RngState {
        self
    }
}

impl Generator {
    fn state_ptr(&self, rt: &Runtime) -> u64 {
        let (ptr, _sync) = self.inner.state.device_ptr(rt.stream());
        ptr
    }

    /// The generator's state as an argument of a kernel of yours that draws through
    /// [`PHILOX_DEVICE_API`]: pass it as an `unsigned long long *` parameter and keep the
    /// contract of the [module docs](crate::rng#drawing-in-your-own-kernels). Launch that
    /// kernel on `rt`'s stream (or on a side stream joined before the next draw).
    ///
    /// Works the same eagerly and inside a captured body: the kernel reads and moves the
    /// offset on the device, so every replay draws fresh numbers.
    pub fn kernel_arg(&self, rt: &Runtime) -> RngKernelArg<'_> {
        crate::phase::note_generator(self.id());
        RngKernelArg {
            ptr: self.state_ptr(rt),
            _generator: PhantomData,
        }
    }

    /// Reads the seed and the offset (in Philox counters) on the host. Waits for the
    /// runtime's stream.
    ///
    /// Inside a captured body this is refused with [`GraphError::RngHostStateInCapture`]: a
    /// host read would happen once, at capture. Use [`Generator::save_state`] there.
    #[track_caller]
    pub fn seed_and_offset(&self, rt: &Runtime) -> Result<(u64, u64), GraphError> {
        refuse_in_capture(
            "Generator::seed_and_offset",
            "Generator::save_state",
            Location::caller(),
        )?;
        let v = rt.stream().clone_dtoh(&self.inner.state)?;
        Ok((v[0], v[1]))
    }

    /// Sets seed and offset from the host.
    ///
    /// Inside a captured body this is refused with [`GraphError::RngHostStateInCapture`]: the
    /// values would be baked into the graph and every replay would rewind to them. Use
    /// [`Generator::restore_state`] there.
    #[track_caller]
    pub fn set_seed_and_offset(
        &self,
        rt: &Runtime,
        seed: u64,
        offset: u64,
    ) -> Result<(), GraphError> {
        refuse_in_capture(
            "Generator::set_seed_and_offset",
            "Generator::restore_state",
            Location::caller(),
        )?;
        self.write_words(rt, &[seed, offset, 0, 0])
    }

    /// Restarts the generator at `seed`, offset 0 (host side; refused inside a capture like
    /// [`Generator::set_seed_and_offset`]).
    #[track_caller]
    pub fn manual_seed(&self, rt: &Runtime, seed: u64) -> Result<(), GraphError> {
        refuse_in_capture(
            "Generator::manual_seed",
            "Generator::restore_state",
            Location::caller(),
        )?;
        self.write_words(rt, &[seed, 0, 0, 0])
    }

    /// Writes seed and offset (the first two words) from the host, leaving the rest of the
    /// state as it is: what `restore_state` puts back, without a device snapshot.
    pub(crate) fn write_seed_and_offset(
        &self,
        rt: &Runtime,
        seed: u64,
        offset: u64,
    ) -> Result<(), GraphError> {
        let ptr = self.state_ptr(rt);
        let words = [seed, offset];
        // SAFETY: `ptr` is this generator's 4-word device state, of which the first two are
        // written; the copy is ordered on the runtime's stream, where every draw runs, and
        // `words` is staged by the driver before the call returns (pageable source).
        unsafe { crate::driver::copy_htod(ptr, words.as_slice(), rt.stream().cu_stream()) }?;
        Ok(())
    }

    fn write_words(&self, rt: &Runtime, words: &[u64; 4]) -> Result<(), GraphError> {
        let ptr = self.state_ptr(rt);
        // SAFETY: `ptr` is this generator's 4-word device state; the copy is ordered on the
        // runtime's stream, where every draw runs, and `words` is staged by the driver
        // before the call returns (pageable source).
        unsafe { crate::driver::copy_htod(ptr, words.as_slice(), rt.stream().cu_stream()) }?;
        Ok(())
    }

    /// Copies seed and offset into `into`, on the device (capturable).
    pub fn save_state(&self, rt: &Runtime, into: &mut RngState) -> Result<(), GraphError> {
        let src = self.state_ptr(rt);
        let (dst, _sync) = into.buf.device_ptr_mut(rt.stream());
        // SAFETY: both are live device buffers of at least 2 words; the copy is ordered on
        // the runtime's stream with the draws.
        unsafe { crate::driver::copy_dtod(dst, src, 16, rt.stream().cu_stream()) }?;
        Ok(())
    }

    /// Puts back the seed and offset saved in `from`, on the device (capturable).
    pub fn restore_state(&self, rt: &Runtime, from: &RngState) -> Result<(), GraphError> {
        let dst = self.state_ptr(rt);
        let (src, _sync) = from.buf.device_ptr(rt.stream());
        // SAFETY: as in `save_state`, in the other direction.
        unsafe { crate::driver::copy_dtod(dst, src, 16, rt.stream().cu_stream()) }?;
        Ok(())
    }
}

/// Every generator of a runtime as it was before a capture's warmup runs, so that the
/// warmup's draws can be undone (see the module docs).
///
/// Seed and offset are read to the host (one read per generator, in stream order) and
/// written back only when the warmup changed them: a capture allocates and frees no device
/// snapshot, and a body that draws nothing queues no copy before its capture.
pub(crate) struct WarmupSnapshot {
    /// Each generator with its seed and offset before the warmup.
    saved: Vec<(Generator, u64, u64)>,
}

impl WarmupSnapshot {
    /// Reads the seed and offset of every live generator of `rt`.
    pub(crate) fn take(rt: &Runtime) -> Result<Self, GraphError> {
        crate::phase::start_noting_generators();
        let saved = rt
            .live_generators()
            .into_iter()
            .map(|g| {
                let (seed, offset) = g.seed_and_offset(rt)?;
                Ok((g, seed, offset))
            })
            .collect::<Result<_, GraphError>>()?;
        Ok(WarmupSnapshot { saved })
    }

    /// Puts back every generator the warmup drew from (on this thread: another thread may
    /// draw from a generator of a shared runtime meanwhile, and keeps what it drew) and
    /// reports how far `warmup` runs moved each one that moved, per run.
    pub(crate) fn restore(self, rt: &Runtime, warmup: u32) -> Result<Vec<RngAdvance>, GraphError> {
        let used = crate::phase::take_generators_used();
        let mut moved = Vec::new();
        for (g, seed, before) in self.saved {
            if !used.contains(&g.id()) {
                continue;
            }
            let (seed_after, after) = g.seed_and_offset(rt)?;
            if after != before {
                moved.push(RngAdvance {
                    generator: g.id(),
                    counters_per_replay: after.wrapping_sub(before) / u64::from(warmup),
                });
            }
            if (seed_after, after) != (seed, before) {
                g.write_seed_and_offset(rt, seed, before)?;
            }
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_kernels_are_built_on_the_device_api() {
        assert!(RNG_KERNELS.starts_with(PHILOX_DEVICE_API));
        for name in [
            <f32 as RandomFloat>::UNIFORM_KERNEL,
            <half::f16 as RandomFloat>::UNIFORM_KERNEL,
            <half::bf16 as RandomFloat>::UNIFORM_KERNEL,
            <f32 as RandomFloat>::NORMAL_KERNEL,
            <half::f16 as RandomFloat>::NORMAL_KERNEL,
            <half::bf16 as RandomFloat>::NORMAL_KERNEL,
            <u8 as BernoulliOutput>::SCALAR_KERNEL,
            <f32 as BernoulliOutput>::SCALAR_KERNEL,
            <u8 as BernoulliOutput>::PER_ELEMENT_KERNEL,
            <f32 as BernoulliOutput>::PER_ELEMENT_KERNEL,
            <u32 as RandomInt>::KERNEL,
            <i32 as RandomInt>::KERNEL,
            <i64 as RandomInt>::KERNEL,
            "rng_exponential_f32",
            "rng_dropout_f32",
        ] {
            // Defined once: written out (`__global__ void name(`) or made by one of the
            // source's kernel macros (a line `RNG_NORMAL(name, …)`).
            let word = |&(i, _): &(usize, &str)| {
                let edge = |c: Option<char>| !c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                edge(RNG_KERNELS[..i].chars().next_back())
                    && edge(RNG_KERNELS[i + name.len()..].chars().next())
            };
            let spots: Vec<usize> = RNG_KERNELS
                .match_indices(name)
                .filter(word)
                .map(|(i, _)| i)
                .collect();
            assert_eq!(spots.len(), 1, "kernel {name} is named once");
            let before = &RNG_KERNELS[..spots[0]];
            let line = before.rsplit_once('\n').map_or(before, |(_, line)| line);
            assert!(
                line.ends_with("extern \"C\" __global__ void ")
                    || (line.starts_with("RNG_") && line.ends_with('(')),
                "kernel {name} is defined, not only mentioned: {line:?}"
            );
        }
        // The kernel macros are undefined at the end: none leaks into a source that adds to
        // this one.
        for def in RNG_KERNELS
            .lines()
            .filter_map(|l| l.strip_prefix("#define RNG_"))
        {
            let name = def.split(['(', ' ']).next().unwrap_or_default();
            assert!(
                RNG_KERNELS.contains(&format!("#undef RNG_{name}\n")),
                "RNG_{name}"
            );
        }
        // The device API defines no kernels of its own and holds no `typedef`s that could
        // clash with a user's.
        assert!(!PHILOX_DEVICE_API.contains("__global__"));
        assert!(!PHILOX_DEVICE_API.contains("typedef"));
        assert_eq!(PHILOX_DEVICE_API, crate::philox_device_api!());
    }

    #[test]
    fn a_kernel_arg_is_one_device_pointer() {
        assert_eq!(std::mem::size_of::<RngKernelArg<'_>>(), 8);
        assert_eq!(std::mem::align_of::<RngKernelArg<'_>>(), 8);
    }

    #[test]
    fn integer_ranges() {
        assert_eq!(<u32 as RandomInt>::span(3, 10), Some(7));
        assert_eq!(
            <u32 as RandomInt>::span(0, u32::MAX),
            Some(u64::from(u32::MAX))
        );
        assert_eq!(
            <i32 as RandomInt>::span(i32::MIN, i32::MAX),
            Some(u64::from(u32::MAX))
        );
        assert_eq!(<i64 as RandomInt>::span(i64::MIN, i64::MAX), Some(u64::MAX));
        assert_eq!(<i64 as RandomInt>::span(5, 5), None);
        assert_eq!(<i32 as RandomInt>::span(5, -5), None);
        assert_eq!(
            <i32 as RandomInt>::offset_by(i32::MIN, u64::from(u32::MAX) - 1),
            i32::MAX - 1
        );
        assert_eq!(
            <i64 as RandomInt>::offset_by(i64::MIN, u64::MAX - 1),
            i64::MAX - 1
        );
        assert_eq!(<u32 as RandomInt>::offset_by(7, 3), 10);
    }
}
