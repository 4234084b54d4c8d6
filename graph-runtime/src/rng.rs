//! Graph-safe random numbers: Philox4x32-10 generators whose seed and offset live on the
//! device and advance on the device.
//!
//! # Why this is graph-safe by construction
//! A random kernel needs a seed and a position (offset) in the random stream. If the offset
//! were a host value passed as a kernel argument, capture would bake it into the graph and
//! every replay would draw the same numbers: the silent failure PyTorch guards against by
//! asking users to register generators with each graph.
//!
//! Here a generator's state is 32 bytes of device memory: `[seed, offset, arrivals, 0]`.
//! Every random kernel reads seed and offset through a pointer, draws from Philox at
//! `offset + i`, and the last of its blocks to finish moves the offset past what the kernel
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
//! the first eager call would have.
//!
//! # Counter layout
//! Group `g` of a draw of `n` values (`g < ceil(n / 4)`) uses Philox with key = seed
//! (low, high 32 bits) and counter = `(lo32(offset + g), hi32(offset + g), 0, 0)`; its four
//! 32-bit outputs give values `4g .. 4g + 3`. A draw of `n` values advances the offset by
//! `ceil(n / 4)`. The result does not depend on the launch configuration.

use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use cudarc::driver::{
    result, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};

use crate::capture::{phase, Phase};
use crate::error::GraphError;
use crate::graph::RngAdvance;
use crate::runtime::Runtime;

/// The seed of [`Runtime::rng`], the runtime's default generator.
pub const DEFAULT_SEED: u64 = 0x5eed_c0de_2026;

/// CUDA source of the random kernels.
pub const RNG_KERNELS: &str = r#"
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
    #pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k.x += 0x9E3779B9u; k.y += 0xBB67AE85u; }
        u32 hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        u32 hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// [0, 1) with 24 random bits.
__device__ __forceinline__ float u01(u32 x) { return (float)(x >> 8) * 5.9604644775390625e-8f; }
// (0, 1] with 24 random bits, safe for logf.
__device__ __forceinline__ float u01_open0(u32 x) { return (float)((x >> 8) + 1u) * 5.9604644775390625e-8f; }

struct Draw {
    u64 offset;
    uint2 key;
};

// Reads seed and offset once per block.
__device__ __forceinline__ Draw begin_draw(const u64 *state) {
    __shared__ u64 s_seed, s_offset;
    if (threadIdx.x == 0) {
        s_seed = ((volatile const u64 *)state)[0];
        s_offset = ((volatile const u64 *)state)[1];
    }
    __syncthreads();
    Draw d;
    d.offset = s_offset;
    d.key = make_uint2((u32)s_seed, (u32)(s_seed >> 32));
    return d;
}

// Called by every thread of every block once it is done: the last block to arrive moves the
// offset past the `groups` counters this kernel consumed and resets the arrival count. Every
// block read the offset before arriving, so no block sees the new offset.
__device__ __forceinline__ void end_draw(u64 *state, u64 offset, u64 groups) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        u32 *arrivals = (u32 *)(state + 2);
        u32 before = atomicAdd(arrivals, 1u);
        if (before == gridDim.x - 1) {
            state[1] = offset + groups;
            *arrivals = 0u;
            __threadfence();
        }
    }
}

__device__ __forceinline__ uint4 group_bits(const Draw &d, u64 g) {
    u64 c = d.offset + g;
    return philox4x32_10(make_uint4((u32)c, (u32)(c >> 32), 0u, 0u), d.key);
}

extern "C" __global__ void rng_uniform_f32(u64 *state, float *out, u64 n, float lo, float span) {
    Draw d = begin_draw(state);
    u64 groups = (n + 3) / 4;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        uint4 r = group_bits(d, g);
        float4 v = make_float4(lo + span * u01(r.x), lo + span * u01(r.y), lo + span * u01(r.z), lo + span * u01(r.w));
        if (4 * g + 3 < n) {
            ((float4 *)out)[g] = v;
        } else {
            float t[4] = {v.x, v.y, v.z, v.w};
            for (u64 j = 0; 4 * g + j < n; ++j) out[4 * g + j] = t[j];
        }
    }
    end_draw(state, d.offset, groups);
}

extern "C" __global__ void rng_normal_f32(u64 *state, float *out, u64 n, float mean, float std) {
    Draw d = begin_draw(state);
    u64 groups = (n + 3) / 4;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        uint4 r = group_bits(d, g);
        // Box-Muller with the fast hardware approximations. The angle is uniform in [-pi, pi),
        // the range where __sincosf is most accurate (absolute error about 2^-21, the size of
        // one step of the 24-bit uniform angle).
        float s0, c0, s1, c1;
        float r0 = sqrtf(-2.0f * __logf(u01_open0(r.x)));
        float r1 = sqrtf(-2.0f * __logf(u01_open0(r.z)));
        __sincosf(6.2831853071795865f * u01(r.y) - 3.14159265358979f, &s0, &c0);
        __sincosf(6.2831853071795865f * u01(r.w) - 3.14159265358979f, &s1, &c1);
        float4 v = make_float4(mean + std * r0 * c0, mean + std * r0 * s0, mean + std * r1 * c1, mean + std * r1 * s1);
        if (4 * g + 3 < n) {
            ((float4 *)out)[g] = v;
        } else {
            float t[4] = {v.x, v.y, v.z, v.w};
            for (u64 j = 0; 4 * g + j < n; ++j) out[4 * g + j] = t[j];
        }
    }
    end_draw(state, d.offset, groups);
}

