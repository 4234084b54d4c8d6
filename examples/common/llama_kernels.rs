//! Example 25's fused decoding kernels: three candle ops on `bf16` tensors, each one kernel
//! where candle's own ops take several (and an output buffer each).
//!
//! * [`Kernels::add_rms_norm`]: the residual add and the next RMS norm (candle: an add and a
//!   norm);
//! * [`Kernels::silu_mul`]: SwiGLU's `silu(gate) · up` from the fused gate/up projection
//!   (candle: a SiLU and a multiply);
//! * [`Kernels::attention`]: the rotary embedding of one position's query and key, the key and
//!   value written into a [`StaticKvCache`](graph_runtime::candle::StaticKvCache)'s layer,
//!   and grouped-query attention over the positions up to it (candle: the rotary tables'
//!   rows, the rotation, two cache writes, two matmuls, the mask and the softmax).
//!
//! Every kernel reads the position from the device, so one graph serves every position.
//! The sums are in `f32` and each result is rounded to `bf16` once, so the bits differ from
//! candle's op-by-op path; eager and graph run the same kernels, so they agree bit for bit.

#![allow(dead_code)] // each program uses part of it

use graph_runtime::candle::candle_core::backend::BackendStorage;
use graph_runtime::candle::candle_core::cuda_backend::CudaStorage;
use graph_runtime::candle::candle_core::{
    self as candle, CpuStorage, CustomOp1, CustomOp3, DType, Layout, Shape, Tensor,
};
use graph_runtime::cudarc::driver::{CudaFunction, CudaView, LaunchConfig, PushKernelArg};
use graph_runtime::{GraphError, Runtime};
use half::bf16;

const SOURCE: &str = r#"
typedef unsigned short bf16_t;

__device__ __forceinline__ float ld(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }
// Round to nearest even, NaN kept.
__device__ __forceinline__ bf16_t st(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Every thread gets the same sum (or max), added in the same order.
__device__ __forceinline__ float block_reduce(float v, float *red, bool max) {
    v = max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < (int)(blockDim.x / 32); ++w) r = max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

// out[0..h] = x + d (rounded), out[h..2h] = rms_norm(out[0..h]) · w. One block.
extern "C" __global__ void add_rms_norm(const bf16_t *x, const bf16_t *d, const bf16_t *w,
                                        bf16_t *out, int h, float eps) {
    __shared__ float red[32];
    float ss = 0.f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) {
        const bf16_t r = st(ld(x[i]) + ld(d[i]));
        out[i] = r;
        ss += ld(r) * ld(r);
    }
    const float inv = rsqrtf(block_reduce(ss, red, false) / (float)h + eps);
    for (int i = threadIdx.x; i < h; i += blockDim.x) out[h + i] = st(ld(out[i]) * inv * ld(w[i]));
}

// out[i] = silu(gu[i]) · gu[inter + i].
extern "C" __global__ void silu_mul(const bf16_t *gu, bf16_t *out, int inter) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < inter) {
        const float g = ld(gu[i]), u = ld(gu[inter + i]);
        out[i] = st(g / (1.f + expf(-g)) * u);
    }
}

