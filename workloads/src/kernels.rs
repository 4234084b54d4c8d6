//! CUDA C++ sources of the kernels the tests and examples launch, kept in one place.
//!
//! Each constant is one NVRTC compilation unit; [`graph_runtime::Runtime::function`]
//! compiles it once per process and caches the module.

/// A kernel that keeps the GPU busy for `ns` nanoseconds of its global timer (one thread):
/// a timing holds the stream with it while the host queues the calls it times, so that the
/// GPU then runs them back to back, without waiting for the host between them.
pub const HOLD: &str = r#"
extern "C" __global__ void hold_for(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"#;

/// Element-wise float kernels, one thread per element of a 1-D grid: `n` is an element
/// count, `rows` and `cols` the shape of a row-major matrix whose columns share a bias.
pub const ELEMENTWISE: &str = r#"
extern "C" __global__ void add_scalar(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + a;
}

extern "C" __global__ void add_one_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] + 1.0f;
}

// The two chain kernels written for early launch (see `graph_runtime::launch`): wait for the
// kernel before before touching memory, then let the next one be scheduled. (Letting it be
// scheduled first, before the wait, lets every later kernel of the chain be scheduled at once
// and their waiting blocks crowd the SMs: 0.98 against 0.69 µs per node for 10 000 kernels on
// an H100.) On devices before sm_90 the two instructions are left out and the kernels run in
// order.
__device__ __forceinline__ void early_launch_prologue() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

extern "C" __global__ void add_scalar_early(const float *x, float *y, float a, int n) {
    early_launch_prologue();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + a;
}

extern "C" __global__ void add_one_inplace_early(float *y, int n) {
    early_launch_prologue();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] + 1.0f;
}

extern "C" __global__ void mul(const float *a, const float *b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i];
}

extern "C" __global__ void add(const float *a, const float *b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

extern "C" __global__ void tanh_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(y[i]);
}

// y = gelu(y) in place (tanh approximation, the formula of bias_gelu), four floats per thread:
// thread t covers y[4t .. 4t + 4), with one 16-byte load and store where y is 16-byte aligned.
extern "C" __global__ void gelu_inplace4(float *y, int n) {
    int i = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    if (i + 4 <= n && (((unsigned long long)y) & 15ull) == 0ull) {
        float4 v = reinterpret_cast<float4 *>(y)[i / 4];
        float *e = &v.x;
        for (int j = 0; j < 4; ++j) {
            float u = 0.7978845608028654f * (e[j] + 0.044715f * e[j] * e[j] * e[j]);
            e[j] = 0.5f * e[j] * (1.0f + tanhf(u));
        }
        reinterpret_cast<float4 *>(y)[i / 4] = v;
    } else {
        for (int j = i; j < n && j < i + 4; ++j) {
            float v = y[j];
            float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
            y[j] = 0.5f * v * (1.0f + tanhf(u));
        }
    }
}

// y[r, c] = gelu(x[r, c] + b[c]) for a row-major rows x cols matrix (tanh approximation).
extern "C" __global__ void bias_gelu(const float *x, const float *b, float *y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        float v = x[i] + b[i % cols];
        float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(u));
    }
}

// out[r, c] = res[r, c] + (y[r, c] + b[c]): the bias of a row-parallel layer, added after the
// all-reduce of its partial sums, and a residual connection.
extern "C" __global__ void bias_residual(const float *y, const float *b, const float *res,
                                         float *out, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) out[i] = res[i] + (y[i] + b[i % cols]);
}

// out[r, c] = scale * u, u uniform in [-1, 1) and a hash of (seed, (row0 + r) * full_cols +
// col0 + c): the entries of a [*, full_cols] matrix by their position, so a block of rows or
// columns filled on one GPU holds exactly the numbers of the same block of the whole matrix.
extern "C" __global__ void init_uniform(float *out, int rows, int cols, int row0, int col0,
                                        int full_cols, unsigned int seed, float scale) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    long long r = i / cols, c = i % cols;
    unsigned long long z = (unsigned long long)((row0 + r) * (long long)full_cols + col0 + c);
    z += 0x9e3779b97f4a7c15ull * ((unsigned long long)seed + 1ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z = z ^ (z >> 31);
    float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    out[i] = scale * (2.0f * u - 1.0f);
}
"#;

