//! Host references of every draw: what the device writes at index `i` for a generator with
//! `seed` at `offset`, computed on the CPU from the same Philox counters.
//!
//! Exact where the device math is exact (uniform, Bernoulli, integers, and 16-bit roundings of
//! uniform); within a stated tolerance where the device uses `logf` or the fast hardware
//! logarithm and sine (exponential, normal).

use super::types::{RandomFloat, RandomInt};

/// How far [`reference_exponential`] may be from the device, in units in the last place:
/// `logf` is within 1 ulp on the device (which can be 2 ulp of the quotient once divided by
/// `lambda`), the division and the reference's own rounding add half an ulp each.
pub const EXPONENTIAL_MAX_ULPS: u32 = 4;

/// How far [`reference_normal`] may be from the device, as a multiple of `|std|`. The device
/// uses the fast hardware logarithm (absolute error 2^-21.4 near 1), which only matters when
/// the radius `sqrt(-2 ln u)` is tiny (`u` within 10^-5 of 1, one value in about 10^5): there
/// the error can reach `sqrt(2 × 2^-21.4) ≈ 8.5e-4`. Elsewhere the two agree to about 10^-6.
pub const NORMAL_TOLERANCE: f32 = 1e-3;

/// The Philox4x32-10 block function on the host, for checks and reference values.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(0x9E37_79B9);
            k[1] = k[1].wrapping_add(0xBB67_AE85);
        }
        let p0 = 0xD251_1F53u64 * c[0] as u64;
        let p1 = 0xCD9E_8D57u64 * c[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The four random words of counter `offset + g` for `seed`: what `philox_group(d, g)`
/// returns on the device.
pub fn reference_group(seed: u64, offset: u64, g: u64) -> [u32; 4] {
    let c = offset.wrapping_add(g);
    philox4x32_10(
        [c as u32, (c >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// The 32 random bits behind value `i` of a one-word-per-value draw (uniform, normal,
/// Bernoulli, exponential, dropout): word `i % 4` of counter `offset + i / 4`.
pub fn reference_bits(seed: u64, offset: u64, i: u64) -> u32 {
    reference_group(seed, offset, i / 4)[(i % 4) as usize]
}

/// `[0, 1)` from the top 24 bits (`philox_u01`).
fn u01(x: u32) -> f32 {
    (x >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// `(0, 1]` from the top 24 bits (`philox_u01_open0`).
fn u01_open0(x: u32) -> f64 {
    ((x >> 8) + 1) as f64 / 16_777_216.0
}

/// `(0, 1)`: odd multiples of 2^-24 (`philox_u01_open`).
fn u01_open(x: u32) -> f64 {
    ((x >> 8) | 1) as f64 / 16_777_216.0
}

/// What [`Generator::uniform`](crate::Generator::uniform) with `lo = 0, hi = 1` writes at
/// index `i` for `seed` and a generator at `offset`: the host reference of the device kernels.
pub fn reference_uniform(seed: u64, offset: u64, i: u64) -> f32 {
    u01(reference_bits(seed, offset, i))
}

/// What [`Generator::uniform`](crate::Generator::uniform) writes at index `i` into a buffer of
/// `T` (`f32`, `f16` or `bf16`) for `[lo, hi)`: bit for bit.
///
/// The value is `fma(hi − lo, u, lo)` in `f32`, rounded to `T`; one that lands on `hi` or above
/// (by rounding) is replaced by `lo`, so the result stays below `hi`.
pub fn reference_uniform_in<T: RandomFloat>(seed: u64, offset: u64, i: u64, lo: f32, hi: f32) -> T {
    let v = (hi - lo).mul_add(reference_uniform(seed, offset, i), lo);
    let v = if v < hi { v } else { lo };
    let t = T::round_from_f32(v);
    if t.to_f32() < hi {
        t
    } else {
        T::round_from_f32(lo)
    }
}

/// What [`Generator::normal`](crate::Generator::normal) writes at index `i` into an `f32`
/// buffer, computed in `f64`: within [`NORMAL_TOLERANCE`]` × |std|` of the device.
///
/// Values `4g, 4g + 1` come from Box–Muller on words `(x, y)` of counter `offset + g`
/// (radius from `x`, angle from `y`; cosine first, then sine), values `4g + 2, 4g + 3` from
/// `(z, w)`.
pub fn reference_normal(seed: u64, offset: u64, i: u64, mean: f32, std: f32) -> f32 {
    let r = reference_group(seed, offset, i / 4);
    let j = (i % 4) as usize;
    let (radius_word, angle_word) = if j < 2 { (r[0], r[1]) } else { (r[2], r[3]) };
    let radius = (-2.0 * u01_open0(radius_word).ln()).sqrt();
    let angle = std::f64::consts::TAU * u01(angle_word) as f64 - std::f64::consts::PI;
    let z = if j.is_multiple_of(2) {
        radius * angle.cos()
    } else {
        radius * angle.sin()
    };
    (mean as f64 + std as f64 * z) as f32
}

/// What [`Generator::bernoulli`](crate::Generator::bernoulli) (and
/// [`bernoulli_per_element`](crate::Generator::bernoulli_per_element) with `probs[i] = p`)
/// draws at index `i`: `true` when the 24-bit uniform of value `i` is below `p`. Exact.
///
/// The success probability is therefore `ceil(p × 2^24) / 2^24`: within 2^-24 of `p`.
pub fn reference_bernoulli(seed: u64, offset: u64, i: u64, p: f32) -> bool {
    reference_uniform(seed, offset, i) < p
}

/// What [`Generator::exponential`](crate::Generator::exponential) writes at index `i`:
/// `−ln(u) / lambda` with `u = (2k + 1) / 2^24` in `(0, 1)` (`k` the top 23 bits of value
/// `i`'s word), in `f64` rounded to `f32`. Within [`EXPONENTIAL_MAX_ULPS`] of the device.
pub fn reference_exponential(seed: u64, offset: u64, i: u64, lambda: f32) -> f32 {
    (-u01_open(reference_bits(seed, offset, i)).ln() / lambda as f64) as f32
}

/// What [`Generator::integers`](crate::Generator::integers) writes at index `i` for
/// `[lo, hi)`: bit for bit.
///
/// A 32-bit type takes the 64 bits of words `2(i % 2)` (low) and `2(i % 2) + 1` (high) of
/// counter `offset + i / 2`; an `i64` takes the 128 bits of counter `offset + i` (`x` lowest).
/// The value is `lo` plus the top 64 bits of `bits × (hi − lo)`.
///
/// # Panics
/// If `lo >= hi`.
pub fn reference_integer<T: RandomInt>(seed: u64, offset: u64, i: u64, lo: T, hi: T) -> T {
    let span = T::span(lo, hi).unwrap_or_else(|| panic!("empty range [{lo:?}, {hi:?})"));
    let k = if T::PER_COUNTER == 2 {
        let r = reference_group(seed, offset, i / 2);
        let j = 2 * (i % 2) as usize;
        below64(r[j], r[j + 1], span)
    } else {
        below128(reference_group(seed, offset, i), span)
    };
    T::offset_by(lo, k)
}

/// The high 64 bits of `(hi:lo) × range`.
fn below64(lo: u32, hi: u32, range: u64) -> u64 {
    let bits = (u64::from(hi) << 32) | u64::from(lo);
    ((u128::from(bits) * u128::from(range)) >> 64) as u64
}

/// Bits 128..192 of `(w:z:y:x) × range`.
fn below128(r: [u32; 4], range: u64) -> u64 {
    let lo = (u64::from(r[1]) << 32) | u64::from(r[0]);
    let hi = (u64::from(r[3]) << 32) | u64::from(r[2]);
    let low_part = (u128::from(lo) * u128::from(range)) >> 64;
    ((u128::from(hi) * u128::from(range) + low_part) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn philox_matches_the_random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn reference_uniform_is_in_range_and_uses_consecutive_counters() {
        for i in 0..64 {
            let u = reference_uniform(42, 7, i);
            assert!((0.0..1.0).contains(&u));
        }
        // Index 4 of offset 0 is index 0 of offset 1.
        assert_eq!(reference_uniform(9, 0, 4), reference_uniform(9, 1, 0));
        assert_ne!(
            reference_uniform(9, 0, 0),
            reference_uniform(9 + (1 << 32), 0, 0)
        );
        assert_ne!(reference_uniform(9, 0, 0), reference_uniform(10, 0, 0));
    }

    #[test]
    fn uniform_in_is_the_fma_of_the_unit_draw_and_stays_below_hi() {
        for i in 0..4096 {
            let u = reference_uniform(3, 11, i);
            let v: f32 = reference_uniform_in(3, 11, i, -2.0, 3.0);
            assert_eq!(v, 5.0f32.mul_add(u, -2.0));
            assert!((-2.0..3.0).contains(&v));
            let h: f16 = reference_uniform_in(3, 11, i, 0.0, 1.0);
            let b: bf16 = reference_uniform_in(3, 11, i, 0.0, 1.0);
            assert!(h.to_f32() < 1.0 && b.to_f32() < 1.0, "{h} {b}");
            // The 16-bit values are the roundings of the f32 value, except at the top.
            if u < 0.99 {
                assert_eq!(h, f16::from_f32(u));
                assert_eq!(b, bf16::from_f32(u));
            }
        }
        // Words whose uniform rounds up to 1 in bf16 become lo: find one by search.
        let top = (0..200_000u64)
            .find(|&i| bf16::from_f32(reference_uniform(5, 0, i)).to_f32() >= 1.0)
            .expect("about one value in 512 rounds up to 1 in bf16");
        let b: bf16 = reference_uniform_in(5, 0, top, 0.0, 1.0);
        assert_eq!(b.to_f32(), 0.0);
        // In [1, 2) the f32 grid is coarser than the 24-bit uniform: values still stay below 2.
        for i in 0..4096 {
            let v: f32 = reference_uniform_in(5, 0, i, 1.0, 2.0);
            assert!((1.0..2.0).contains(&v), "{v}");
        }
    }

    #[test]
    fn normal_pairs_share_a_radius() {
        for g in 0..256 {
            let z: Vec<f64> = (0..4)
                .map(|j| reference_normal(8, 0, 4 * g + j, 0.0, 1.0) as f64)
                .collect();
            let r0 = (z[0] * z[0] + z[1] * z[1]).sqrt();
            let r = reference_group(8, 0, g);
            let want = (-2.0 * u01_open0(r[0]).ln()).sqrt();
            assert!((r0 - want).abs() < 1e-5, "group {g}: {r0} vs {want}");
        }
        let z = reference_normal(8, 0, 5, 10.0, 0.5);
        assert!((z - 10.0 - 0.5 * reference_normal(8, 0, 5, 0.0, 1.0)).abs() < 1e-5);
    }

    #[test]
    fn bernoulli_and_exponential_follow_the_unit_draw() {
        for i in 0..1024 {
            let u = reference_uniform(1, 2, i);
            assert_eq!(reference_bernoulli(1, 2, i, 0.3), u < 0.3);
            assert!(!reference_bernoulli(1, 2, i, 0.0));
            assert!(reference_bernoulli(1, 2, i, 1.0));
            let e = reference_exponential(1, 2, i, 2.0);
            assert!(e > 0.0 && e.is_finite(), "{e}");
            assert!(e <= 16.7 / 2.0);
        }
    }

    #[test]
    fn integers_cover_their_range_and_only_it() {
        let mut seen = [0u32; 7];
        for i in 0..7000 {
            let v = reference_integer::<i32>(4, 0, i, -3, 4);
            assert!((-3..4).contains(&v));
            seen[(v + 3) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
        for i in 0..1000 {
            let v = reference_integer::<u32>(4, 0, i, 10, u32::MAX);
            assert!(v >= 10);
            let w = reference_integer::<i64>(4, 0, i, i64::MIN, i64::MAX);
            assert!(w < i64::MAX);
            let x = reference_integer::<i64>(4, 0, i, -5, -4);
            assert_eq!(x, -5);
        }
        // Two 32-bit values per counter, one i64 per counter.
        let r = reference_group(4, 9, 0);
        assert_eq!(
            reference_integer::<u32>(4, 9, 1, 0, 1 << 31),
            (((u64::from(r[3]) << 32 | u64::from(r[2])) as u128 * (1u128 << 31)) >> 64) as u32
        );
        assert_eq!(
            reference_integer::<i64>(4, 9, 0, 0, i64::MAX),
            below128(r, i64::MAX as u64) as i64
        );
    }

    #[test]
    fn below128_is_the_top_of_the_192_bit_product() {
        // range = 2^k: the top k bits of the 128-bit number.
        let r = [0x89ab_cdef, 0x0123_4567, 0xdead_beef, 0xf00d_cafe];
        let bits = (u128::from(r[3]) << 96)
            | (u128::from(r[2]) << 64)
            | (u128::from(r[1]) << 32)
            | u128::from(r[0]);
        for k in [1u32, 7, 32, 63] {
            assert_eq!(below128(r, 1u64 << k), (bits >> (128 - k)) as u64);
        }
        assert_eq!(below128([u32::MAX; 4], u64::MAX), u64::MAX - 1);
        assert_eq!(below128([0; 4], u64::MAX), 0);
        assert_eq!(below64(u32::MAX, u32::MAX, 1000), 999);
    }
}
