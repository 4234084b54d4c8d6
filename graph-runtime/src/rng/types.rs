//! The element types the generators write, and what each needs: its kernel, how many values
//! one Philox counter gives, and its host-side rounding.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for u8 {}
    impl Sealed for u32 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// Element types that [`Generator::uniform`](crate::Generator::uniform) and
/// [`Generator::normal`](crate::Generator::normal) write: `f32`, [`half::f16`] and
/// [`half::bf16`].
///
/// Every value is computed in `f32` exactly as for an `f32` buffer, then rounded to nearest
/// even, so a 16-bit draw is the rounding of the `f32` draw from the same seed and offset
/// (for `uniform`, a value that rounds up to `hi` becomes `lo`, as in PyTorch).
///
/// Sealed: the kernels exist for these three types only.
pub trait RandomFloat: DeviceRepr + ValidAsZeroBits + Copy + sealed::Sealed + 'static {
    /// The type's name in kernel names and messages: `f32`, `f16` or `bf16`.
    const NAME: &'static str;
    /// The kernel of [`Generator::uniform`](crate::Generator::uniform) for this type.
    const UNIFORM_KERNEL: &'static str;
    /// The kernel of [`Generator::normal`](crate::Generator::normal) for this type.
    const NORMAL_KERNEL: &'static str;
    /// Rounds an `f32` to this type (to nearest even), as the kernels do.
    fn round_from_f32(v: f32) -> Self;
    /// The value as an `f32` (exact).
    fn to_f32(self) -> f32;
}

impl RandomFloat for f32 {
    const NAME: &'static str = "f32";
    const UNIFORM_KERNEL: &'static str = "rng_uniform_f32";
    const NORMAL_KERNEL: &'static str = "rng_normal_f32";
    fn round_from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl RandomFloat for f16 {
    const NAME: &'static str = "f16";
    const UNIFORM_KERNEL: &'static str = "rng_uniform_f16";
    const NORMAL_KERNEL: &'static str = "rng_normal_f16";
    fn round_from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl RandomFloat for bf16 {
    const NAME: &'static str = "bf16";
    const UNIFORM_KERNEL: &'static str = "rng_uniform_bf16";
    const NORMAL_KERNEL: &'static str = "rng_normal_bf16";
    fn round_from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Element types that [`Generator::bernoulli`](crate::Generator::bernoulli) and
/// [`Generator::bernoulli_per_element`](crate::Generator::bernoulli_per_element) write:
/// `u8` and `f32`, 1 for success and 0 for failure.
///
/// Sealed: the kernels exist for these two types only.
pub trait BernoulliOutput: DeviceRepr + ValidAsZeroBits + Copy + sealed::Sealed + 'static {
    /// The kernel that draws with one probability for every element.
    const SCALAR_KERNEL: &'static str;
    /// The kernel that reads one probability per element.
    const PER_ELEMENT_KERNEL: &'static str;
    /// 1 for `true`, 0 for `false`.
    fn from_bool(success: bool) -> Self;
}

impl BernoulliOutput for u8 {
    const SCALAR_KERNEL: &'static str = "rng_bernoulli_u8";
    const PER_ELEMENT_KERNEL: &'static str = "rng_bernoulli_per_element_u8";
    fn from_bool(success: bool) -> Self {
        u8::from(success)
    }
}

impl BernoulliOutput for f32 {
    const SCALAR_KERNEL: &'static str = "rng_bernoulli_f32";
    const PER_ELEMENT_KERNEL: &'static str = "rng_bernoulli_per_element_f32";
    fn from_bool(success: bool) -> Self {
        if success {
            1.0
        } else {
            0.0
        }
    }
}

/// Integer types that [`Generator::integers`](crate::Generator::integers) writes: `u32`,
/// `i32` and `i64`.
///
/// A 32-bit value takes 64 random bits (two per Philox counter), an `i64` takes 128 (one per
/// counter), and the value is `lo + floor(bits × (hi − lo) / 2^bits)`: no rejection loop, so
/// the counter layout is fixed, and each value's probability is within 2^-32 (relative) of
/// `1 / (hi − lo)` for 32-bit types and within 2^-64 for `i64`.
///
/// Sealed: the kernels exist for these three types only.
pub trait RandomInt:
    DeviceRepr + ValidAsZeroBits + Copy + Ord + std::fmt::Debug + sealed::Sealed + 'static
{
    /// The kernel of [`Generator::integers`](crate::Generator::integers) for this type.
    const KERNEL: &'static str;
    /// Values per Philox counter (2 for 32-bit types, 1 for `i64`).
    const PER_COUNTER: u64;
    /// `hi − lo` as a `u64`, or `None` when the range is empty (`lo >= hi`).
    fn span(lo: Self, hi: Self) -> Option<u64>;
    /// `lo + k` for `k < span(lo, hi)` (cannot overflow there).
    fn offset_by(lo: Self, k: u64) -> Self;
}

impl RandomInt for u32 {
    const KERNEL: &'static str = "rng_integers_u32";
    const PER_COUNTER: u64 = 2;
    fn span(lo: Self, hi: Self) -> Option<u64> {
        (lo < hi).then(|| u64::from(hi - lo))
    }
    fn offset_by(lo: Self, k: u64) -> Self {
        lo.wrapping_add(k as u32)
    }
}

impl RandomInt for i32 {
    const KERNEL: &'static str = "rng_integers_i32";
    const PER_COUNTER: u64 = 2;
    fn span(lo: Self, hi: Self) -> Option<u64> {
        (lo < hi).then(|| u64::from(hi.wrapping_sub(lo) as u32))
    }
    fn offset_by(lo: Self, k: u64) -> Self {
        (lo as u32).wrapping_add(k as u32) as i32
    }
}

impl RandomInt for i64 {
    const KERNEL: &'static str = "rng_integers_i64";
    const PER_COUNTER: u64 = 1;
    fn span(lo: Self, hi: Self) -> Option<u64> {
        (lo < hi).then(|| hi.wrapping_sub(lo) as u64)
    }
    fn offset_by(lo: Self, k: u64) -> Self {
        (lo as u64).wrapping_add(k) as i64
    }
}