/// A fused linear layer for small batches: `y = gelu(x · Wᵀ + b)` in one kernel, the weights
/// stored `[out, in]` like PyTorch's `Linear.weight`. Written for the launch-bound end of the
/// MLP example (batch 1 to 64), where cuBLAS's FP32 GEMM kernels leave most of the GPU idle.
///
/// `linear_bias_gelu(x, w, bias, y, rows, n_out, k)`: one warp per output feature and tile
/// of 8 rows; launch 128 threads per block on a `(ceil(n_out / 4), ceil(rows / 8))` grid.
/// `k` must be a multiple of 4 and every buffer 16-byte aligned. Each warp sums in a fixed
/// order, so results are bitwise reproducible.
///
/// Every load is unconditional (indices are clamped, out-of-range terms multiplied by zero
/// weights or dropped at the store): a load under a condition cannot be hoisted, and a
/// chain of them costs one memory latency each.
///
/// The kernel is ready for an [early launch](graph_runtime::launch): it loads its weight row
/// and bias (which nothing in the model writes) before `griddepcontrol.wait`, and `x` (the
/// previous layer's output) only after it. Launched normally, the two instructions do nothing.
pub const LINEAR: &str = r#"
#define LIN_TILE 8
#define LIN_WREG 4

__device__ __forceinline__ float lin_gelu(float v) {
    float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.0f + tanhf(u));
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// x is deliberately neither const __restrict__ nor read through __ldg: it is the previous
// kernel's output, read after griddepcontrol.wait through the coherent path.
extern "C" __global__ void linear_bias_gelu(const float *x, const float *__restrict__ w,
                                            const float *__restrict__ bias, float *y,
                                            int rows, int n_out, int k) {
    const int lane = threadIdx.x & 31;
    const int o_raw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int o = min(o_raw, n_out - 1);
    const int r0 = blockIdx.y * LIN_TILE;
    const int kv = k >> 2;
    const float4 *w4 = reinterpret_cast<const float4 *>(w) + (size_t)o * kv;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);

    // 1. Independent of the previous layer: this warp's weight row (the first 128 · LIN_WREG
    //    floats, in registers) and its bias.
    float4 wr[LIN_WREG];
#pragma unroll
    for (int j = 0; j < LIN_WREG; ++j) {
        int c = lane + 32 * j;
        float4 v = __ldg(w4 + min(c, kv - 1));
        wr[j] = c < kv ? v : zero;
    }
    const float bo = __ldg(bias + o);

    // 2. Wait for the previous layer, then let the next one be scheduled (it loads its own
    //    weights while this one computes).
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif

    // 3. Each lane sums its slice of k for the tile's rows, then the warp reduces.
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    size_t xrow[LIN_TILE];
#pragma unroll
    for (int t = 0; t < LIN_TILE; ++t) xrow[t] = (size_t)min(r0 + t, rows - 1) * kv;
    float acc[LIN_TILE];
#pragma unroll
    for (int t = 0; t < LIN_TILE; ++t) acc[t] = 0.f;
#pragma unroll
    for (int j = 0; j < LIN_WREG; ++j) {
        int c = min(lane + 32 * j, kv - 1);
#pragma unroll
        for (int t = 0; t < LIN_TILE; ++t) acc[t] += dot4(wr[j], x4[xrow[t] + c]);
    }
    for (int c = lane + 32 * LIN_WREG; c < kv; c += 32) {
        float4 wv = __ldg(w4 + c);
#pragma unroll
        for (int t = 0; t < LIN_TILE; ++t) acc[t] += dot4(wv, x4[xrow[t] + c]);
    }
#pragma unroll
    for (int t = 0; t < LIN_TILE; ++t)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
    // Lane t writes row r0 + t (a select chain, not a dynamic register index).
    float v = 0.f;
#pragma unroll
    for (int t = 0; t < LIN_TILE; ++t)
        if (lane == t) v = acc[t];
    if (o_raw < n_out && lane < LIN_TILE && r0 + lane < rows)
        y[(size_t)(r0 + lane) * n_out + o] = lin_gelu(v + bo);
}
"#;

/// The block-wide sum of the training and decode kernels ([`TRAIN`]'s loss and gradient
/// norm, [`DECODE`]'s RMSNorm and softmax), one CUDA source for both compilation units.
macro_rules! block_sum {
    () => {
        r#"
// Sum over the block, the same order every time for a given blockDim (a multiple of 32, at
// most 1024). Every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float warp_sums[32];
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    int warps = blockDim.x >> 5;
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += warp_sums[w];
    return total;
}
"#
    };
}

