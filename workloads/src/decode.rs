//! The decoder of `05-decode-step` and `14-decode-loop` on the GPU: its weights and state as
//! [`DeviceState`], one decode step's launches ending in the plain argmax or in the argmax
//! that sets a `graph_while` condition ([`DECODE_STOP`]), and the host-side helpers around a
//! generation (restart, the generated tokens, the check against the host model).
//!
//! The model is a pre-norm transformer (RMSNorm, rotary attention over a KV cache, SwiGLU)
//! decoding greedily at batch 1, for any [`DecoderSpec`]. Nothing that changes from token to
//! token is a host value: the current token and its position live in [`DecodeState`] on the
//! device, the kernels read them through pointers, and the step's last kernel writes the next
//! token and moves the position on. So one captured [`step`] serves every position. The
//! `#[cuda_graph]` functions that call [`step`] are the examples'.

use std::sync::Arc;

use graph_runtime::cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use graph_runtime::{Condition, DeviceState, GraphError, Runtime};

use crate::kernels::{DECODE, DECODE_STOP};
use crate::ops::blas::matvec;
use crate::ops::{blocks, elems, Launch};
use crate::reference::{argmax, Decoder, DecoderLayer, DecoderSpec, HostKvCache};

/// The first token.
pub const BOS: i32 = 1;

/// Positions the attention kernel holds scores for (its shared `MAX_SEQ`): the largest
/// `max_seq` a [`DecoderSpec`] may have.
pub const KERNEL_MAX_SEQ: usize = 1024;

/// The weights on the device, each kind stacked over the blocks (block `l`'s `wqkv` is
/// `wqkv[l · 3·dim·dim ..]`).
#[derive(DeviceState)]
pub struct Weights {
    embed: CudaSlice<f32>,
    attn_norm: CudaSlice<f32>,
    wqkv: CudaSlice<f32>,
    wo: CudaSlice<f32>,
    ffn_norm: CudaSlice<f32>,
    w13: CudaSlice<f32>,
    w2: CudaSlice<f32>,
    final_norm: CudaSlice<f32>,
    lm_head: CudaSlice<f32>,
}

/// What a step reads and writes besides the weights and the cache: the current token and
/// position (device values), the generated tokens, and the activations.
#[derive(DeviceState)]
pub struct DecodeState {
    /// The current token: the last one generated (BOS before the first step).
    pub token: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    /// 1 once the end token or the length limit is reached (the stopping steps only).
    done: CudaSlice<i32>,
    tokens: CudaSlice<i32>,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    h: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

impl DecodeState {
    /// The state of a generation that has not started (BOS, position 0, buffers zeroed), with
    /// room for `capacity` generated tokens: the steps record the first `capacity` and keep
    /// the rest only as the current token. Each step writes the cache row of its position, so
    /// a generation takes at most `spec.max_seq` steps.
    pub fn new(
        s: &Arc<CudaStream>,
        spec: &DecoderSpec,
        capacity: usize,
    ) -> Result<Self, GraphError> {
        let d = spec.dim;
        Ok(DecodeState {
            token: s.clone_htod(&[BOS])?,
            pos: s.alloc_zeros(1)?,
            done: s.alloc_zeros(1)?,
            tokens: s.alloc_zeros(capacity)?,
            x: s.alloc_zeros(d)?,
            xn: s.alloc_zeros(d)?,
            qkv: s.alloc_zeros(3 * d)?,
            attn: s.alloc_zeros(d)?,
            gu: s.alloc_zeros(2 * spec.ffn)?,
            h: s.alloc_zeros(spec.ffn)?,
            logits: s.alloc_zeros(spec.vocab)?,
        })
    }