// One block per query head h of one position p = *pos: rotates the head's query and its KV
// head's key by the rows p of cos/sin (max_len, hd/2) (the halves convention), writes that
// key and value into kc/vc (kv, max_len, hd) at p (the first query head of each KV head
// does), then attends over positions 0..=p. qkv: [q: heads·hd | k: kv·hd | v: kv·hd]; the
// queries carry 1/sqrt(hd) already. Blocks read only positions before p from the cache, so
// no block reads what another writes. blockDim is a multiple of hd.
extern "C" __global__ void decode_attention(const bf16_t *qkv, const bf16_t *cos_t,
                                            const bf16_t *sin_t, const unsigned int *pos,
                                            bf16_t *kc, bf16_t *vc, bf16_t *out, int heads,
                                            int kv, int hd, int max_len) {
    extern __shared__ float sm[];
    float *q = sm, *k = sm + hd, *s = sm + 2 * hd, *red = s + max_len, *part = red + 32;
    const int h = blockIdx.x, group = heads / kv, g = h / group, half = hd / 2;
    const int p = min((int)*pos, max_len - 1);
    const bf16_t *qh = qkv + (long)h * hd, *kh = qkv + (long)(heads + g) * hd;
    const bf16_t *vh = qkv + (long)(heads + kv + g) * hd;
    const long row = ((long)g * max_len + p) * hd;
    const bool writer = h % group == 0;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float c = ld(cos_t[(long)p * half + i]), sn = ld(sin_t[(long)p * half + i]);
        float a = ld(qh[i]), b = ld(qh[i + half]);
        q[i] = ld(st(a * c - b * sn));
        q[i + half] = ld(st(a * sn + b * c));
        a = ld(kh[i]);
        b = ld(kh[i + half]);
        const bf16_t k0 = st(a * c - b * sn), k1 = st(a * sn + b * c);
        k[i] = ld(k0);
        k[i + half] = ld(k1);
        if (writer) { kc[row + i] = k0; kc[row + i + half] = k1; }
    }
    if (writer)
        for (int i = threadIdx.x; i < hd; i += blockDim.x) vc[row + i] = vh[i];
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int t = warp; t <= p; t += warps) {
        const bf16_t *kt = kc + ((long)g * max_len + t) * hd;
        float dot = 0.f;
#pragma unroll 4
        for (int i = lane; i < hd; i += 32) dot += q[i] * (t == p ? k[i] : ld(kt[i]));
        dot = warp_sum(dot);
        if (lane == 0) s[t] = dot;
    }
    __syncthreads();
    float m = __int_as_float(0xff800000); // -inf
    for (int t = threadIdx.x; t <= p; t += blockDim.x) m = fmaxf(m, s[t]);
    m = block_reduce(m, red, true);
    float sum = 0.f;
    for (int t = threadIdx.x; t <= p; t += blockDim.x) {
        const float e = expf(s[t] - m);
        s[t] = e;
        sum += e;
    }
    sum = block_reduce(sum, red, false);
    // blockDim / hd groups of threads split the positions; their partial sums meet in `part`.
    const int groups = blockDim.x / hd, grp = threadIdx.x / hd, d = threadIdx.x % hd;
    float acc = 0.f;
    if (grp < groups) {
#pragma unroll 4
        for (int t = grp; t <= p; t += groups)
            acc += s[t] * ld(t == p ? vh[d] : vc[((long)g * max_len + t) * hd + d]);
        part[threadIdx.x] = acc;
    }
    __syncthreads();
    if (grp == 0) {
        float total = part[d];
        for (int j = 1; j < groups; ++j) total += part[j * hd + d];
        out[(long)h * hd + d] = st(total / sum);
    }
}
"#;

/// Threads of an attention block: a multiple of the head size (64 and 128 here).
const THREADS: usize = 256;

/// The compiled kernels of one device.
pub struct Kernels {
    add_rms_norm: CudaFunction,
    silu_mul: CudaFunction,
    attention: CudaFunction,
}

impl Kernels {
    /// Compiles the kernels for `rt`'s device (NVRTC, once per runtime).
    pub fn new(rt: &Runtime) -> Result<Kernels, GraphError> {
        Ok(Kernels {
            add_rms_norm: rt.function(SOURCE, "add_rms_norm")?,
            silu_mul: rt.function(SOURCE, "silu_mul")?,
            attention: rt.function(SOURCE, "decode_attention")?,
        })
    }

    /// `(x + delta, rms_norm(x + delta) · w)` for `x`, `delta` and `w` of `h` elements: the
    /// new residual stream and its norm, each `(1, h)`.
    pub fn add_rms_norm(
        &self,
        x: &Tensor,
        delta: &Tensor,
        w: &Tensor,
        eps: f64,
    ) -> candle::Result<(Tensor, Tensor)> {
        let both = x.apply_op3_no_bwd(
            delta,
            w,
            &AddRmsNorm {
                f: &self.add_rms_norm,
                eps: eps as f32,
            },
        )?;
        Ok((both.narrow(0, 0, 1)?, both.narrow(0, 1, 1)?))
    }