/// Kernels of the training examples (`06-train-step`, `07-dropout-train`, and the
/// data-parallel `11-data-parallel-train`): the pieces of a small MLP's forward and backward
/// pass that are not GEMMs, an MSE loss, the global gradient norm and AdamW. Row-major
/// matrices; `n` is an element count.
///
/// Everything that depends on the training step reads the step counter through a pointer
/// (`const int *step`), so a captured graph sees the counter move on every replay. Every
/// reduction sums in a fixed order for a fixed launch configuration, so two runs of the same
/// launches give bitwise-equal results.
pub const TRAIN: &str = concat!(
    r#"
#define GELU_K0 0.7978845608028654f
#define GELU_K1 0.044715f

__device__ __forceinline__ float gelu_tanh(float v) {
    float u = GELU_K0 * (v + GELU_K1 * v * v * v);
    return 0.5f * v * (1.0f + tanhf(u));
}

__device__ __forceinline__ float gelu_tanh_grad(float v) {
    float u = GELU_K0 * (v + GELU_K1 * v * v * v);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * v * v);
}

"#,
    block_sum!(),
    r#"
// z[r, c] = x[r, c] + b[c]; y = gelu(z). z is kept for the backward pass.
extern "C" __global__ void bias_gelu_fwd(const float *x, const float *b, float *z, float *y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        float v = x[i] + b[i % cols];
        z[i] = v;
        y[i] = gelu_tanh(v);
    }
}

// y[r, c] = x[r, c] + b[c].
extern "C" __global__ void bias_add(const float *x, const float *b, float *y, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] = x[i] + b[i % cols];
}

// dz = dy * gelu'(z).
extern "C" __global__ void gelu_bwd(const float *dy, const float *z, float *dz, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dz[i] = dy[i] * gelu_tanh_grad(z[i]);
}

// db[c] = sum over rows of dz[r, c], rows added in order.
extern "C" __global__ void col_sum(const float *dz, float *db, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float s = 0.0f;
        for (int r = 0; r < rows; ++r) s += dz[r * cols + c];
        db[c] = s;
    }
}

// Copies mini-batch (step % batches) of the data set: x_len inputs and t_len targets.
extern "C" __global__ void select_batch(const float *xs, const float *ts, const int *step,
                                        float *x, float *t, int batches, int x_len, int t_len) {
    int k = *step % batches;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < x_len) x[i] = xs[(long long)k * x_len + i];
    if (i < t_len) t[i] = ts[(long long)k * t_len + i];
}

// Copies rows [row0, row0 + rows) of mini-batch (step % batches) of a data set of `batches`
// mini-batches of `global_rows` rows each: `in_dim` inputs and `out_dim` targets per row (one
// rank's share of a mini-batch split over the ranks).
extern "C" __global__ void select_rows(const float *xs, const float *ts, const int *step,
                                       float *x, float *t, int batches, int global_rows,
                                       int row0, int rows, int in_dim, int out_dim) {
    long long first = (long long)(*step % batches) * global_rows + row0;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * in_dim) x[i] = xs[first * in_dim + i];
    if (i < rows * out_dim) t[i] = ts[first * out_dim + i];
}

// Mean squared error by the whole block: dy = 2 (y - t) / n; every thread gets mean((y - t)^2).
__device__ float mse_block(const float *y, const float *t, float *dy, int n) {
    float acc = 0.0f;
    float inv_n = 1.0f / (float)n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float d = y[i] - t[i];
        dy[i] = 2.0f * d * inv_n;
        acc += d * d;
    }
    return block_sum(acc) * inv_n;
}

// Mean squared error, one block: dy = 2 (y - t) / n, losses[step] = mean((y - t)^2) while
// step < capacity.
extern "C" __global__ void mse_loss(const float *y, const float *t, float *dy, float *losses,
                                    const int *step, int n, int capacity) {
    float loss = mse_block(y, t, dy, n);
    if (threadIdx.x == 0) {
        int s = *step;
        if (s >= 0 && s < capacity) losses[s] = loss;
    }
}

// Mean squared error, one block: dy = 2 (y - t) / n, *loss = mean((y - t)^2).
extern "C" __global__ void mse_loss_into(const float *y, const float *t, float *dy, float *loss,
                                         int n) {
    float value = mse_block(y, t, dy, n);
    if (threadIdx.x == 0) *loss = value;
}