    /// The logits of the last step.
    pub fn logits(&self) -> &CudaSlice<f32> {
        &self.logits
    }
}

/// Tokens a sequence of `14-decode-loop` may have: the cache's positions but one, the row
/// that the steps of an unrolled iteration after the end write at the frozen position.
pub fn max_tokens(spec: &DecoderSpec) -> usize {
    spec.max_seq - 1
}

/// Back to the start: BOS at position 0, cache and output cleared (host-side, between runs;
/// never inside a graph).
pub fn restart(
    s: &Arc<CudaStream>,
    kv: &mut impl DevicePtrMut<f32>,
    st: &mut DecodeState,
) -> Result<(), GraphError> {
    s.memset_zeros(kv)?;
    restart_state(s, st)
}

/// [`restart`] for a decoder whose cache is not a device buffer of the state (a [`ConcatKv`],
/// which starts again as `ConcatKv::new`): BOS at position 0, output cleared.
pub fn restart_state(s: &Arc<CudaStream>, st: &mut DecodeState) -> Result<(), GraphError> {
    s.memset_zeros(&mut st.pos)?;
    s.memset_zeros(&mut st.done)?;
    s.memset_zeros(&mut st.tokens)?;
    s.memcpy_htod([BOS].as_slice(), &mut st.token)?;
    Ok(())
}

/// How a step ends: the plain argmax, or the argmax that also sets the loop's condition.
#[derive(Clone, Copy)]
pub enum Last<'a> {
    /// The plain argmax (`DECODE`'s `argmax_advance`).
    Argmax,
    /// The argmax that also sets `go` ([`DECODE_STOP`]'s `argmax_advance_stop`): false at the
    /// end token or once the state's token buffer is full, and from then on every later step
    /// of the same generation leaves token and position as they are.
    ArgmaxStop {
        /// The loop's condition.
        go: &'a Condition,
        /// The end token (-1: none).
        end: i32,
    },
}

/// Asserts what the kernels assume of the model's shape.
fn check_spec(spec: &DecoderSpec) {
    let hd = spec.dim / spec.heads.max(1);
    assert!(
        spec.heads > 0 && hd * spec.heads == spec.dim && hd.is_multiple_of(2),
        "decoder: width {} must split into {} heads of an even width",
        spec.dim,
        spec.heads
    );
    assert!(
        (1..=KERNEL_MAX_SEQ).contains(&spec.max_seq),
        "decoder: a cache of {} positions; the attention kernel holds 1 to {KERNEL_MAX_SEQ}",
        spec.max_seq
    );
    assert!(
        spec.vocab > BOS as usize,
        "decoder: a vocabulary of {} has no BOS token {BOS}",
        spec.vocab
    );
}

/// `y = x · w / sqrt(mean(x²) + eps)` over the model's width (`f`: [`DECODE`]'s `rmsnorm`).
fn rmsnorm(
    rt: &Runtime,
    f: &CudaFunction,
    x: &CudaSlice<f32>,
    w: &impl DevicePtr<f32>,
    y: &mut CudaSlice<f32>,
    spec: &DecoderSpec,
) -> Result<(), GraphError> {
    let d = spec.dim;
    let launch = Launch::of(rt, f, "rmsnorm")
        .read("x", x, d)
        .read("w", w, d)
        .write("y", y, d)
        .int(d)
        .float(spec.eps);
    // SAFETY: one block of 512 threads (a multiple of 32, as its block sum needs) reads dim
    // floats of `x` and `w` and writes dim of `y`.
    unsafe { launch.launch(blocks(1, 512)) }
}

/// One decode step's kernels: embedding of the current token; per block RMSNorm → QKV
/// projection → rotary embedding and KV-cache write at the current position → attention over
/// the cache → output projection + residual → RMSNorm → gate/up projection → SiLU·up → down
/// projection + residual; the final RMSNorm, the logits, and `last`.
///
/// # Panics
/// If `spec` has heads of odd width or more than [`KERNEL_MAX_SEQ`] positions, or a buffer
/// (weights, cache, state) is smaller than `spec` needs.
pub fn step(
    rt: &Runtime,
    w: &Weights,
    kv: &mut CudaSlice<f32>,
    st: &mut DecodeState,
    spec: &DecoderSpec,
    last: Last<'_>,
) -> Result<(), GraphError> {
    // Looked up once per step, not once per launch.
    let k = Kernels::of(rt)?;
    embed(rt, w, st, spec)?;
    for l in 0..spec.layers {
        block_front(rt, &k, w, st, l, spec)?;
        let (kv_len, max_seq) = (spec.kv_len(), spec.max_seq);
        rope_attention(rt, &k, kv, kv_len, st, l, max_seq, spec)?;
        block_back(rt, &k, w, st, l, spec)?;
    }
    head(rt, &k, w, st, spec, last)
}

/// The decoder's kernels, looked up once per step.
#[derive(Clone)]
pub struct Kernels {
    norm: CudaFunction,
    rope_kv: CudaFunction,
    attention: CudaFunction,
    silu_mul: CudaFunction,
}

impl Kernels {
    /// The kernels, from the runtime's cache.
    pub fn of(rt: &Runtime) -> Result<Self, GraphError> {
        Ok(Kernels {
            norm: rt.function(DECODE, "rmsnorm")?,
            rope_kv: rt.function(DECODE, "rope_kv")?,
            attention: rt.function(DECODE, "attention")?,
            silu_mul: rt.function(DECODE, "silu_mul")?,
        })
    }
}

