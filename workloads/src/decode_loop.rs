//! The decoder of `14-decode-loop` on the GPU: its weights and state as [`DeviceState`], one
//! decode step's launches ending in the plain argmax or in the argmax that sets a
//! `graph_while` condition ([`DECODE_STOP`]), and the host-side helpers around a generation
//! (restart, the generated tokens, the check against the host model).
//!
//! The model is `05-decode-step`'s (pre-norm transformer, SwiGLU, greedy, batch 1) for any
//! [`DecoderSpec`]; the `#[cuda_graph]` functions that loop over [`step`] are the example's.

use std::sync::Arc;

use graph_runtime::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use graph_runtime::{Condition, DeviceState, GraphError, Runtime};

use crate::kernels::{DECODE, DECODE_STOP};
use crate::ops::blas::matvec;
use crate::reference::{argmax, Decoder, DecoderLayer, DecoderSpec, HostKvCache};

/// The first token.
pub const BOS: i32 = 1;

/// The weights on the device, each kind stacked over the blocks (as in `05-decode-step`).
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

/// The current token and position (device values), the generated tokens, the activations.
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
    /// The state of a generation that has not started: BOS, position 0, buffers zeroed.
    pub fn new(s: &Arc<CudaStream>, spec: &DecoderSpec) -> Result<Self, GraphError> {
        let d = spec.dim;
        Ok(DecodeState {
            token: s.clone_htod(&[BOS])?,
            pos: s.alloc_zeros(1)?,
            done: s.alloc_zeros(1)?,
            tokens: s.alloc_zeros(max_tokens(spec))?,
            x: s.alloc_zeros(d)?,
            xn: s.alloc_zeros(d)?,
            qkv: s.alloc_zeros(3 * d)?,
            attn: s.alloc_zeros(d)?,
            gu: s.alloc_zeros(2 * spec.ffn)?,
            h: s.alloc_zeros(spec.ffn)?,
            logits: s.alloc_zeros(spec.vocab)?,
        })
    }
}

/// Tokens a sequence may have: the cache's positions but the slack row.
pub fn max_tokens(spec: &DecoderSpec) -> usize {
    spec.max_seq - 1
}

/// Back to the start: BOS at position 0, cache and output cleared (host-side, between runs).
pub fn restart(
    s: &Arc<CudaStream>,
    kv: &mut impl DevicePtrMut<f32>,
    st: &mut DecodeState,
) -> Result<(), GraphError> {
    s.memset_zeros(kv)?;
    s.memset_zeros(&mut st.pos)?;
    s.memset_zeros(&mut st.done)?;
    s.memset_zeros(&mut st.tokens)?;
    s.memcpy_htod([BOS].as_slice(), &mut st.token)?;
    Ok(())
}

fn one_block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// How a step ends: the plain argmax, or the argmax that also sets the loop's condition.
#[derive(Clone, Copy)]
pub enum Last<'a> {
    /// The plain argmax (`DECODE`'s `argmax_advance`).
    Argmax,
    /// The argmax that also sets `go` ([`DECODE_STOP`]'s `argmax_advance_stop`).
    ArgmaxStop {
        /// The loop's condition.
        go: &'a Condition,
        /// The end token (-1: none).
        end: i32,
    },
}