    /// `silu(gu[.., ..inter]) · gu[.., inter..]` of the fused gate/up output `(1, 2·inter)`.
    pub fn silu_mul(&self, gu: &Tensor) -> candle::Result<Tensor> {
        gu.apply_op1_no_bwd(&SiluMul { f: &self.silu_mul })
    }

    /// Attention of one position (see the module's docs): `qkv` `(1, (heads + 2·kv)·hd)`,
    /// the rotary tables `(max_len, hd/2)`, `pos` `(1,)` u32, the layer's cache tensors
    /// `(1, kv, max_len, hd)` (written at `pos`); returns `(1, heads·hd)`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        qkv: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        pos: &Tensor,
        (kc, vc): (&Tensor, &Tensor),
        heads: usize,
        kv: usize,
    ) -> candle::Result<Tensor> {
        let (_, kv_c, max_len, hd) = kc.dims4()?;
        if kv_c != kv || vc.dims() != kc.dims() || cos.dims() != [max_len, hd / 2] {
            candle::bail!(
                "attention: cache {:?} / {:?} and tables {:?} do not fit {kv} KV heads",
                kc.dims(),
                vc.dims(),
                cos.dims()
            );
        }
        let op = Attention {
            f: &self.attention,
            tables: (cos, sin),
            pos,
            cache: (kc, vc),
            heads,
            kv,
            hd,
            max_len,
        };
        qkv.apply_op1_no_bwd(&op)
    }
}

/// The `bf16` elements of a contiguous tensor's storage.
fn bf16_view<'a>(s: &'a CudaStorage, l: &Layout, what: &str) -> candle::Result<CudaView<'a, bf16>> {
    let Some((start, end)) = l.contiguous_offsets() else {
        candle::bail!("{what}: not contiguous ({:?})", l.stride())
    };
    if s.dtype() != DType::BF16 {
        candle::bail!("{what}: {:?}, the kernels take bf16", s.dtype())
    }
    Ok(s.as_cuda_slice::<bf16>()?.slice(start..end))
}

/// The CUDA storage of a tensor the op reads or writes beside its inputs, and its layout.
fn with_cuda<R>(
    t: &Tensor,
    what: &str,
    f: impl FnOnce(&CudaStorage, &Layout) -> candle::Result<R>,
) -> candle::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle::Storage::Cuda(s) => f(s, layout),
        _ => candle::bail!("{what}: not on a CUDA device"),
    }
}

fn launch_error(e: impl std::fmt::Display + Send + Sync + 'static) -> candle::Error {
    candle::Error::wrap(e)
}

fn no_cpu(name: &str) -> candle::Result<(CpuStorage, Shape)> {
    candle::bail!("{name}: a CUDA kernel; the tensors are on the CPU")
}

struct AddRmsNorm<'a> {
    f: &'a CudaFunction,
    eps: f32,
}

impl CustomOp3 for AddRmsNorm<'_> {
    fn name(&self) -> &'static str {
        "add_rms_norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle::Result<(CpuStorage, Shape)> {
        no_cpu(self.name())
    }

    fn cuda_fwd(
        &self,
        xs: &CudaStorage,
        xl: &Layout,
        ds: &CudaStorage,
        dl: &Layout,
        ws: &CudaStorage,
        wl: &Layout,
    ) -> candle::Result<(CudaStorage, Shape)> {
        let h = xl.shape().elem_count();
        if dl.shape().elem_count() != h || wl.shape().elem_count() != h {
            candle::bail!("add_rms_norm: x, delta and w differ in length");
        }
        let (x, d, w) = (
            bf16_view(xs, xl, "x")?,
            bf16_view(ds, dl, "delta")?,
            bf16_view(ws, wl, "w")?,
        );
        let dev = xs.device().clone();
        // SAFETY: the kernel writes all 2·h elements before anything reads them.
        let mut out = unsafe { dev.alloc::<bf16>(2 * h) }?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(self.f);
        let n = h as i32;
        b.arg(&x)
            .arg(&d)
            .arg(&w)
            .arg(&mut out)
            .arg(&n)
            .arg(&self.eps);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `add_rms_norm`'s parameters in order; it reads h elements of x, delta and w
        // and writes 2·h of `out`.
        unsafe { b.launch(cfg) }.map_err(launch_error)?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((2, h))))
    }
}