/// The step's first kernel: the embedding of the current token into the residual stream.
///
/// # Panics
/// As [`step`].
pub fn embed(
    rt: &Runtime,
    w: &Weights,
    st: &mut DecodeState,
    spec: &DecoderSpec,
) -> Result<(), GraphError> {
    check_spec(spec);
    let (d, vocab) = (spec.dim, spec.vocab);
    let launch = Launch::new(rt, DECODE, "embed")?
        .read("table", &w.embed, vocab * d)
        .read("token", &st.token, 1)
        .write("x", &mut st.x, d)
        .int(d);
    // SAFETY: reads row *token of the [vocab, dim] table (*token < vocab: the argmax kernels
    // write indices below vocab, restart writes BOS < vocab) and writes dim floats of `x`.
    unsafe { launch.launch(elems(d)) }
}

/// Block `l` up to its attention: RMSNorm and the QKV projection into the state's `qkv`.
pub fn block_front(
    rt: &Runtime,
    k: &Kernels,
    w: &Weights,
    st: &mut DecodeState,
    l: usize,
    spec: &DecoderSpec,
) -> Result<(), GraphError> {
    let d = spec.dim;
    let attn_norm = w.attn_norm.slice(l * d..(l + 1) * d);
    let wqkv = w.wqkv.slice(l * 3 * d * d..(l + 1) * 3 * d * d);
    rmsnorm(rt, &k.norm, &st.x, &attn_norm, &mut st.xn, spec)?;
    matvec(rt, &wqkv, &st.xn, &mut st.qkv, 3 * d, d, 0.0)
}

/// Block `l`'s rotary embedding, its KV write at the current position and its attention over
/// the cache `kv` (`kv_len` floats: `[layer][k, v][max_seq][dim]`; `layer` picks the block's
/// part of it) into the state's `attn`.
#[allow(clippy::too_many_arguments)]
fn rope_attention(
    rt: &Runtime,
    k: &Kernels,
    kv: &mut CudaSlice<f32>,
    kv_len: usize,
    st: &mut DecodeState,
    layer: usize,
    max_seq: usize,
    spec: &DecoderSpec,
) -> Result<(), GraphError> {
    let d = spec.dim;
    let launch = Launch::of(rt, &k.rope_kv, "rope_kv")
        .write("qkv", &mut st.qkv, 3 * d)
        .write("kv", kv, kv_len)
        .read("pos", &st.pos, 1)
        .int(layer)
        .int(d)
        .int(spec.head_dim())
        .int(max_seq)
        .float(spec.theta);
    // SAFETY: one thread per element of dim rotates the pairs of q and k in the first 2·dim
    // floats of `qkv` (even head width, checked), and copies k and v to row *pos of the
    // layer's cache only when 0 <= *pos < max_seq: inside the kv_len floats of `kv`, which
    // hold (layer + 1)·2·max_seq·dim (the callers' layouts).
    unsafe { launch.launch(elems(d)) }?;
    let launch = Launch::of(rt, &k.attention, "attention")
        .read("qkv", &st.qkv, 3 * d)
        .read("kv", &*kv, kv_len)
        .write("attn", &mut st.attn, d)
        .read("pos", &st.pos, 1)
        .int(layer)
        .int(d)
        .int(spec.head_dim())
        .int(max_seq);
    // SAFETY: one block per head reads its head_dim floats of q, rows 0..=*pos of the layer's
    // cache clamped to max_seq (at most the kernel's MAX_SEQ scores, checked by the callers),
    // and writes head_dim floats of `attn` per head: heads · head_dim = dim (checked).
    unsafe { launch.launch(blocks(spec.heads, 128)) }
}

/// Block `l` after its attention: the output projection and residual, then the feed-forward
/// block (RMSNorm → gate/up projection → SiLU·up → down projection + residual).
pub fn block_back(
    rt: &Runtime,
    k: &Kernels,
    w: &Weights,
    st: &mut DecodeState,
    l: usize,
    spec: &DecoderSpec,
) -> Result<(), GraphError> {
    let (d, ffn) = (spec.dim, spec.ffn);
    let ffn_norm = w.ffn_norm.slice(l * d..(l + 1) * d);
    let wo = w.wo.slice(l * d * d..(l + 1) * d * d);
    let w13 = w.w13.slice(l * 2 * ffn * d..(l + 1) * 2 * ffn * d);
    let w2 = w.w2.slice(l * d * ffn..(l + 1) * d * ffn);
    // Residual: x += Wo · attn (cuBLAS with beta = 1 adds to x in place).
    matvec(rt, &wo, &st.attn, &mut st.x, d, d, 1.0)?;
    rmsnorm(rt, &k.norm, &st.x, &ffn_norm, &mut st.xn, spec)?;
    matvec(rt, &w13, &st.xn, &mut st.gu, 2 * ffn, d, 0.0)?;
    let launch = Launch::of(rt, &k.silu_mul, "silu_mul")
        .read("gu", &st.gu, 2 * ffn)
        .write("h", &mut st.h, ffn)
        .int(ffn);
    // SAFETY: one thread per element of ffn reads 2·ffn floats of `gu`, writes ffn of `h`.
    unsafe { launch.launch(elems(ffn)) }?;
    matvec(rt, &w2, &st.h, &mut st.x, d, ffn, 1.0)
}

