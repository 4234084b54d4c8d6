//! The CUDA side of the generators: the device API that the library's random kernels and
//! user kernels share, and the library's kernels built on it.

/// Expands to the CUDA source of [`PHILOX_DEVICE_API`] as a string literal, so that a kernel
/// source can be put together at compile time:
///
/// ```
/// const SRC: &str = concat!(graph_runtime::philox_device_api!(), r#"
/// extern "C" __global__ void noise(unsigned long long *rng, float *out, unsigned long long n) {
///     PhiloxDraw d = philox_begin(rng);
///     /* … */
///     philox_end(rng, d, (n + 3) / 4);
/// }
/// "#);
/// # assert!(SRC.contains("philox_begin"));
/// ```
///
/// [`Runtime::function`](crate::Runtime::function) takes a `&'static str` (it caches the
/// compiled module by the source's address), which is why the header comes as a macro as
/// well as a constant. See [`crate::rng`] for the contract a kernel must keep.
#[macro_export]
macro_rules! philox_device_api {
    () => {
        r#"
// ---- graph_runtime::rng device API: Philox4x32-10 with seed and offset in device memory ----
// Contract (docs of graph_runtime::rng, "Drawing in your own kernels"): every thread of every
// block calls philox_begin before drawing and philox_end once, last; a kernel uses counters
// offset + g for g < groups only, and passes the same `groups` to philox_end in every block.
#ifndef GRAPH_RUNTIME_PHILOX_DEVICE_API
#define GRAPH_RUNTIME_PHILOX_DEVICE_API

// Philox4x32-10: four random 32-bit words for a 128-bit counter and a 64-bit key.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
    #pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k.x += 0x9E3779B9u; k.y += 0xBB67AE85u; }
        unsigned int hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// What one kernel draws from: the key (the seed) and the offset the generator had when the
// kernel started.
struct PhiloxDraw {
    unsigned long long offset;
    uint2 key;
};

// Reads the generator's seed and offset (state = Generator::kernel_arg). Every thread calls
// it before drawing; in an early-launched kernel, after griddepcontrol.wait.
__device__ __forceinline__ PhiloxDraw philox_begin(const unsigned long long *state) {
    const volatile unsigned long long *s = state;
    unsigned long long seed = s[0];
    PhiloxDraw d;
    d.offset = s[1];
    d.key = make_uint2((unsigned int)seed, (unsigned int)(seed >> 32));
    return d;
}

// The four random words of counter offset + g. Generator draws use them as values 4g .. 4g + 3.
__device__ __forceinline__ uint4 philox_group(const PhiloxDraw &d, unsigned long long g) {
    unsigned long long c = d.offset + g;
    return philox4x32_10(make_uint4((unsigned int)c, (unsigned int)(c >> 32), 0u, 0u), d.key);
}

// Word j (0..3) of a group.
__device__ __forceinline__ unsigned int philox_word(uint4 r, unsigned int j) {
    return j == 0 ? r.x : j == 1 ? r.y : j == 2 ? r.z : r.w;
}

// The 32 random bits of value i of a one-word-per-value draw: word i % 4 of group i / 4.
// For kernels with one thread per value (each group is computed by four threads).
__device__ __forceinline__ unsigned int philox_bits(const PhiloxDraw &d, unsigned long long i) {
    return philox_word(philox_group(d, i / 4), (unsigned int)(i % 4));
}

// Moves the generator past the `groups` counters this kernel used. Every thread of every block
// calls it exactly once, after its last use of the draw (it holds a __syncthreads). The last
// block to arrive writes the new offset and resets the arrival count; every block read the
// offset before arriving, so no block of this kernel sees the new one.
__device__ __forceinline__ void philox_end(unsigned long long *state, const PhiloxDraw &d,
                                           unsigned long long groups) {
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        __threadfence();
        unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
        unsigned int before = atomicAdd((unsigned int *)(state + 2), 1u);
        if (before == blocks - 1u) {
            ((volatile unsigned long long *)state)[1] = d.offset + groups;
            *(volatile unsigned int *)(state + 2) = 0u;
            __threadfence();
        }
    }
}

// [0, 1) from the top 24 bits of a word (the generator's uniform).
__device__ __forceinline__ float philox_u01(unsigned int x) {
    return (float)(x >> 8) * 5.9604644775390625e-8f;
}

// (0, 1] from the top 24 bits (never 0: safe for a logarithm).
__device__ __forceinline__ float philox_u01_open0(unsigned int x) {
    return (float)((x >> 8) + 1u) * 5.9604644775390625e-8f;
}

// (0, 1) from the top 23 bits: odd multiples of 2^-24, never 0 nor 1.
__device__ __forceinline__ float philox_u01_open(unsigned int x) {
    return (float)((x >> 8) | 1u) * 5.9604644775390625e-8f;
}

// Uniform in [lo, hi), as Generator::uniform writes it: a value that rounds up to hi is lo.
__device__ __forceinline__ float philox_uniform(unsigned int x, float lo, float hi) {
    float v = fmaf(hi - lo, philox_u01(x), lo);
    return v < hi ? v : lo;
}

// Four normal values from one group, as Generator::normal writes them: Box-Muller on the
// word pairs (x, y) and (z, w), with the fast hardware logarithm and sine/cosine.
__device__ __forceinline__ float4 philox_normal4(uint4 r, float mean, float std) {
    float s0, c0, s1, c1;
    float r0 = sqrtf(fmaxf(-2.0f * __logf(philox_u01_open0(r.x)), 0.0f));
    float r1 = sqrtf(fmaxf(-2.0f * __logf(philox_u01_open0(r.z)), 0.0f));
    __sincosf(fmaf(6.2831853071795865f, philox_u01(r.y), -3.14159265358979f), &s0, &c0);
    __sincosf(fmaf(6.2831853071795865f, philox_u01(r.w), -3.14159265358979f), &s1, &c1);
    float a0 = std * r0, a1 = std * r1;
    return make_float4(fmaf(a0, c0, mean), fmaf(a0, s0, mean), fmaf(a1, c1, mean), fmaf(a1, s1, mean));
}

// Exponential with rate lambda, as Generator::exponential writes it: -log(u) / lambda with u
// in (0, 1), so never 0 and never infinite (at most 16.64 / lambda).
__device__ __forceinline__ float philox_exponential(unsigned int x, float lambda) {
    return -logf(philox_u01_open(x)) / lambda;
}

// An integer in [0, range) from 64 random bits (lo word, hi word): the high half of
// bits * range. Each value has probability floor(2^64 / range) / 2^64 or one 2^-64 more.
__device__ __forceinline__ unsigned long long philox_below64(unsigned int lo, unsigned int hi,
                                                             unsigned long long range) {
    return __umul64hi(((unsigned long long)hi << 32) | lo, range);
}

// An integer in [0, range) from the 128 bits of a group (x lowest): the top 64 bits of the
// 192-bit product bits * range.
__device__ __forceinline__ unsigned long long philox_below128(uint4 r, unsigned long long range) {
    unsigned long long lo = ((unsigned long long)r.y << 32) | r.x;
    unsigned long long hi = ((unsigned long long)r.w << 32) | r.z;
    unsigned long long carry_in = __umul64hi(lo, range);
    unsigned long long mid = hi * range + carry_in;
    return __umul64hi(hi, range) + (mid < carry_in ? 1ull : 0ull);
}

// IEEE half and bfloat16 bit patterns (round to nearest even), without cuda_fp16.h.
__device__ __forceinline__ unsigned short philox_f32_to_f16(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

__device__ __forceinline__ float philox_f16_to_f32(unsigned short h) {
    float v;
    asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(h));
    return v;
}

__device__ __forceinline__ unsigned short philox_f32_to_bf16(float v) {
    unsigned int b = __float_as_uint(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((b >> 16) | 0x40u); // NaN
    return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float philox_bf16_to_f32(unsigned short h) {
    return __uint_as_float((unsigned int)h << 16);
}

// Uniform in [lo, hi) rounded to half / bfloat16: a value that rounds to hi or above is lo.
__device__ __forceinline__ unsigned short philox_uniform_f16(unsigned int x, float lo, float hi) {
    unsigned short h = philox_f32_to_f16(philox_uniform(x, lo, hi));
    return philox_f16_to_f32(h) < hi ? h : philox_f32_to_f16(lo);
}

__device__ __forceinline__ unsigned short philox_uniform_bf16(unsigned int x, float lo, float hi) {
    unsigned short h = philox_f32_to_bf16(philox_uniform(x, lo, hi));
    return philox_bf16_to_f32(h) < hi ? h : philox_f32_to_bf16(lo);
}

#endif // GRAPH_RUNTIME_PHILOX_DEVICE_API
"#
    };
}

/// CUDA source of the device API that kernels drawing from a [`Generator`](crate::Generator)
/// use; the library's own random kernels ([`RNG_KERNELS`]) are built from it, so a user kernel
/// that calls the same helpers draws bit for bit what the library draws.
///
/// Prepend it to a kernel source (at compile time with [`philox_device_api!`], since
/// [`Runtime::function`](crate::Runtime::function) wants a `&'static str`). It needs no
/// include files and defines, all `__device__ __forceinline__`:
///
/// | item | what it is |
/// | --- | --- |
/// | `uint4 philox4x32_10(uint4 counter, uint2 key)` | the block function ([`philox4x32_10`](super::philox4x32_10) on the host) |
/// | `struct PhiloxDraw { unsigned long long offset; uint2 key; }` | what a kernel draws from |
/// | `PhiloxDraw philox_begin(const unsigned long long *state)` | reads seed and offset; every thread, before drawing |
/// | `uint4 philox_group(const PhiloxDraw &d, unsigned long long g)` | the 4 words of counter `offset + g` |
/// | `unsigned int philox_bits(const PhiloxDraw &d, unsigned long long i)` | the word of value `i` (word `i % 4` of group `i / 4`), for one thread per value |
/// | `unsigned int philox_word(uint4 r, unsigned int j)` | word `j` of a group |
/// | `void philox_end(unsigned long long *state, const PhiloxDraw &d, unsigned long long groups)` | advances the offset by `groups`; every thread of every block, once, last |
/// | `float philox_u01(unsigned int)`, `philox_u01_open0`, `philox_u01_open` | `[0, 1)`, `(0, 1]`, `(0, 1)` |
/// | `float philox_uniform(unsigned int, float lo, float hi)` | one value of [`Generator::uniform`](crate::Generator::uniform) |
/// | `float4 philox_normal4(uint4, float mean, float std)` | the four values of a group of [`Generator::normal`](crate::Generator::normal) |
/// | `float philox_exponential(unsigned int, float lambda)` | one value of [`Generator::exponential`](crate::Generator::exponential) |
/// | `unsigned long long philox_below64(lo, hi, range)`, `philox_below128(uint4, range)` | an integer in `[0, range)` from 64 or 128 bits |
/// | `philox_f32_to_f16`, `philox_f32_to_bf16`, `philox_f16_to_f32`, `philox_bf16_to_f32` | half and bfloat16 bit patterns (`unsigned short`), round to nearest even |
/// | `philox_uniform_f16`, `philox_uniform_bf16` | one value of `uniform` into an `f16` / `bf16` buffer |
///
/// The whole text is guarded by `#ifndef GRAPH_RUNTIME_PHILOX_DEVICE_API`, so including it
/// twice is harmless. The contract a kernel keeps is in the [module docs](crate::rng).
pub const PHILOX_DEVICE_API: &str = philox_device_api!();

/// CUDA source of the library's random kernels: [`PHILOX_DEVICE_API`] and the conditional
/// device API followed by one kernel per draw (`rng_uniform_f32`, `rng_normal_bf16`,
/// `rng_integers_i64`, …). Each takes the generator state first and the two words of the
/// `GraphCondition` of the unrolled loop step it is recorded in next (in a step after the loop stopped it
/// draws nothing and leaves the generator as it is; `ConditionArg::always()` elsewhere),
/// and uses a grid-stride loop, so its result does not depend on the launch configuration.
pub const RNG_KERNELS: &str = concat!(
    philox_device_api!(),
    crate::condition_device_api!(),
    r#"
// ---- the kernels of graph_runtime::rng::Generator ----

// Every kernel below is launched early (graph_runtime::launch): it waits for the kernel ahead
// of it before it reads the generator state or touches a buffer, then lets the next kernel be
// scheduled. A next kernel launched the ordinary way is not affected. Before sm_90 both are
// left out and the kernels run in order.
__device__ __forceinline__ void rng_early() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ unsigned long long rng_first() {
    return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ unsigned long long rng_stride() {
    return (unsigned long long)gridDim.x * blockDim.x;
}

// Stores the four values of group g (values 4g .. 4g + 3, fewer at the tail).
template <typename T, typename V4>
__device__ __forceinline__ void rng_store4(T *out, unsigned long long g, unsigned long long n, V4 v) {
    if (4 * g + 3 < n) {
        ((V4 *)out)[g] = v;
    } else {
        T t[4] = {v.x, v.y, v.z, v.w};
        for (unsigned long long j = 0; 4 * g + j < n; ++j) out[4 * g + j] = t[j];
    }
}

// The frame of every kernel below, written once: waits for the kernel ahead (rng_early),
// returns at once in a step of graph_while_unrolled after the loop stopped (go_handle and
// go_flag, the step's GraphCondition; GRAPH_CONDITION_NONE everywhere else), reads the generator, runs the statements after GROUPS for every counter g < GROUPS in a
// grid-stride loop, with r the four words of counter g, and moves the generator past the
// GROUPS counters. The statements see the kernel's parameters (state, out, n, …) by name.
#define RNG_FOR_EACH_GROUP(GROUPS, ...)                                                           \
    rng_early();                                                                                 \
    if (!graph_condition_active(GraphCondition{go_handle, go_flag})) return;                     \
    PhiloxDraw d = philox_begin(state);                                                          \
    unsigned long long groups = GROUPS;                                                          \
    for (unsigned long long g = rng_first(); g < groups; g += rng_stride()) {                    \
        uint4 r = philox_group(d, g);                                                            \
        __VA_ARGS__                                                                              \
    }                                                                                            \
    philox_end(state, d, groups);

// A draw of four values per counter into out[0 .. n): group g stores the four values the
// arguments make of r (an expression whose type is the 4-vector of out's element type).
#define RNG_FILL4(...) RNG_FOR_EACH_GROUP((n + 3) / 4, rng_store4(out, g, n, __VA_ARGS__);)

// The four values F(word, the draw's parameters) of a group's words, put together by MAKE4.
#define RNG_EACH_WORD(MAKE4, F, ...)                                                              \
    MAKE4(F(r.x, __VA_ARGS__), F(r.y, __VA_ARGS__), F(r.z, __VA_ARGS__), F(r.w, __VA_ARGS__))

// rng_uniform_<t>(state, T *out, n, lo, hi): value j of a group is UNIFORM(word j, lo, hi).
#define RNG_UNIFORM(NAME, T, MAKE4, UNIFORM)                                                      \
    extern "C" __global__ void NAME(unsigned long long *state, unsigned long long go_handle, unsigned int *go_flag, T *out, unsigned long long n,     \
                                    float lo, float hi) {                                        \
        RNG_FILL4(RNG_EACH_WORD(MAKE4, UNIFORM, lo, hi))                                         \
    }

RNG_UNIFORM(rng_uniform_f32, float, make_float4, philox_uniform)
RNG_UNIFORM(rng_uniform_f16, unsigned short, make_ushort4, philox_uniform_f16)
RNG_UNIFORM(rng_uniform_bf16, unsigned short, make_ushort4, philox_uniform_bf16)

// The four f32 values of a normal group as the stored type: as they are, or rounded to half /
// bfloat16 bits.
__device__ __forceinline__ float4 rng_round4_f32(float4 v) {
    return v;
}

__device__ __forceinline__ ushort4 rng_round4_f16(float4 v) {
    return make_ushort4(philox_f32_to_f16(v.x), philox_f32_to_f16(v.y), philox_f32_to_f16(v.z),
                        philox_f32_to_f16(v.w));
}

__device__ __forceinline__ ushort4 rng_round4_bf16(float4 v) {
    return make_ushort4(philox_f32_to_bf16(v.x), philox_f32_to_bf16(v.y), philox_f32_to_bf16(v.z),
                        philox_f32_to_bf16(v.w));
}

// rng_normal_<t>(state, T *out, n, mean, std): a group's values are philox_normal4's, rounded
// by ROUND4.
#define RNG_NORMAL(NAME, T, ROUND4)                                                               \
    extern "C" __global__ void NAME(unsigned long long *state, unsigned long long go_handle, unsigned int *go_flag, T *out, unsigned long long n,     \
                                    float mean, float std) {                                     \
        RNG_FILL4(ROUND4(philox_normal4(r, mean, std)))                                          \
    }

RNG_NORMAL(rng_normal_f32, float, rng_round4_f32)
RNG_NORMAL(rng_normal_f16, unsigned short, rng_round4_f16)
RNG_NORMAL(rng_normal_bf16, unsigned short, rng_round4_bf16)

extern "C" __global__ void rng_exponential_f32(unsigned long long *state, unsigned long long go_handle, unsigned int *go_flag, float *out, unsigned long long n,
                                               float lambda) {
    RNG_FILL4(RNG_EACH_WORD(make_float4, philox_exponential, lambda))
}

// 1 when the word's uniform is below p, else 0 (p below 0 or NaN never, above 1 always).
template <typename T>
__device__ __forceinline__ T rng_chance(unsigned int x, float p) {
    return philox_u01(x) < p ? (T)1 : (T)0;
}

// rng_bernoulli_<t>(state, T *out, n, p): value j of a group is 1 with probability p.
#define RNG_BERNOULLI(NAME, T, MAKE4)                                                             \
    extern "C" __global__ void NAME(unsigned long long *state, unsigned long long go_handle, unsigned int *go_flag, T *out, unsigned long long n,     \
                                    float p) {                                                   \
        RNG_FILL4(RNG_EACH_WORD(MAKE4, rng_chance<T>, p))                                        \
    }

RNG_BERNOULLI(rng_bernoulli_u8, unsigned char, make_uchar4)
RNG_BERNOULLI(rng_bernoulli_f32, float, make_float4)

// The values of group g of a per-element draw: value j is 1 with probability probs[4g + j]
// (0 past n).
template <typename T, typename V4>
__device__ __forceinline__ V4 rng_chances(uint4 r, const float *probs, unsigned long long g,
                                          unsigned long long n) {
    unsigned int w[4] = {r.x, r.y, r.z, r.w};
    T b[4] = {0, 0, 0, 0};
    for (unsigned long long j = 0; j < 4 && 4 * g + j < n; ++j) {
        b[j] = rng_chance<T>(w[j], probs[4 * g + j]);
    }
    V4 v;
    v.x = b[0]; v.y = b[1]; v.z = b[2]; v.w = b[3];
    return v;
}

// rng_bernoulli_per_element_<t>(state, const float *probs, T *out, n): out[i] = 1 with
// probability probs[i].
#define RNG_BERNOULLI_PER_ELEMENT(NAME, T, V4)                                                    \
    extern "C" __global__ void NAME(unsigned long long *state, unsigned long long go_handle, unsigned int *go_flag, const float *probs, T *out,       \
                                    unsigned long long n) {                                      \
        RNG_FILL4(rng_chances<T, V4>(r, probs, g, n))                                            \
    }

RNG_BERNOULLI_PER_ELEMENT(rng_bernoulli_per_element_u8, unsigned char, uchar4)
RNG_BERNOULLI_PER_ELEMENT(rng_bernoulli_per_element_f32, float, float4)

// rng_integers_<t>(state, T *out, n, T lo, range) for 32-bit T: element i takes 64 bits,
// words 2(i % 2) and 2(i % 2) + 1 of group i / 2.
#define RNG_INTEGERS32(NAME, T)                                                                   \
    extern "C" __global__ void NAME(unsigned long long *state, unsigned long long go_handle, unsigned int *go_flag, T *out, unsigned long long n, T lo, \
                                    unsigned long long range) {                                  \
        RNG_FOR_EACH_GROUP((n + 1) / 2,                                                          \
            unsigned long long i = 2 * g;                                                        \
            out[i] = (T)((unsigned int)lo + (unsigned int)philox_below64(r.x, r.y, range));      \
            if (i + 1 < n) {                                                                     \
                out[i + 1] = (T)((unsigned int)lo + (unsigned int)philox_below64(r.z, r.w, range)); \
            })                                                                                   \
    }

RNG_INTEGERS32(rng_integers_u32, unsigned int)
RNG_INTEGERS32(rng_integers_i32, int)

// 64-bit integers: element i takes the 128 bits of group i.
extern "C" __global__ void rng_integers_i64(unsigned long long *state, unsigned long long go_handle, unsigned int *go_flag, long long *out, unsigned long long n,
                                            long long lo, unsigned long long range) {
    RNG_FOR_EACH_GROUP(n, out[g] = (long long)((unsigned long long)lo + philox_below128(r, range));)
}

// y = keep ? x / keep_prob : 0, mask = keep, with keep = (uniform < keep_prob).
extern "C" __global__ void rng_dropout_f32(unsigned long long *state, unsigned long long go_handle, unsigned int *go_flag, const float *x, float *y,
                                           unsigned char *mask, unsigned long long n, float keep_prob) {
    float scale = keep_prob > 0.0f ? 1.0f / keep_prob : 0.0f;
    RNG_FOR_EACH_GROUP((n + 3) / 4,
        unsigned int bits[4] = {r.x, r.y, r.z, r.w};
        for (unsigned long long j = 0; j < 4 && 4 * g + j < n; ++j) {
            unsigned long long i = 4 * g + j;
            bool keep = philox_u01(bits[j]) < keep_prob;
            mask[i] = keep ? 1 : 0;
            y[i] = keep ? x[i] * scale : 0.0f;
        })
}

#undef RNG_FOR_EACH_GROUP
#undef RNG_FILL4
#undef RNG_EACH_WORD
#undef RNG_UNIFORM
#undef RNG_NORMAL
#undef RNG_BERNOULLI
#undef RNG_BERNOULLI_PER_ELEMENT
#undef RNG_INTEGERS32
"#
);