// y = keep ? x / keep_prob : 0, mask = keep, with keep = (uniform < keep_prob).
extern "C" __global__ void rng_dropout_f32(u64 *state, const float *x, float *y, unsigned char *mask,
                                           u64 n, float keep_prob) {
    Draw d = begin_draw(state);
    u64 groups = (n + 3) / 4;
    u64 stride = (u64)gridDim.x * blockDim.x;
    float scale = keep_prob > 0.0f ? 1.0f / keep_prob : 0.0f;
    for (u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        uint4 r = group_bits(d, g);
        u32 bits[4] = {r.x, r.y, r.z, r.w};
        for (u64 j = 0; j < 4 && 4 * g + j < n; ++j) {
            u64 i = 4 * g + j;
            bool keep = u01(bits[j]) < keep_prob;
            mask[i] = keep ? 1 : 0;
            y[i] = keep ? x[i] * scale : 0.0f;
        }
    }
    end_draw(state, d.offset, groups);
}
"#;

const THREADS: u32 = 256;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct GeneratorInner {
    /// `[seed, offset, arrivals (low 32 bits), 0]`.
    state: CudaSlice<u64>,
    id: u64,
}

/// A Philox4x32-10 random generator whose seed and offset live in device memory.
///
/// Create one with [`Runtime::generator`], or use the runtime's default one,
/// [`Runtime::rng`]. Draws take `&self`: the state changes on the device, in stream order.
/// Clones share the same state.
///
/// Every draw is graph-safe with no registration: see the [module docs](crate::rng).
#[derive(Clone)]
pub struct Generator {
    inner: Arc<GeneratorInner>,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("id", &self.inner.id)
            .finish_non_exhaustive()
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
    match phase() {
        Phase::Capture { graph } => Err(GraphError::RngHostStateInCapture {
            op,
            instead,
            graph,
            location,
        }),
        _ => Ok(()),
    }
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

    fn state_ptr(&self, rt: &Runtime) -> u64 {
        let (ptr, _sync) = self.inner.state.device_ptr(rt.stream());
        ptr
    }

    fn launch_config(rt: &Runtime, n: usize) -> LaunchConfig {
        let groups = n.div_ceil(4) as u64;
        let wanted = groups.div_ceil(THREADS as u64).max(1);
        let cap = (rt.multiprocessors() as u64 * 16).max(1);
        LaunchConfig {
            grid_dim: (wanted.min(cap) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Fills `out` with values uniform in `[lo, hi)` (24 random bits each).
    pub fn uniform(
        &self,
        rt: &Runtime,
        out: &mut CudaSlice<f32>,
        lo: f32,
        hi: f32,
    ) -> Result<(), GraphError> {
        self.fill(rt, "rng_uniform_f32", out, lo, hi - lo)
    }

    /// Fills `out` with normal values of the given mean and standard deviation (Box–Muller).
    pub fn normal(
        &self,
        rt: &Runtime,
        out: &mut CudaSlice<f32>,
        mean: f32,
        std: f32,
    ) -> Result<(), GraphError> {
        self.fill(rt, "rng_normal_f32", out, mean, std)
    }

    /// Launches one of the fill kernels, which all take `(state, out, n, a, b)`.
    fn fill(
        &self,
        rt: &Runtime,
        kernel: &str,
        out: &mut CudaSlice<f32>,
        a: f32,
        b: f32,
    ) -> Result<(), GraphError> {
        let f = rt.function(RNG_KERNELS, kernel)?;
        let (state, n) = (self.state_ptr(rt), out.len() as u64);
        let cfg = Self::launch_config(rt, out.len());
        // SAFETY: `state` points to this generator's 4-word state; every fill kernel writes
        // exactly `n` floats of `out`, which holds `n`, and reads two float parameters.
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&state)
                .arg(out)
                .arg(&n)
                .arg(&a)
                .arg(&b)
                .launch(cfg)?;
        }
        Ok(())
    }

    /// Dropout: keeps each element of `x` with probability `1 - p`, scaled by `1 / (1 - p)`,
    /// writes the result to `y` and the kept elements (1) to `mask`.
    ///
    /// # Panics
    /// If `p` is not in `[0, 1]` or the three buffers differ in length.
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
        let f = rt.function(RNG_KERNELS, "rng_dropout_f32")?;
        let (state, n, keep) = (self.state_ptr(rt), x.len() as u64, 1.0 - p);
        let cfg = Self::launch_config(rt, x.len());
        // SAFETY: the kernel reads `n` floats of `x` and writes `n` of `y` and `mask`; all
        // three hold `n` (checked above).
        unsafe {
            rt.stream()
                .launch_builder(&f)
                .arg(&state)
                .arg(x)
                .arg(y)
                .arg(mask)
                .arg(&n)
                .arg(&keep)
                .launch(cfg)?;
        }
        Ok(())
    }