/// The step's end: the final RMSNorm, the logits and `last` (the next token).
pub fn head(
    rt: &Runtime,
    k: &Kernels,
    w: &Weights,
    st: &mut DecodeState,
    spec: &DecoderSpec,
    last: Last<'_>,
) -> Result<(), GraphError> {
    let (d, vocab) = (spec.dim, spec.vocab);
    let capacity = st.tokens.len();
    rmsnorm(rt, &k.norm, &st.x, &w.final_norm, &mut st.xn, spec)?;
    matvec(rt, &w.lm_head, &st.xn, &mut st.logits, vocab, d, 0.0)?;

    // The next token: argmax, appended at *pos, then *pos += 1 (and, stopping, the condition).
    let source = match last {
        Last::Argmax => (DECODE, "argmax_advance"),
        Last::ArgmaxStop { .. } => (DECODE_STOP, "argmax_advance_stop"),
    };
    let mut launch = Launch::new(rt, source.0, source.1)?
        .read("logits", &st.logits, vocab)
        .int(vocab)
        .write("token", &mut st.token, 1)
        .write("pos", &mut st.pos, 1);
    if let Last::ArgmaxStop { .. } = last {
        launch = launch.write("done", &mut st.done, 1);
    }
    launch = launch
        .write("tokens", &mut st.tokens, capacity)
        .int(capacity);
    if let Last::ArgmaxStop { go, end } = last {
        launch = launch.i32(end).condition(rt, go);
    }
    // SAFETY: one block of 1024 threads (the argmax's shared arrays hold 1024, a power of two
    // as its reduction needs) reads vocab logits, writes one int each of `token` and `pos`
    // (and `done`), and tokens[*pos] only while *pos < capacity, the length of `tokens`; the
    // stopping kernel also sets the condition, through the handle or flag the runtime gave.
    unsafe { launch.launch(blocks(1, 1024)) }
}

/// A KV cache that grows by concatenation, as candle-transformers' caches do: per block one
/// buffer `[k, v][len][dim]`, replaced at every step by a buffer one row longer (the old rows
/// copied, the new row written), its length known on the host. It cannot live in a graph (its
/// buffers change every step): `21-islands-decoder` runs it in an eager island.
#[derive(Clone)]
pub struct ConcatKv {
    layers: Vec<Option<CudaSlice<f32>>>,
    len: usize,
    /// The host time spent in [`concat_attention`], summed (to separate the islands' own
    /// time from the mechanism's in a measurement).
    pub time: std::time::Duration,
}