struct SiluMul<'a> {
    f: &'a CudaFunction,
}

impl CustomOp1 for SiluMul<'_> {
    fn name(&self) -> &'static str {
        "silu_mul"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle::Result<(CpuStorage, Shape)> {
        no_cpu(self.name())
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle::Result<(CudaStorage, Shape)> {
        let gu = bf16_view(s, l, "gate/up")?;
        let inter = l.shape().elem_count() / 2;
        let dev = s.device().clone();
        // SAFETY: the kernel writes every element before anything reads them.
        let mut out = unsafe { dev.alloc::<bf16>(inter) }?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(self.f);
        let n = inter as i32;
        b.arg(&gu).arg(&mut out).arg(&n);
        // SAFETY: `silu_mul`'s parameters in order; it reads 2·inter elements of `gu` and
        // writes `inter` of `out`, one thread each.
        unsafe { b.launch(LaunchConfig::for_num_elems(inter as u32)) }.map_err(launch_error)?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((1, inter)),
        ))
    }
}

struct Attention<'a> {
    f: &'a CudaFunction,
    tables: (&'a Tensor, &'a Tensor),
    pos: &'a Tensor,
    cache: (&'a Tensor, &'a Tensor),
    heads: usize,
    kv: usize,
    hd: usize,
    max_len: usize,
}

impl CustomOp1 for Attention<'_> {
    fn name(&self) -> &'static str {
        "decode_attention"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle::Result<(CpuStorage, Shape)> {
        no_cpu(self.name())
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle::Result<(CudaStorage, Shape)> {
        let (heads, kv, hd) = (self.heads, self.kv, self.hd);
        if l.shape().elem_count() != (heads + 2 * kv) * hd
            || heads % kv != 0
            || hd % 2 != 0
            || !THREADS.is_multiple_of(hd)
        {
            candle::bail!(
                "decode_attention: qkv {:?} does not fit {heads} heads",
                l.dims()
            );
        }
        let qkv = bf16_view(s, l, "qkv")?;
        let dev = s.device().clone();
        // SAFETY: the kernel writes every element before anything reads them.
        let mut out = unsafe { dev.alloc::<bf16>(heads * hd) }?;
        let stream = dev.cuda_stream();
        let (cos, sin) = self.tables;
        let (kc, vc) = self.cache;
        with_cuda(cos, "cos", |cs, cl| {
            with_cuda(sin, "sin", |ss, sl| {
                with_cuda(kc, "keys", |ks, kl| {
                    with_cuda(vc, "values", |vs, vl| {
                        with_cuda(self.pos, "pos", |ps, pl| {
                            let Some((p0, _)) = pl.contiguous_offsets() else {
                                candle::bail!("pos: not contiguous")
                            };
                            let pos = ps.as_cuda_slice::<u32>()?.slice(p0..p0 + 1);
                            let (cos, sin) = (bf16_view(cs, cl, "cos")?, bf16_view(ss, sl, "sin")?);
                            let (k, v) = (bf16_view(ks, kl, "keys")?, bf16_view(vs, vl, "values")?);
                            let mut b = stream.launch_builder(self.f);
                            let (h, k_, d, m) =
                                (heads as i32, kv as i32, hd as i32, self.max_len as i32);
                            b.arg(&qkv).arg(&cos).arg(&sin).arg(&pos).arg(&k).arg(&v);
                            b.arg(&mut out).arg(&h).arg(&k_).arg(&d).arg(&m);
                            let cfg = LaunchConfig {
                                grid_dim: (heads as u32, 1, 1),
                                block_dim: (THREADS as u32, 1, 1),
                                shared_mem_bytes: ((2 * hd + self.max_len + 32 + THREADS) * 4)
                                    as u32,
                            };
                            // SAFETY: `decode_attention`'s parameters in order, sizes checked
                            // above; it writes one position of `k` and `v` (the cache's
                            // memory, which the op's caller lends it for the call) and every
                            // element of `out`.
                            unsafe { b.launch(cfg) }.map_err(launch_error)?;
                            Ok(())
                        })
                    })
                })
            })
        })?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((1, heads * hd)),
        ))
    }
}
