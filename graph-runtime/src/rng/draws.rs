//! The draws of [`Generator`]: one library kernel launch each, on the runtime's stream.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{BernoulliOutput, Generator, RandomFloat, RandomInt, RNG_KERNELS};
use crate::error::GraphError;
use crate::launch::EarlyLaunch;
use crate::runtime::Runtime;

/// Threads per block of the library's kernels (their grids are capped and grid-stride).
const THREADS: u32 = 256;

impl Generator {
    /// Launches the library kernel `kernel` early on the runtime's stream, over `groups`
    /// counters: its grid is capped and grid-stride, its first argument is this generator's
    /// state, and `args` pushes the rest.
    ///
    /// # Safety
    /// `args` pushes the kernel's parameters after the state and the step condition, in
    /// order and type, and every
    /// buffer among them holds what the kernel addresses for the `n` it is given (the random
    /// kernels address `n` elements of each buffer and no more). A buffer the kernel stores
    /// to with 4-element vector stores starts at an allocation.
    ///
    /// The early-launch contract holds for every library kernel: each starts with
    /// `griddepcontrol.wait`, so an early launch touches nothing before the kernel ahead of
    /// it has finished.
    unsafe fn draw(
        &self,
        rt: &Runtime,
        kernel: &str,
        groups: u64,
        args: impl FnOnce(&mut EarlyLaunch<'_>),
    ) -> Result<(), GraphError> {
        let f = rt.function(RNG_KERNELS, kernel)?;
        let wanted = groups.div_ceil(u64::from(THREADS)).max(1);
        let cap = (u64::from(rt.multiprocessors()) * 16).max(1);
        let cfg = LaunchConfig {
            grid_dim: (wanted.min(cap) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = rt.launch_early(&f);
        // In a step of `graph_while_unrolled`, the step's condition: a step after the loop
        // stopped draws nothing (see `RNG_KERNELS`).
        crate::phase::note_generator(self.id());
        let step = crate::conditional::step_condition();
        launch
            .arg(self.state_ptr(rt))
            .arg(step.handle())
            .arg(step.flag());
        args(&mut launch);
        // SAFETY: the state is this generator's 4-word state, the kernel's first parameter;
        // the caller vouches for the other arguments and the buffers, and the library's
        // kernels keep the early-launch contract (see above).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Fills `out` with values uniform in `[lo, hi)`: 24 random bits each, computed in `f32`
    /// and rounded to `T` (`f32`, [`half::f16`] or [`half::bf16`]). A value that would round
    /// up to `hi` is `lo` instead. Host reference: [`reference_uniform_in`](super::reference_uniform_in) (bit for bit).
    pub fn uniform<T: RandomFloat>(
        &self,
        rt: &Runtime,
        out: &mut CudaSlice<T>,
        lo: f32,
        hi: f32,
    ) -> Result<(), GraphError> {
        let n = out.len() as u64;
        // SAFETY: `rng_uniform_<T>(state, T *out, n, lo, hi)` writes the `n` elements `out`
        // holds; `out` is a whole `CudaSlice`, so it starts at an allocation.
        unsafe {
            self.draw(rt, T::UNIFORM_KERNEL, n.div_ceil(4), |l| {
                l.buf_mut(out).arg(n).arg(lo).arg(hi);
            })
        }
    }

    /// Fills `out` with normal values of the given mean and standard deviation (Box–Muller
    /// with the fast hardware logarithm and sine), computed in `f32` and rounded to `T`
    /// (`f32`, [`half::f16`] or [`half::bf16`]). Host reference: [`reference_normal`](super::reference_normal), within
    /// [`NORMAL_TOLERANCE`](super::NORMAL_TOLERANCE)` × |std|`.
    pub fn normal<T: RandomFloat>(
        &self,
        rt: &Runtime,
        out: &mut CudaSlice<T>,
        mean: f32,
        std: f32,
    ) -> Result<(), GraphError> {
        let n = out.len() as u64;
        // SAFETY: `rng_normal_<T>(state, T *out, n, mean, std)`: as in `uniform`.
        unsafe {
            self.draw(rt, T::NORMAL_KERNEL, n.div_ceil(4), |l| {
                l.buf_mut(out).arg(n).arg(mean).arg(std);
            })
        }
    }

    /// Fills `out` with independent Bernoulli draws: 1 with probability `p`, else 0
    /// (`torch.bernoulli` with a scalar probability). The success probability is
    /// `ceil(p × 2^24) / 2^24`, within 2^-24 of `p`. Host reference: [`reference_bernoulli`](super::reference_bernoulli)
    /// (bit for bit).
    ///
    /// # Panics
    /// If `p` is not in `[0, 1]`.
    #[track_caller]
    pub fn bernoulli<T: BernoulliOutput>(
        &self,
        rt: &Runtime,
        out: &mut CudaSlice<T>,
        p: f32,
    ) -> Result<(), GraphError> {
        assert!(
            (0.0..=1.0).contains(&p),
            "bernoulli probability {p} is not in [0, 1]"
        );
        let n = out.len() as u64;
        // SAFETY: `rng_bernoulli_<T>(state, T *out, n, p)`: as in `uniform`.
        unsafe {
            self.draw(rt, T::SCALAR_KERNEL, n.div_ceil(4), |l| {
                l.buf_mut(out).arg(n).arg(p);
            })
        }
    }

    /// Fills `out[i]` with 1 with probability `probs[i]`, else 0 (`torch.bernoulli(probs)`).
    /// The probabilities stay on the device, so they can change between replays (an input
    /// or state of the graph). They are not checked there: a probability below 0 (or NaN)
    /// never succeeds, one above 1 always does. Host reference: [`reference_bernoulli`](super::reference_bernoulli) with
    /// `p = probs[i]` (bit for bit).
    ///
    /// # Panics
    /// If `probs` and `out` differ in length.
    #[track_caller]
    pub fn bernoulli_per_element<T: BernoulliOutput>(
        &self,
        rt: &Runtime,
        probs: &CudaSlice<f32>,
        out: &mut CudaSlice<T>,
    ) -> Result<(), GraphError> {
        assert_eq!(
            probs.len(),
            out.len(),
            "bernoulli_per_element: {} probabilities for {} outputs",
            probs.len(),
            out.len()
        );
        let n = out.len() as u64;
        // SAFETY: `rng_bernoulli_per_element_<T>(state, const float *probs, T *out, n)`
        // reads `n` floats of `probs` and writes `n` elements of `out`; both hold `n`
        // (checked above) and `out` is a whole `CudaSlice`.
        unsafe {
            self.draw(rt, T::PER_ELEMENT_KERNEL, n.div_ceil(4), |l| {
                l.buf(probs).buf_mut(out).arg(n);
            })
        }
    }

    /// Fills `out` with exponential values of rate `lambda` (mean `1 / lambda`), as
    /// `Tensor.exponential_(lambd)`: `−logf(u) / lambda` with `u` uniform in `(0, 1)` (23
    /// random bits), so no value is 0 or infinite (at most `16.64 / lambda`). Host
    /// reference: [`reference_exponential`](super::reference_exponential), within [`EXPONENTIAL_MAX_ULPS`](super::EXPONENTIAL_MAX_ULPS) ulp.
    ///
    /// # Panics
    /// If `lambda` is not a positive finite number.
    #[track_caller]
    pub fn exponential(
        &self,
        rt: &Runtime,
        out: &mut CudaSlice<f32>,
        lambda: f32,
    ) -> Result<(), GraphError> {
        assert!(
            lambda > 0.0 && lambda.is_finite(),
            "exponential rate {lambda} is not a positive finite number"
        );
        let n = out.len() as u64;
        // SAFETY: `rng_exponential_f32(state, float *out, n, lambda)`: as in `uniform`.
        unsafe {
            self.draw(rt, "rng_exponential_f32", n.div_ceil(4), |l| {
                l.buf_mut(out).arg(n).arg(lambda);
            })
        }
    }

    /// Fills `out` with integers uniform in `[lo, hi)` (`torch.randint(lo, hi)`), of type
    /// `T` (`u32`, `i32` or `i64`). Each value takes 64 random bits (128 for `i64`) and is
    /// `lo + floor(bits × (hi − lo) / 2^bits)`: no rejection loop, and each value's
    /// probability is within 2^-32 (2^-64 for `i64`) of `1 / (hi − lo)`, relative. Host
    /// reference: [`reference_integer`](super::reference_integer) (bit for bit).
    ///
    /// # Panics
    /// If `lo >= hi`.
    #[track_caller]
    pub fn integers<T: RandomInt>(
        &self,
        rt: &Runtime,
        out: &mut CudaSlice<T>,
        lo: T,
        hi: T,
    ) -> Result<(), GraphError> {
        let span = T::span(lo, hi)
            .unwrap_or_else(|| panic!("integers: the range [{lo:?}, {hi:?}) is empty"));
        let n = out.len() as u64;
        // SAFETY: `rng_integers_<T>(state, T *out, n, T lo, unsigned long long span)`: `lo`
        // is passed as the kernel's `T`, the kernel writes exactly `n` elements of `out`,
        // which holds `n`.
        unsafe {
            self.draw(rt, T::KERNEL, n.div_ceil(T::PER_COUNTER), |l| {
                l.buf_mut(out).arg(n).arg(lo).arg(span);
            })
        }
    }

    /// Dropout: keeps each element of `x` with probability `1 - p`, scaled by `1 / (1 - p)`,
    /// writes the result to `y` and the kept elements (1) to `mask`.
    ///
    /// # Panics
    /// If `p` is not in `[0, 1]` or the three buffers differ in length.
    #[track_caller]
    pub fn dropout(
        &self,
        rt: &Runtime,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        mask: &mut CudaSlice<u8>,
        p: f32,
    ) -> Result<(), GraphError> {
        assert!(
            (0.0..=1.0).contains(&p),
            "dropout probability {p} is not in [0, 1]"
        );
        assert!(
            x.len() == y.len() && x.len() == mask.len(),
            "dropout buffers differ in length: x {}, y {}, mask {}",
            x.len(),
            y.len(),
            mask.len()
        );
        let (n, keep) = (x.len() as u64, 1.0 - p);
        // SAFETY: `rng_dropout_f32(state, const float *x, float *y, unsigned char *mask, n,
        // keep)` reads `n` floats of `x` and writes `n` of `y` and `mask`; all three hold `n`
        // (checked above).
        unsafe {
            self.draw(rt, "rng_dropout_f32", n.div_ceil(4), |l| {
                l.buf(x).buf_mut(y).buf_mut(mask).arg(n).arg(keep);
            })
        }
    }
}