impl ConcatKv {
    /// An empty cache for `spec`'s blocks.
    pub fn new(spec: &DecoderSpec) -> Self {
        ConcatKv {
            layers: vec![None; spec.layers],
            len: 0,
            time: std::time::Duration::ZERO,
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Block `l`'s attention with a [`ConcatKv`] cache: its buffer grows by one row (the old rows
/// copied into a new buffer, the new k and v written by the rotary kernel at the current
/// position, which must equal the cache's length), then attention over all rows. After the
/// last block the cache's length moves on.
///
/// # Panics
/// If the cache would exceed the attention kernel's [`KERNEL_MAX_SEQ`] positions.
pub fn concat_attention(
    rt: &Runtime,
    k: &Kernels,
    cache: &mut ConcatKv,
    st: &mut DecodeState,
    l: usize,
    spec: &DecoderSpec,
) -> Result<(), GraphError> {
    let started = std::time::Instant::now();
    let (d, len) = (spec.dim, cache.len);
    let rows = len + 1;
    assert!(
        rows <= KERNEL_MAX_SEQ,
        "the concatenated cache holds at most {KERNEL_MAX_SEQ} rows"
    );
    let s = rt.stream();
    // SAFETY: every element is written before it is read: rows 0..len of k and v by the
    // copies below, row len of both by the rotary kernel (at *pos = len).
    let mut grown = unsafe { s.alloc::<f32>(2 * rows * d) }?;
    if let Some(old) = &cache.layers[l] {
        s.memcpy_dtod(&old.slice(0..len * d), &mut grown.slice_mut(0..len * d))?;
        s.memcpy_dtod(
            &old.slice(len * d..2 * len * d),
            &mut grown.slice_mut(rows * d..(rows + len) * d),
        )?;
    }
    rope_attention(rt, k, &mut grown, 2 * rows * d, st, 0, rows, spec)?;
    cache.layers[l] = Some(grown);
    if l + 1 == spec.layers {
        cache.len += 1;
    }
    cache.time += started.elapsed();
    Ok(())
}

/// The host model's weights on the device, each kind stacked over the blocks.
pub fn upload(s: &Arc<CudaStream>, dec: &Decoder) -> Result<Weights, GraphError> {
    let stack = |f: &dyn Fn(&DecoderLayer) -> &Vec<f32>| {
        dec.layers
            .iter()
            .flat_map(|l| f(l).iter().copied())
            .collect::<Vec<f32>>()
    };
    Ok(Weights {
        embed: s.clone_htod(&dec.embed)?,
        attn_norm: s.clone_htod(&stack(&|l| &l.attn_norm))?,
        wqkv: s.clone_htod(&stack(&|l| &l.wqkv))?,
        wo: s.clone_htod(&stack(&|l| &l.wo))?,
        ffn_norm: s.clone_htod(&stack(&|l| &l.ffn_norm))?,
        w13: s.clone_htod(&stack(&|l| &l.w13))?,
        w2: s.clone_htod(&stack(&|l| &l.w2))?,
        final_norm: s.clone_htod(&dec.final_norm)?,
        lm_head: s.clone_htod(&dec.lm_head)?,
    })
}

/// Checks a generated sequence against the host model, teacher-forced: at each of the first
/// `n` positions the host sees the GPU's prefix and must choose the GPU's token, unless its
/// two candidates are within rounding of each other. Returns the largest logit gap that was
/// forgiven, or where the choice differs.
pub fn check_against_host(dec: &Decoder, tokens: &[i32], n: usize) -> Result<f32, String> {
    let mut cache = HostKvCache::new(&dec.spec);
    let mut forgiven = 0.0f32;
    for p in 0..n.min(tokens.len()) {
        let input = if p == 0 { BOS } else { tokens[p - 1] } as usize;
        let logits = dec.step(&mut cache, input, p);
        let (want, got) = (argmax(&logits), tokens[p] as usize);
        if want != got {
            let gap = logits[want] - logits[got];
            if gap > 1e-3 * logits[want].abs().max(1.0) {
                return Err(format!(
                    "position {p}: the GPU chose token {got}, the host {want} (logit gap {gap})"
                ));
            }
            forgiven = forgiven.max(gap);
        }
    }
    Ok(forgiven)
}

/// The tokens a generation left in `st`: `tokens[..pos]` (the recorded ones).
pub fn generated(s: &Arc<CudaStream>, st: &DecodeState) -> Result<Vec<i32>, GraphError> {
    let pos = s.clone_dtoh(&st.pos)?[0].max(0) as usize;
    let all = s.clone_dtoh(&st.tokens)?;
    Ok(all[..pos.min(all.len())].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> DecoderSpec {
        DecoderSpec {
            dim: 64,
            heads: 4,
            layers: 1,
            ffn: 96,
            vocab: 32,
            max_seq: 16,
            theta: 10_000.0,
            eps: 1e-5,
        }
    }

    #[test]
    fn shapes_the_kernels_handle_pass() {
        check_spec(&spec());
        check_spec(&DecoderSpec {
            max_seq: KERNEL_MAX_SEQ,
            ..spec()
        });
    }

    #[test]
    fn shapes_the_kernels_cannot_handle_are_refused() {
        for bad in [
            DecoderSpec { heads: 3, ..spec() },
            DecoderSpec { heads: 0, ..spec() },
            DecoderSpec {
                heads: 64,
                ..spec()
            },
            DecoderSpec {
                max_seq: KERNEL_MAX_SEQ + 1,
                ..spec()
            },
            DecoderSpec {
                max_seq: 0,
                ..spec()
            },
            DecoderSpec { vocab: 1, ..spec() },
        ] {
            let r = std::panic::catch_unwind(|| check_spec(&bad));
            assert!(r.is_err(), "accepted {bad:?}");
        }
    }
}