// Sum of squares of g, one partial per block: launch with a fixed grid so that the split,
// and with it the result, never changes.
extern "C" __global__ void sumsq_partials(const float *g, float *partials, int n) {
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        acc += g[i] * g[i];
    }
    float total = block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Clips the gradient to a global norm of max_norm (the norm is the sum of the partials,
// added in order by every block: no host round trip) and applies one AdamW step with
// t = step + 1, PyTorch's order: decoupled weight decay, then the Adam update.
extern "C" __global__ void clip_adamw(float *p, const float *g, float *m, float *v,
                                      const float *partials, int nparts, const int *step,
                                      float lr, float beta1, float beta2, float eps, float wd,
                                      float max_norm, int n) {
    __shared__ float s_coef;
    if (threadIdx.x == 0) {
        float sq = 0.0f;
        for (int k = 0; k < nparts; ++k) sq += partials[k];
        float coef = max_norm / (sqrtf(sq) + 1e-6f);
        s_coef = fminf(coef, 1.0f);
    }
    __syncthreads();
    float coef = s_coef;
    float t = (float)(*step + 1);
    float bc1 = 1.0f - powf(beta1, t);
    float bc2 = 1.0f - powf(beta2, t);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float gi = g[i] * coef;
        float pi = p[i] * (1.0f - lr * wd);
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi / bc2) + eps;
        p[i] = pi - lr * (mi / bc1) / denom;
    }
}

// The last kernel of a training step: every earlier one has read the counter.
extern "C" __global__ void step_increment(int *step) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *step += 1;
}

// The last kernel of a step whose loss is known only at its end (after an all-reduce):
// losses[step] = *loss while step < capacity, then the counter moves on.
extern "C" __global__ void finish_step(float *losses, const float *loss, int *step, int capacity) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        int s = *step;
        if (s >= 0 && s < capacity) losses[s] = *loss;
        *step = s + 1;
    }
}

// Backward of graph_runtime's rng_dropout_f32: dx = mask ? dy / keep_prob : 0 (the same
// scale expression as the forward kernel).
extern "C" __global__ void dropout_bwd(const float *dy, const unsigned char *mask, float *dx,
                                       float keep_prob, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float scale = keep_prob > 0.0f ? 1.0f / keep_prob : 0.0f;
    if (i < n) dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}
"#
);

/// The greedy choice of both decode steps' last kernel ([`DECODE`]'s `argmax_advance`,
/// [`DECODE_STOP`]'s `argmax_advance_stop`), one CUDA source for both compilation units.
macro_rules! block_argmax {
    () => {
        r#"
// The index of the largest of `vocab` logits (the lowest among equal maxima; 0 when none is
// above -inf, NaNs included, so the result is always a token), by a whole block of a power of
// two threads, at most 1024. Every thread gets the result.
__device__ int block_argmax(const float *logits, int vocab) {
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    float bv = __int_as_float(0xff800000);
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = logits[i];
        if (v > bv) { bv = v; bi = i; }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            float ov = best_v[threadIdx.x + stride];
            int oi = best_i[threadIdx.x + stride];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    int best = best_i[0];
    return best < vocab ? best : 0;
}
"#
    };
}

/// Kernels of the decoder of `05-decode-step` and `14-decode-loop` ([`crate::decode`]): one
/// token of a small pre-norm transformer at batch 1. The token id and its position are read from device memory, so
/// one captured graph serves every position; `argmax_advance` writes the next token and
/// moves the position on.
///
/// The KV cache is `[layer][k or v][max_seq][dim]`; `qkv` is `[q (dim) | k (dim) | v (dim)]`
/// with heads of `head_dim` consecutive values; rotary embedding rotates the pairs
/// `(2i, 2i + 1)` of each head by `pos * theta^(-2i / head_dim)`.
pub const DECODE: &str = concat!(
    r#"
#define MAX_SEQ 1024
#define NEG_INF __int_as_float(0xff800000)

"#,
    block_sum!(),
    r#"
// Max over the block (blockDim a multiple of 32, at most 1024). Every thread gets the result.
__device__ float block_max(float v) {
    __shared__ float warp_vals[32];
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    float best = NEG_INF;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) best = fmaxf(best, warp_vals[w]);
    return best;
}

// x = table[token].
extern "C" __global__ void embed(const float *table, const int *token, float *x, int dim) {
    int tok = *token;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x) {
        x[i] = table[(long long)tok * dim + i];
    }
}

// y = x * w / sqrt(mean(x^2) + eps), one block.
extern "C" __global__ void rmsnorm(const float *x, const float *w, float *y, int n, float eps) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[i] * x[i];
    float inv = rsqrtf(block_sum(acc) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] * inv * w[i];
}