    /// Reads the seed and the offset (in Philox counters) on the host. Waits for the
    /// runtime's stream.
    ///
    /// Inside a captured body this is refused with [`GraphError::RngHostStateInCapture`]: a
    /// host read would happen once, at capture. Use [`Generator::save_state`] there.
    #[track_caller]
    pub fn state(&self, rt: &Runtime) -> Result<(u64, u64), GraphError> {
        refuse_in_capture(
            "Generator::state",
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
    pub fn set_state(&self, rt: &Runtime, seed: u64, offset: u64) -> Result<(), GraphError> {
        refuse_in_capture(
            "Generator::set_state",
            "Generator::restore_state",
            Location::caller(),
        )?;
        self.write_words(rt, &[seed, offset, 0, 0])
    }

    /// Restarts the generator at `seed`, offset 0 (host side; refused inside a capture like
    /// [`Generator::set_state`]).
    #[track_caller]
    pub fn manual_seed(&self, rt: &Runtime, seed: u64) -> Result<(), GraphError> {
        refuse_in_capture(
            "Generator::manual_seed",
            "Generator::restore_state",
            Location::caller(),
        )?;
        self.write_words(rt, &[seed, 0, 0, 0])
    }

    fn write_words(&self, rt: &Runtime, words: &[u64; 4]) -> Result<(), GraphError> {
        let ptr = self.state_ptr(rt);
        // SAFETY: `ptr` is this generator's 4-word device state; the copy is ordered on the
        // runtime's stream, where every draw runs, and `words` is staged by the driver
        // before the call returns (pageable source).
        unsafe { result::memcpy_htod_async(ptr, words.as_slice(), rt.stream().cu_stream()) }?;
        Ok(())
    }

    /// Copies seed and offset into `into`, on the device (capturable).
    pub fn save_state(&self, rt: &Runtime, into: &mut RngState) -> Result<(), GraphError> {
        let src = self.state_ptr(rt);
        let (dst, _sync) = into.buf.device_ptr_mut(rt.stream());
        // SAFETY: both are live device buffers of at least 2 words; the copy is ordered on
        // the runtime's stream with the draws.
        unsafe { result::memcpy_dtod_async(dst, src, 16, rt.stream().cu_stream()) }?;
        Ok(())
    }

    /// Puts back the seed and offset saved in `from`, on the device (capturable).
    pub fn restore_state(&self, rt: &Runtime, from: &RngState) -> Result<(), GraphError> {
        let dst = self.state_ptr(rt);
        let (src, _sync) = from.buf.device_ptr(rt.stream());
        // SAFETY: as in `save_state`, in the other direction.
        unsafe { result::memcpy_dtod_async(dst, src, 16, rt.stream().cu_stream()) }?;
        Ok(())
    }
}

/// Every generator of a runtime as it was before a capture's warmup runs, so that the
/// warmup's draws can be undone (see the module docs).
pub(crate) struct WarmupSnapshot {
    saved: Vec<(Generator, RngState, u64)>,
}

impl WarmupSnapshot {
    /// Saves every live generator of `rt` (on the device) and reads its offset.
    pub(crate) fn take(rt: &Runtime) -> Result<Self, GraphError> {
        let saved = rt
            .live_generators()
            .into_iter()
            .map(|g| {
                let mut snapshot = RngState::new(rt)?;
                g.save_state(rt, &mut snapshot)?;
                let offset = g.state(rt)?.1;
                Ok((g, snapshot, offset))
            })
            .collect::<Result<_, GraphError>>()?;
        Ok(WarmupSnapshot { saved })
    }

    /// Puts every generator back and reports how far `warmup` runs moved each one that
    /// moved, per run.
    pub(crate) fn restore(self, rt: &Runtime, warmup: u32) -> Result<Vec<RngAdvance>, GraphError> {
        let mut moved = Vec::new();
        for (g, snapshot, before) in self.saved {
            let after = g.state(rt)?.1;
            if after != before {
                moved.push(RngAdvance {
                    generator: g.id(),
                    counters_per_replay: after.wrapping_sub(before) / u64::from(warmup),
                });
            }
            g.restore_state(rt, &snapshot)?;
        }
        Ok(moved)
    }
}

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

/// What [`Generator::uniform`] with `lo = 0, hi = 1` writes at index `i` for `seed` and a
/// generator at `offset`: the host reference of the device kernels.
pub fn reference_uniform(seed: u64, offset: u64, i: u64) -> f32 {
    let c = offset + i / 4;
    let bits = philox4x32_10(
        [c as u32, (c >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    );
    (bits[(i % 4) as usize] >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_ne!(reference_uniform(9, 0, 0), reference_uniform(10, 0, 0));
    }
}