/// One decode step's kernels (as in `05-decode-step`, for any size).
pub fn step(
    rt: &Runtime,
    w: &Weights,
    kv: &mut CudaSlice<f32>,
    st: &mut DecodeState,
    spec: &DecoderSpec,
    last: Last<'_>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let embed = rt.function(DECODE, "embed")?;
    let rmsnorm = rt.function(DECODE, "rmsnorm")?;
    let rope_kv = rt.function(DECODE, "rope_kv")?;
    let attention = rt.function(DECODE, "attention")?;
    let silu_mul = rt.function(DECODE, "silu_mul")?;
    let (d, ffn) = (spec.dim, spec.ffn);
    let (di, hd, ms, fi, vi) = (
        d as i32,
        spec.head_dim() as i32,
        spec.max_seq as i32,
        ffn as i32,
        spec.vocab as i32,
    );
    let (eps, theta, tokens) = (spec.eps, spec.theta, max_tokens(spec) as i32);
    let heads = LaunchConfig {
        grid_dim: (spec.heads as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `embed` reads row *token (< vocab: the argmax writes indices below vocab,
    // restart writes BOS) of the [vocab, dim] table and writes dim floats of `x`.
    unsafe {
        s.launch_builder(&embed)
            .arg(&w.embed)
            .arg(&st.token)
            .arg(&mut st.x)
            .arg(&di)
            .launch(LaunchConfig::for_num_elems(d as u32))?;
    }
    for l in 0..spec.layers {
        let li = l as i32;
        let attn_norm = w.attn_norm.slice(l * d..(l + 1) * d);
        let ffn_norm = w.ffn_norm.slice(l * d..(l + 1) * d);
        let wqkv = w.wqkv.slice(l * 3 * d * d..(l + 1) * 3 * d * d);
        let wo = w.wo.slice(l * d * d..(l + 1) * d * d);
        let w13 = w.w13.slice(l * 2 * ffn * d..(l + 1) * 2 * ffn * d);
        let w2 = w.w2.slice(l * d * ffn..(l + 1) * d * ffn);
        // SAFETY: rmsnorm reads dim floats of `x` and the norm weight, writes dim of `xn`.
        unsafe {
            s.launch_builder(&rmsnorm)
                .arg(&st.x)
                .arg(&attn_norm)
                .arg(&mut st.xn)
                .arg(&di)
                .arg(&eps)
                .launch(one_block(512))?;
        }
        matvec(rt, &wqkv, &st.xn, &mut st.qkv, 3 * d, d, 0.0)?;
        // SAFETY: one thread per element of dim rotates q and k of `qkv` (3·dim floats) and
        // writes row *pos of layer l's cache: *pos <= max_tokens < max_seq (the loops stop at
        // max_tokens tokens, and the stopping argmax freezes *pos once done).
        unsafe {
            s.launch_builder(&rope_kv)
                .arg(&mut st.qkv)
                .arg(&mut *kv)
                .arg(&st.pos)
                .arg(&li)
                .arg(&di)
                .arg(&hd)
                .arg(&ms)
                .arg(&theta)
                .launch(LaunchConfig::for_num_elems(d as u32))?;
        }
        // SAFETY: one block per head reads q, rows 0..=*pos (clamped to max_seq <= 1024, the
        // kernel's MAX_SEQ) of layer l's cache, and writes head_dim floats of `attn` per head.
        unsafe {
            s.launch_builder(&attention)
                .arg(&st.qkv)
                .arg(&*kv)
                .arg(&mut st.attn)
                .arg(&st.pos)
                .arg(&li)
                .arg(&di)
                .arg(&hd)
                .arg(&ms)
                .launch(heads)?;
        }
        matvec(rt, &wo, &st.attn, &mut st.x, d, d, 1.0)?;
        // SAFETY: as above.
        unsafe {
            s.launch_builder(&rmsnorm)
                .arg(&st.x)
                .arg(&ffn_norm)
                .arg(&mut st.xn)
                .arg(&di)
                .arg(&eps)
                .launch(one_block(512))?;
        }
        matvec(rt, &w13, &st.xn, &mut st.gu, 2 * ffn, d, 0.0)?;
        // SAFETY: reads 2·ffn floats of `gu`, writes ffn of `h`.
        unsafe {
            s.launch_builder(&silu_mul)
                .arg(&st.gu)
                .arg(&mut st.h)
                .arg(&fi)
                .launch(LaunchConfig::for_num_elems(ffn as u32))?;
        }
        matvec(rt, &w2, &st.h, &mut st.x, d, ffn, 1.0)?;
    }
    // SAFETY: as the block norms.
    unsafe {
        s.launch_builder(&rmsnorm)
            .arg(&st.x)
            .arg(&w.final_norm)
            .arg(&mut st.xn)
            .arg(&di)
            .arg(&eps)
            .launch(one_block(512))?;
    }
    matvec(rt, &w.lm_head, &st.xn, &mut st.logits, spec.vocab, d, 0.0)?;
    // SAFETY: one block of 1024 threads (the kernels' shared arrays hold 1024) reads vocab
    // logits, writes one int each of `token`, `pos` (and `done`), and tokens[*pos] only while
    // *pos < max_tokens, the buffer's length; the stopping variant also sets the condition.
    unsafe {
        match last {
            Last::Argmax => {
                let f = rt.function(DECODE, "argmax_advance")?;
                s.launch_builder(&f)
                    .arg(&st.logits)
                    .arg(&vi)
                    .arg(&mut st.token)
                    .arg(&mut st.pos)
                    .arg(&mut st.tokens)
                    .arg(&tokens)
                    .launch(one_block(1024))?;
            }
            Last::ArgmaxStop { go, end } => {
                let f = rt.function(DECODE_STOP, "argmax_advance_stop")?;
                let go = go.kernel_arg(rt);
                s.launch_builder(&f)
                    .arg(&st.logits)
                    .arg(&vi)
                    .arg(&mut st.token)
                    .arg(&mut st.pos)
                    .arg(&mut st.done)
                    .arg(&mut st.tokens)
                    .arg(&tokens)
                    .arg(&end)
                    .arg(&go)
                    .launch(one_block(1024))?;
            }
        }
    }
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

/// The first `n` tokens against the host model, teacher-forced (near-ties within rounding
/// are forgiven, as in `05-decode-step`).
pub fn check_against_host(dec: &Decoder, tokens: &[i32], n: usize) -> Result<(), String> {
    let mut cache = HostKvCache::new(&dec.spec);
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
        }
    }
    Ok(())
}

/// The tokens a generation left in `st`: `tokens[..pos]`.
pub fn generated(s: &Arc<CudaStream>, st: &DecodeState) -> Result<Vec<i32>, GraphError> {
    let pos = s.clone_dtoh(&st.pos)?[0].max(0) as usize;
    let all = s.clone_dtoh(&st.tokens)?;
    Ok(all[..pos.min(all.len())].to_vec())
}