// Rotates q and k in place at position *pos and stores k and v in the cache of `layer`
// (nothing at all when *pos is outside [0, max_seq)). One thread per element of `dim`:
// thread i rotates pair i of q (i < dim / 2) or pair i - dim / 2 of k, and copies v[i].
extern "C" __global__ void rope_kv(float *qkv, float *kv, const int *pos, int layer, int dim,
                                   int head_dim, int max_seq, float theta) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int p = *pos;
    // A position past the cache (a step called more often than the cache holds) writes
    // nothing, so no launch can write outside the cache.
    if (i >= dim || p < 0 || p >= max_seq) return;
    int half = dim / 2;
    int pair = i < half ? i : i - half;
    float *vec = i < half ? qkv : qkv + dim;
    int j = pair % (head_dim / 2);
    float freq = powf(theta, -2.0f * (float)j / (float)head_dim);
    float s, c;
    sincosf((float)p * freq, &s, &c);
    float x0 = vec[2 * pair], x1 = vec[2 * pair + 1];
    float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
    vec[2 * pair] = r0;
    vec[2 * pair + 1] = r1;
    long long layer_base = (long long)layer * 2 * max_seq * dim;
    float *k_cache = kv + layer_base + (long long)p * dim;
    float *v_cache = kv + layer_base + (long long)max_seq * dim + (long long)p * dim;
    if (i >= half) {
        k_cache[2 * pair] = r0;
        k_cache[2 * pair + 1] = r1;
    }
    v_cache[i] = qkv[2 * dim + i];
}

// Attention of one query over positions 0..=*pos of the cache of `layer`: one block per
// head. out[h * head_dim + d] = sum_t softmax_t(q_h . k_t / sqrt(head_dim)) v_t[d].
extern "C" __global__ void attention(const float *qkv, const float *kv, float *out, const int *pos,
                                     int layer, int dim, int head_dim, int max_seq) {
    __shared__ float scores[MAX_SEQ];
    int h = blockIdx.x;
    int len = *pos + 1;
    if (len > max_seq) len = max_seq;
    const float *q = qkv + h * head_dim;
    long long layer_base = (long long)layer * 2 * max_seq * dim;
    const float *k_cache = kv + layer_base;
    const float *v_cache = kv + layer_base + (long long)max_seq * dim;
    float scale = rsqrtf((float)head_dim);
    float local_max = NEG_INF;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        const float *k = k_cache + (long long)t * dim + h * head_dim;
        float s = 0.0f;
        for (int d = 0; d < head_dim; ++d) s += q[d] * k[d];
        s *= scale;
        scores[t] = s;
        local_max = fmaxf(local_max, s);
    }
    float m = block_max(local_max);
    float local_sum = 0.0f;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        float e = expf(scores[t] - m);
        scores[t] = e;
        local_sum += e;
    }
    float inv = 1.0f / block_sum(local_sum);
    __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < len; ++t) acc += scores[t] * v_cache[(long long)t * dim + h * head_dim + d];
        out[h * head_dim + d] = acc * inv;
    }
}

// SwiGLU: h[i] = silu(gu[i]) * gu[ffn + i], gate rows first, then up rows.
extern "C" __global__ void silu_mul(const float *gu, float *h, int ffn) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < ffn) {
        float g = gu[i];
        h[i] = g / (1.0f + expf(-g)) * gu[ffn + i];
    }
}

"#,
    block_argmax!(),
    r#"
// Greedy decoding, one block of 1024: token = argmax(logits), tokens[*pos] = token while
// *pos < max_tokens, *pos += 1.
extern "C" __global__ void argmax_advance(const float *logits, int vocab, int *token, int *pos,
                                          int *tokens, int max_tokens) {
    int next = block_argmax(logits, vocab);
    if (threadIdx.x == 0) {
        int p = *pos;
        *token = next;
        if (p >= 0 && p < max_tokens) tokens[p] = next;
        *pos = p + 1;
    }
}
"#
);

/// Kernel of the on-device decode loop (`14-decode-loop`, [`crate::decode`]): the step's
/// last kernel when the loop runs on the device: greedy argmax as in [`DECODE`]'s
/// `argmax_advance`, then the loop's condition: go on while the token is not the end token
/// and the output has room. Once that is no longer so, `done` is set and later calls (the
/// rest of an unrolled iteration) change nothing.
pub const DECODE_STOP: &str = concat!(
    graph_runtime::condition_device_api!(),
    block_argmax!(),
    r#"
extern "C" __global__ void argmax_advance_stop(const float *logits, int vocab, int *token, int *pos,
                                               int *done, int *tokens, int max_tokens, int end_token,
                                               GraphCondition go) {
    int next = block_argmax(logits, vocab);
    if (threadIdx.x == 0) {
        if (*done) {
            graph_condition_set(go, false);
        } else {
            int p = *pos;
            *token = next;
            if (p >= 0 && p < max_tokens) tokens[p] = next;
            *pos = p + 1;
            bool more = next != end_token && p + 1 < max_tokens;
            if (!more) *done = 1;
            graph_condition_set(go, more);
        }
    }
}
"#
);
