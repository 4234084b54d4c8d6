//! Pairs of features with candle bodies (issue 31's composition table, the candle tier;
//! feature `candle`), each against the same function called eagerly on fresh random inputs,
//! over several replays with the inputs changed in between, bitwise, on twins of every `&mut`
//! state and generator:
//!
//! * verify modes (`verify = "every"`, and the debug builds' default) and the determinism
//!   check (`check_determinism = true`, asserted to have run) on candle bodies with derived
//!   state, `ModelState` and `StaticKvCache`, and a host value frozen at capture caught by the
//!   mode at the replay it names;
//! * an eager island in a candle body (`dev.eager(|| …)`, a host sampler with `#[island]`
//!   state) between segments that read a `ModelState`, a derived read-only struct, and write a
//!   derived `&mut` struct and a `StaticKvCache`;
//! * candle graphs on threads that share one runtime and on threads with a runtime each,
//!   captured and dropped in random order between replays; a graph replayed on another
//!   thread than the one that captured it, also after that thread ended;
//! * the runtime's features reached from a candle body (`Runtime::find_by_stream`): a
//!   `graph_if`, a `graph_while` and a `graph_while_unrolled` around in-place candle kernels
//!   and graph-safe draws, a fork, the body's generator and the runtime's, `rt.blas()`; what
//!   the runtime refuses there (a candle op that allocates inside a conditional body, a fork
//!   on a device with cudarc's event tracking on), with its typed error and the runtime usable
//!   after; and candle's own `Tensor::randn` in a graph, which must not repeat its numbers;
//! * `#[cuda_graph]` functions called from a candle body, one of them launching its kernels
//!   early, with `ModelState`, derived state and a `StaticKvCache`.
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead.

#[path = "../examples/common/candle_models.rs"]
mod candle_models;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use candle_models::Mlp;
use candle_transformers::models::llama;
use graph_runtime::candle::candle_core::op::BackpropOp;
use graph_runtime::candle::candle_core::{
    self as candle, CudaStorage, DType, Device, Module, Shape, Storage, StorageRef, Tensor,
};
use graph_runtime::candle::candle_nn::{self, Linear};
use graph_runtime::candle::{ModelState, RotaryTables, StaticKvCache};
use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, Compare, DeviceState, Generator, GraphError, Runtime};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::Rng;
use workloads::check::{first_mismatch, max_abs_diff};
use workloads::ops::blas::{matmul, MatMul};
use workloads::ops::linear::linear_bias_gelu;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

// ---- Helpers ----

/// candle's device on CUDA 0 and a runtime on its stream.
fn candle_runtime() -> Result<(Device, Runtime), GraphError> {
    let dev = Device::new_cuda(0).map_err(c)?;
    let rt = Runtime::from_candle(&dev)?;
    Ok((dev, rt))
}

/// As [`candle_runtime`], with cudarc's event tracking turned off before anything is
/// allocated, as a fork needs (it adds a side stream to the context).
fn candle_runtime_untracked() -> Result<(Device, Runtime), GraphError> {
    let dev = Device::new_cuda(0).map_err(c)?;
    // SAFETY: nothing of this device is allocated yet; its work runs on its one stream, and
    // on side streams only inside the runtime's forks, which wait for that stream before the
    // side branch starts and make it wait for the side branch before they return.
    unsafe { dev.as_cuda_device().map_err(c)?.disable_event_tracking() };
    let rt = Runtime::from_candle(&dev)?;
    Ok((dev, rt))
}

/// A candle error as the runtime's error (what a `Result<_, GraphError>` closure returns).
fn c(e: candle::Error) -> GraphError {
    GraphError::User(Box::new(e))
}

fn fail(message: String) -> GraphError {
    GraphError::User(message.into())
}

/// The elements of `t`, on the host.
fn host(t: &Tensor) -> Result<Vec<f32>, GraphError> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(c)
}

/// `Err` naming `what` and the first element where `got` is not bitwise `want`.
fn same(want: &[f32], got: &[f32], what: impl std::fmt::Display) -> Result<(), GraphError> {
    match first_mismatch(want, got) {
        None => Ok(()),
        Some(d) => Err(fail(format!("{what}: graph != eager: {d:?}"))),
    }
}

/// A `(1, n)` row of fresh random values.
fn row(rng: &mut SmallRng, n: usize, dev: &Device) -> Result<Tensor, GraphError> {
    Tensor::from_vec(random_vec(rng, n), (1, n), dev).map_err(c)
}

/// A `(1,)` u32 tensor: a position or a flag on the device.
fn scalar_u32(v: u32, dev: &Device) -> Result<Tensor, GraphError> {
    Tensor::from_vec(vec![v], 1, dev).map_err(c)
}

/// Whether `e`, or an error it carries (a warmup's, a body's, …), is a `GraphError` for
/// which `typed` holds: the typed error a user matches on.
fn carries(e: &GraphError, typed: impl Fn(&GraphError) -> bool) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        // A boxed source (`Warmup { source: Box<GraphError> }`) is seen as the box.
        let graph_error = err
            .downcast_ref::<GraphError>()
            .or_else(|| err.downcast_ref::<Box<GraphError>>().map(|b| &**b));
        if graph_error.is_some_and(&typed) {
            return true;
        }
        // `User` is transparent: its `source()` skips the error it holds.
        if let Some(GraphError::User(inner)) = graph_error {
            if inner.downcast_ref::<GraphError>().is_some_and(&typed) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// The runtime of candle's device, as a candle body reaches it (its context is `&Device`).
fn runtime_of(dev: &Device) -> candle::Result<Runtime> {
    let stream = dev.as_cuda_device()?.cuda_stream();
    Runtime::find_by_stream(&stream)
        .ok_or_else(|| candle::Error::Msg("no runtime was made from this device".into()))
}

/// The read lock on `t`'s storage, for [`cuda_f32`] and [`cuda_u32`]: `t` must be
/// contiguous from the start of its storage, as an op's output is.
fn storage_of(t: &Tensor) -> candle::Result<StorageRef<'_>> {
    let (storage, layout) = t.storage_and_layout();
    if !layout.is_contiguous() || layout.start_offset() != 0 {
        candle::bail!("a tensor handed to a cudarc call must be contiguous from its start");
    }
    Ok(storage)
}

/// The device buffer of an f32 tensor's storage.
fn cuda_f32(s: &Storage) -> candle::Result<&CudaSlice<f32>> {
    match s {
        Storage::Cuda(s) => s.as_cuda_slice::<f32>(),
        _ => candle::bail!("the tensor is not on a CUDA device"),
    }
}

/// The device buffer of a u32 tensor's storage.
fn cuda_u32(s: &Storage) -> candle::Result<&CudaSlice<u32>> {
    match s {
        Storage::Cuda(s) => s.as_cuda_slice::<u32>(),
        _ => candle::bail!("the tensor is not on a CUDA device"),
    }
}

/// A tensor of `shape` that owns `slice` (filled by a cudarc call in the body).
fn tensor_of(
    slice: CudaSlice<f32>,
    dev: &Device,
    shape: impl Into<Shape>,
) -> candle::Result<Tensor> {
    let storage = CudaStorage::wrap_cuda_slice(slice, dev.as_cuda_device()?.clone());
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        shape,
        BackpropOp::none(),
        false,
    ))
}

/// A linear layer with bias whose weights live in `varmap`.
fn linear(
    varmap: &candle_nn::VarMap,
    dev: &Device,
    name: &str,
    inp: usize,
    out: usize,
) -> Result<Linear, GraphError> {
    let vb = candle_nn::VarBuilder::from_varmap(varmap, DType::F32, dev);
    candle_nn::linear(inp, out, vb.pp(name)).map_err(c)
}

/// After a refused capture: a new graph on `rt` captures and replays like candle eager.
fn still_usable(
    dev: &Device,
    rt: &Runtime,
    rng: &mut SmallRng,
    after: &str,
) -> Result<(), GraphError> {
    let dim = 64;
    let mlp = Mlp::new(dev, 2, dim).map_err(c)?;
    let mut graph = MlpUnverifiedGraph::capture(rt, &row(rng, dim, dev)?, &mlp)?;
    for replay in 0..2 {
        let x = row(rng, dim, dev)?;
        let eager = host(&mlp.forward(&x).map_err(c)?)?;
        same(
            &eager,
            &host(graph.replay(&x)?.result)?,
            format!("{after}: a new graph, replay {replay}"),
        )?;
    }
    Ok(())
}

// ---- Candle bodies shared by the tests ----

/// candle's MLP, no checks on the replays: what a user gets from replays alone.
#[cuda_graph(warmup = 2, verify = "never")]
fn mlp_unverified(dev: &Device, x: &Tensor, #[state] mlp: &Mlp) -> candle::Result<Tensor> {
    let _ = dev;
    mlp.forward(x)
}

/// candle's MLP, every replay verified against an eager run.
#[cuda_graph(warmup = 2, verify = "every")]
fn mlp_step(dev: &Device, x: &Tensor, #[state] mlp: &Mlp) -> candle::Result<Tensor> {
    let _ = dev;
    mlp.forward(x)
}

/// One attention step over a two-layer [`StaticKvCache`] at the position held in `pos` (as
/// `tests/candle.rs`'s), every replay verified, the capture checked for determinism.
#[cuda_graph(warmup = 2, verify = "every", check_determinism = true)]
fn cached_attention(
    dev: &Device,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pos: &Tensor,
    #[state] rotary: &RotaryTables,
    #[state] cache: &mut StaticKvCache,
) -> candle::Result<Tensor> {
    let _ = dev;
    let at = cache.at(pos, 1)?;
    let (q, k) = (rotary.apply(q, &at)?, rotary.apply(k, &at)?);
    let scale = 1.0 / (q.dim(3)? as f64).sqrt();
    let mut outs = Vec::new();
    for (layer, (k, v)) in [(&k, v), (v, &k)].into_iter().enumerate() {
        let (ck, cv) = cache.write(layer, &at, k, v)?;
        let att = (q.matmul(&ck.t()?)? * scale)?.broadcast_add(at.mask())?;
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        outs.push(att.matmul(&cv)?);
    }
    Tensor::cat(&outs, 0)
}

/// candle-transformers' Llama over a window, held through `ModelState`s, every replay
/// verified, the capture checked for determinism.
#[cuda_graph(warmup = 2, verify = "every", check_determinism = true)]
fn llama_window(
    dev: &Device,
    tokens: &Tensor,
    #[state] model: &ModelState<llama::Llama>,
    #[state] cache: &mut ModelState<llama::Cache>,
) -> candle::Result<Tensor> {
    let _ = dev;
    model.model().forward(tokens, 0, cache.model_mut())
}

/// The attention steps' shape: `(batch, heads, max_len, head_dim)`.
const ATTENTION: (usize, usize, usize, usize) = (2, 2, 16, 16);

fn attention_cache(dev: &Device) -> Result<StaticKvCache, GraphError> {
    StaticKvCache::new(2, ATTENTION, DType::F32, dev).map_err(c)
}

fn attention_rotary(dev: &Device) -> Result<RotaryTables, GraphError> {
    let (_, _, max_len, hd) = ATTENTION;
    RotaryTables::llama(hd, 10_000.0, max_len, DType::F32, dev).map_err(c)
}

/// A `(batch, heads, 1, head_dim)` query, key or value.
fn attention_input(rng: &mut SmallRng, dev: &Device) -> Result<Tensor, GraphError> {
    let (batch, heads, _, hd) = ATTENTION;
    Tensor::from_vec(
        random_vec(rng, batch * heads * hd),
        (batch, heads, 1, hd),
        dev,
    )
    .map_err(c)
}

/// One attention step at `pos` as a graph and eagerly on `twin`: results and both layers'
/// keys and values bitwise equal.
fn attention_agrees(
    graph: &mut CachedAttentionGraph<'_>,
    twin: &mut StaticKvCache,
    rotary: &RotaryTables,
    dev: &Device,
    rng: &mut SmallRng,
    pos: u32,
) -> Result<(), GraphError> {
    let (q, k, v) = (
        attention_input(rng, dev)?,
        attention_input(rng, dev)?,
        attention_input(rng, dev)?,
    );
    let p = scalar_u32(pos, dev)?;
    let eager = host(&cached_attention(dev, &q, &k, &v, &p, rotary, twin).map_err(c)?)?;
    same(
        &eager,
        &host(graph.replay(&q, &k, &v, &p)?.result)?,
        format!("position {pos}: result"),
    )?;
    let cache = graph.state_mut().cache;
    for layer in 0..2 {
        let kv = |t: candle::Result<&Tensor>| host(t.map_err(c)?);
        same(
            &kv(twin.keys(layer))?,
            &kv(cache.keys(layer))?,
            format!("position {pos}: layer {layer}'s keys"),
        )?;
        same(
            &kv(twin.values(layer))?,
            &kv(cache.values(layer))?,
            format!("position {pos}: layer {layer}'s values"),
        )?;
    }
    Ok(())
}

/// A Llama of SmolLM's shape, scaled down to two layers of width 64.
fn tiny_llama() -> llama::Config {
    llama::Config {
        hidden_size: 64,
        intermediate_size: 128,
        vocab_size: 256,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 64,
        tie_word_embeddings: false,
    }
}

/// The Llama's window, in tokens.
const WINDOW: usize = 16;

/// [`tiny_llama`] with random weights, held with every variable of its `VarMap`.
fn llama_model(dev: &Device) -> Result<ModelState<llama::Llama>, GraphError> {
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, dev);
    let model = llama::Llama::load(vb, &tiny_llama()).map_err(c)?;
    Ok(ModelState::from_varmap(model, &varmap))
}

/// candle-transformers' `Cache` for a window without a KV cache (rotary tables, masks).
fn llama_cache(dev: &Device) -> Result<llama::Cache, GraphError> {
    llama::Cache::new(false, DType::F32, &tiny_llama(), dev).map_err(c)
}

/// A `(1, WINDOW)` window of random tokens.
fn llama_tokens(rng: &mut SmallRng, dev: &Device) -> Result<Tensor, GraphError> {
    let vocab = tiny_llama().vocab_size as u32;
    let ids: Vec<u32> = (0..WINDOW).map(|_| rng.random_range(0..vocab)).collect();
    Tensor::from_vec(ids, (1, WINDOW), dev).map_err(c)
}

/// One window as a graph and eagerly on `twin`: the logits bitwise equal.
fn llama_agrees(
    graph: &mut LlamaWindowGraph<'_>,
    twin: &mut llama::Cache,
    held: &ModelState<llama::Llama>,
    dev: &Device,
    rng: &mut SmallRng,
    what: &str,
) -> Result<(), GraphError> {
    let x = llama_tokens(rng, dev)?;
    let eager = host(&held.model().forward(&x, 0, twin).map_err(c)?)?;
    same(&eager, &host(graph.replay(&x)?.result)?, what)
}

// ---- Verify modes and the determinism check on candle bodies (G5, G23) ----

/// A host setting of the user's, read by the MLP bodies below through [`scale_every`] and
/// [`scale_default`], helpers the compile-time checks do not see into: a capture freezes the
/// value it read (4 is a scale of 1).
static SETTING_EVERY: AtomicU32 = AtomicU32::new(4);
static SETTING_DEFAULT: AtomicU32 = AtomicU32::new(4);

fn scale_every() -> f64 {
    f64::from(SETTING_EVERY.load(Ordering::Relaxed)) / 4.0
}

fn scale_default() -> f64 {
    f64::from(SETTING_DEFAULT.load(Ordering::Relaxed)) / 4.0
}

/// candle's MLP scaled by the host setting, every replay verified.
#[cuda_graph(warmup = 2, verify = "every", check_determinism = true)]
fn mlp_planted(dev: &Device, x: &Tensor, #[state] mlp: &Mlp) -> candle::Result<Tensor> {
    let _ = dev;
    mlp.forward(x)? * scale_every()
}

/// The same with the build's default checks: in debug builds replays 1, 2, 4, … verified
/// and the capture checked for determinism, in release builds neither.
#[cuda_graph(warmup = 2)]
fn mlp_planted_default(dev: &Device, x: &Tensor, #[state] mlp: &Mlp) -> candle::Result<Tensor> {
    let _ = dev;
    mlp.forward(x)? * scale_default()
}

/// Pairs: candle × verify, devstate-ro × verify, verify × debugchecks, candle × debugchecks
///
/// `verify = "every"` with `check_determinism = true` on a candle body with derived read-only
/// state: the check ran at capture, four verified replays equal candle eager bitwise, a host
/// setting frozen at capture is `VerifyMismatch` at the very next replay (named), and the graph
/// goes on. The build's default checks on the same body: debug builds check determinism and
/// verify replays 1, 2, 4 (the frozen value passes replay 3 and is caught at replay 4), release
/// builds neither. (Every candle graph of `tests/candle.rs` says `verify = "never"`, copied
/// from the benchmark examples 12 and 13 where verified replays would be timed; nothing in the
/// runtime keeps the modes from candle bodies: they run the generic `verify_inputs`.)
#[gpu_test]
fn verify_modes_and_the_determinism_check_run_on_candle_bodies(
    _rt: Runtime,
) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng = fresh_rng("verify_modes_and_the_determinism_check_run_on_candle_bodies");
    let dim = 128;
    let mlp = Mlp::new(&dev, 3, dim).map_err(c)?;

    SETTING_EVERY.store(4, Ordering::Relaxed);
    let mut every = MlpPlantedGraph::capture(&rt, &row(&mut rng, dim, &dev)?, &mlp)?;
    assert!(
        every.info().checks_time > Duration::ZERO,
        "check_determinism = true did not run: {every}"
    );
    for replay in 1..=4 {
        let x = row(&mut rng, dim, &dev)?;
        let eager = host(&mlp_planted(&dev, &x, &mlp).map_err(c)?)?;
        let out = every
            .replay(&x)
            .map_err(|e| fail(format!("verified replay {replay}: {e}")))?;
        same(
            &eager,
            &host(out.result)?,
            format!("verify = \"every\", replay {replay}"),
        )?;
    }
    // The setting changes; the graph keeps the scale it captured, and the next verified replay
    // says so, naming the graph, the replay and the output.
    SETTING_EVERY.store(8, Ordering::Relaxed);
    let Err(err) = every.replay(&row(&mut rng, dim, &dev)?) else {
        panic!("verify = \"every\": replay 5 of a graph whose host setting changed passed");
    };
    SETTING_EVERY.store(4, Ordering::Relaxed);
    let text = err.to_string();
    assert!(
        matches!(
            err,
            GraphError::VerifyMismatch {
                graph: "mlp_planted",
                ..
            }
        ) && text.contains("replay 5")
            && text.contains("output `result`"),
        "a frozen host value under verify = \"every\": {text}"
    );
    let x = row(&mut rng, dim, &dev)?;
    let eager = host(&mlp_planted(&dev, &x, &mlp).map_err(c)?)?;
    same(
        &eager,
        &host(every.replay(&x)?.result)?,
        "verify = \"every\", replay 6, after the mismatch",
    )?;

    SETTING_DEFAULT.store(4, Ordering::Relaxed);
    let mut default = MlpPlantedDefaultGraph::capture(&rt, &row(&mut rng, dim, &dev)?, &mlp)?;
    // Debug builds check determinism by default (release builds still spend a little time on
    // the other checks, so only this direction is asserted).
    if cfg!(debug_assertions) {
        assert!(
            default.info().checks_time > Duration::ZERO,
            "debug builds check determinism by default: {default}"
        );
    }
    for replay in 1..=2 {
        let x = row(&mut rng, dim, &dev)?;
        let eager = host(&mlp_planted_default(&dev, &x, &mlp).map_err(c)?)?;
        same(
            &eager,
            &host(default.replay(&x)?.result)?,
            format!("default checks, replay {replay}"),
        )?;
    }
    SETTING_DEFAULT.store(8, Ordering::Relaxed);
    // Replay 3 is verified in neither build: it scales by the captured 1.
    let x = row(&mut rng, dim, &dev)?;
    let frozen = host(&(mlp.forward(&x).map_err(c)? * 1.0).map_err(c)?)?;
    let third = default.replay(&x);
    let fourth_x = row(&mut rng, dim, &dev)?;
    let third = third.and_then(|out| host(out.result));
    let fourth = default.replay(&fourth_x).map(|out| host(out.result));
    SETTING_DEFAULT.store(4, Ordering::Relaxed);
    same(
        &frozen,
        &third?,
        "default checks, replay 3 (not verified: the captured scale)",
    )?;
    match (fourth, cfg!(debug_assertions)) {
        (Err(e), true) => assert!(
            matches!(
                e,
                GraphError::VerifyMismatch {
                    graph: "mlp_planted_default",
                    ..
                }
            ) && e.to_string().contains("replay 4"),
            "replay 4 with a debug build's default checks: {e}"
        ),
        (Ok(out), false) => {
            let frozen = host(&(mlp.forward(&fourth_x).map_err(c)? * 1.0).map_err(c)?)?;
            same(
                &frozen,
                &out?,
                "default checks in a release build, replay 4 (the captured scale)",
            )?;
        }
        (Ok(_), true) => panic!("a debug build did not verify replay 4"),
        (Err(e), false) => panic!("a release build verified replay 4: {e}"),
    }
    Ok(())
}

/// Pairs: verify × kvcache, modelstate × verify, debugchecks × kvcache, modelstate × debugchecks, devstate-ro × verify
///
/// `verify = "every"` with `check_determinism = true` on an attention step over a
/// `StaticKvCache` (`&mut`, beside read-only `RotaryTables`) and on candle-transformers' Llama
/// held through `ModelState` (`&` and `&mut`): the check ran at capture, and every replay,
/// each verified against an eager run that the verification undoes, equals the eager
/// function on a twin of the state, the cache compared layer by layer after each.
#[gpu_test]
fn verified_replays_of_static_caches_and_foreign_models(_rt: Runtime) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng = fresh_rng("verified_replays_of_static_caches_and_foreign_models");
    let rotary = attention_rotary(&dev)?;
    let mut twin = attention_cache(&dev)?;
    let (q, k, v) = (
        attention_input(&mut rng, &dev)?,
        attention_input(&mut rng, &dev)?,
        attention_input(&mut rng, &dev)?,
    );
    let mut attention = CachedAttentionGraph::capture(
        &rt,
        &q,
        &k,
        &v,
        &scalar_u32(0, &dev)?,
        &rotary,
        attention_cache(&dev)?,
    )?;
    assert!(
        attention.info().checks_time > Duration::ZERO,
        "check_determinism = true did not run: {attention}"
    );
    for pos in 0..6 {
        attention_agrees(&mut attention, &mut twin, &rotary, &dev, &mut rng, pos)?;
    }

    let held = llama_model(&dev)?;
    let mut twin = llama_cache(&dev)?;
    let mut window = LlamaWindowGraph::capture(
        &rt,
        &llama_tokens(&mut rng, &dev)?,
        &held,
        ModelState::new(llama_cache(&dev)?, []),
    )?;
    assert!(
        window.info().checks_time > Duration::ZERO,
        "check_determinism = true did not run: {window}"
    );
    for replay in 1..=4 {
        llama_agrees(
            &mut window,
            &mut twin,
            &held,
            &dev,
            &mut rng,
            &format!("Llama window, verified replay {replay}"),
        )?;
    }
    Ok(())
}

// ---- Eager islands in candle bodies, with every candle state kind (G6, G22) ----

/// A host random generator kept between replays as `#[island]` state.
#[derive(Clone, Debug, PartialEq)]
struct HostRng(u64);

impl HostRng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Top-p sampling on the host: the smallest set of most likely tokens whose probability
/// reaches `p`, then one of them drawn with `rng`.
fn top_p(logits: &[f32], p: f32, rng: &mut HostRng) -> u32 {
    let max = logits.iter().cloned().fold(f32::MIN, f32::max);
    let mut probs: Vec<(usize, f32)> = logits.iter().map(|l| (l - max).exp()).enumerate().collect();
    let total: f32 = probs.iter().map(|(_, q)| q).sum();
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kept = Vec::new();
    let mut mass = 0.0;
    for (i, q) in probs {
        kept.push((i, q));
        mass += q / total;
        if mass >= p {
            break;
        }
    }
    let sum: f32 = kept.iter().map(|(_, q)| q).sum();
    let mut u = rng.next_f32() * sum;
    for (i, q) in &kept {
        if u < *q {
            return *i as u32;
        }
        u -= q;
    }
    kept.last().map_or(0, |(i, _)| *i as u32)
}

/// What the sampler leaves: the step's scores and the token drawn from them.
#[derive(DeviceState)]
struct Sampled {
    /// `(1, vocab)` f32.
    scores: Tensor,
    /// `(1,)` u32.
    token: Tensor,
}

/// A bias on the scores, `(vocab,)`: read-only state of the user's own type.
#[derive(DeviceState)]
struct Bias {
    b: Tensor,
}

/// Segment 1 scores `x` with a foreign model's head and a bias into `sampled`, in place; the
/// island draws a token from the scores on the host (top-p, `#[island]` generator) and writes
/// it back in place; segment 2 caches the token's row of the head's weights as key and value
/// at `pos` and attends `x` over the cache.
#[allow(clippy::too_many_arguments)] // the step's inputs and each state kind, one parameter each
#[cuda_graph(warmup = 2, check_determinism = true)]
fn sample_then_cache(
    dev: &Device,
    x: &Tensor,
    pos: &Tensor,
    #[state] head: &ModelState<Linear>,
    #[state] bias: &Bias,
    #[state] cache: &mut StaticKvCache,
    #[state] sampled: &mut Sampled,
    #[island] rng: &mut HostRng,
) -> candle::Result<Tensor> {
    let d = x.dim(1)?;
    // (Named apart from the field: the island rewrite takes `sampled.scores` for a use of a
    // local `scores`, device data, and refuses to compile.)
    let logits = head.model().forward(x)?.broadcast_add(&bias.b)?;
    sampled.scores.slice_set(&logits, 0, 0)?;
    dev.eager(|| {
        let host_scores = sampled.scores.flatten_all()?.to_vec1::<f32>()?;
        let token = top_p(&host_scores, 0.9, rng);
        sampled
            .token
            .slice_set(&Tensor::new(&[token], dev)?, 0, 0)?;
        Ok(())
    })?;
    let kv = head
        .model()
        .weight()
        .index_select(&sampled.token, 0)?
        .reshape((1, 1, 1, d))?;
    let at = cache.at(pos, 1)?;
    let (ck, cv) = cache.write(0, &at, &kv, &kv)?;
    let q = x.reshape((1, 1, 1, d))?;
    let att = (q.matmul(&ck.t()?)? * (1.0 / (d as f64).sqrt()))?.broadcast_add(at.mask())?;
    candle_nn::ops::softmax_last_dim(&att)?.matmul(&cv)
}

/// Pairs: island × candle, island × modelstate, island × kvcache, devstate-ro × modelstate, devstate-rw × modelstate, modelstate × kvcache, devstate-rw × kvcache
///
/// An eager island in a candle body between two segments that read a `ModelState` head and a
/// derived `&Bias`, and write a derived `&mut Sampled` and a `StaticKvCache` in place, with a
/// host sampler's `#[island]` generator; the capture checked for determinism. Six replays at
/// positions 0 to 5 with fresh inputs against the function called eagerly on twins of every
/// state: result, scores, token, cache and host generator bitwise equal after each; the
/// warmup's draws undone; the island's token changes with the input.
#[gpu_test]
fn an_eager_island_in_a_candle_body_with_every_state_kind(_rt: Runtime) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng = fresh_rng("an_eager_island_in_a_candle_body_with_every_state_kind");
    let (d, vocab, max_len) = (32, 64, 8);
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let head = ModelState::from_varmap(
        candle_nn::linear_no_bias(d, vocab, vb.pp("head")).map_err(c)?,
        &varmap,
    );
    let bias = Bias {
        b: Tensor::from_vec(random_vec(&mut rng, vocab), vocab, &dev).map_err(c)?,
    };
    let new_cache = || StaticKvCache::new(1, (1, 1, max_len, d), DType::F32, &dev).map_err(c);
    let new_sampled = || -> Result<Sampled, GraphError> {
        Ok(Sampled {
            scores: Tensor::zeros((1, vocab), DType::F32, &dev).map_err(c)?,
            token: Tensor::zeros(1, DType::U32, &dev).map_err(c)?,
        })
    };
    let mut graph_rng = HostRng(0x9e37_79b9_7f4a_7c15);
    let mut eager_rng = graph_rng.clone();
    let (mut eager_cache, mut eager_sampled) = (new_cache()?, new_sampled()?);
    let mut graph = SampleThenCacheGraph::capture(
        &rt,
        &row(&mut rng, d, &dev)?,
        &scalar_u32(0, &dev)?,
        &head,
        &bias,
        new_cache()?,
        new_sampled()?,
        &mut graph_rng,
    )?;
    assert_eq!(graph.islands().len(), 1, "{graph}");
    assert_eq!(graph.segments().count(), 2, "{graph}");
    assert!(
        graph.info().checks_time > Duration::ZERO,
        "check_determinism = true did not run: {graph}"
    );
    assert_eq!(
        *graph.state_mut().rng,
        eager_rng,
        "the warmup's draws were not undone"
    );
    let mut tokens = Vec::new();
    for pos in 0..6u32 {
        let (x, p) = (row(&mut rng, d, &dev)?, scalar_u32(pos, &dev)?);
        let ours = host(graph.replay(&x, &p)?.result)?;
        let eager = sample_then_cache(
            &dev,
            &x,
            &p,
            &head,
            &bias,
            &mut eager_cache,
            &mut eager_sampled,
            &mut eager_rng,
        );
        same(
            &host(&eager.map_err(c)?)?,
            &ours,
            format!("position {pos}: result"),
        )?;
        let state = graph.state_mut();
        same(
            &host(&eager_sampled.scores)?,
            &host(&state.sampled.scores)?,
            format!("position {pos}: scores"),
        )?;
        let token = |t: &Tensor| t.to_vec1::<u32>().map_err(c);
        let got = token(&state.sampled.token)?;
        assert_eq!(
            got,
            token(&eager_sampled.token)?,
            "position {pos}: the island's token"
        );
        tokens.push(got[0]);
        let keys = |cache: &StaticKvCache| host(cache.keys(0).map_err(c)?);
        same(
            &keys(&eager_cache)?,
            &keys(state.cache)?,
            format!("position {pos}: cached keys"),
        )?;
        assert_eq!(
            *state.rng, eager_rng,
            "position {pos}: the island's generator"
        );
    }
    tokens.dedup();
    assert!(tokens.len() > 1, "the island always drew {tokens:?}");
    Ok(())
}

// ---- candle graphs on threads, dropped in any order (G7) ----

/// What one thread of [`candle_graphs_on_threads_sharing_a_runtime_or_with_their_own`]
/// captures and checks: a model, its graphs, and an eager twin of each graph's `&mut` state.
trait ThreadWork: Sized {
    type Graph<'a>
    where
        Self: 'a;
    /// The eager twin of one graph's `&mut` state.
    type Twin;
    /// The model on `dev`, run once eagerly (so that its kernels are loaded before any
    /// thread captures).
    fn new(dev: &Device, rng: &mut SmallRng) -> Result<Self, GraphError>;
    fn capture<'a>(
        &'a self,
        rt: &Runtime,
        rng: &mut SmallRng,
    ) -> Result<(Self::Graph<'a>, Self::Twin), GraphError>;
    /// One replay on fresh inputs against the eager function on the twin, at `step`.
    fn step(
        &self,
        graph: &mut Self::Graph<'_>,
        twin: &mut Self::Twin,
        rng: &mut SmallRng,
        step: usize,
    ) -> Result<(), GraphError>;
}

struct MlpWork {
    dev: Device,
    mlp: Mlp,
}

impl ThreadWork for MlpWork {
    type Graph<'a> = MlpStepGraph<'a>;
    type Twin = ();

    fn new(dev: &Device, rng: &mut SmallRng) -> Result<Self, GraphError> {
        let mlp = Mlp::new(dev, 3, 96).map_err(c)?;
        mlp.forward(&row(rng, 96, dev)?).map_err(c)?;
        Ok(MlpWork {
            dev: dev.clone(),
            mlp,
        })
    }

    fn capture<'a>(
        &'a self,
        rt: &Runtime,
        rng: &mut SmallRng,
    ) -> Result<(MlpStepGraph<'a>, ()), GraphError> {
        Ok((
            MlpStepGraph::capture(rt, &row(rng, 96, &self.dev)?, &self.mlp)?,
            (),
        ))
    }

    fn step(
        &self,
        graph: &mut MlpStepGraph<'_>,
        _: &mut (),
        rng: &mut SmallRng,
        step: usize,
    ) -> Result<(), GraphError> {
        let x = row(rng, 96, &self.dev)?;
        let eager = host(&self.mlp.forward(&x).map_err(c)?)?;
        same(
            &eager,
            &host(graph.replay(&x)?.result)?,
            format!("MLP, step {step}"),
        )
    }
}

struct LlamaWork {
    dev: Device,
    held: ModelState<llama::Llama>,
}

impl ThreadWork for LlamaWork {
    type Graph<'a> = LlamaWindowGraph<'a>;
    type Twin = llama::Cache;

    fn new(dev: &Device, rng: &mut SmallRng) -> Result<Self, GraphError> {
        let held = llama_model(dev)?;
        held.model()
            .forward(&llama_tokens(rng, dev)?, 0, &mut llama_cache(dev)?)
            .map_err(c)?;
        Ok(LlamaWork {
            dev: dev.clone(),
            held,
        })
    }

    fn capture<'a>(
        &'a self,
        rt: &Runtime,
        rng: &mut SmallRng,
    ) -> Result<(LlamaWindowGraph<'a>, llama::Cache), GraphError> {
        let state = ModelState::new(llama_cache(&self.dev)?, []);
        let graph =
            LlamaWindowGraph::capture(rt, &llama_tokens(rng, &self.dev)?, &self.held, state)?;
        Ok((graph, llama_cache(&self.dev)?))
    }

    fn step(
        &self,
        graph: &mut LlamaWindowGraph<'_>,
        twin: &mut llama::Cache,
        rng: &mut SmallRng,
        step: usize,
    ) -> Result<(), GraphError> {
        llama_agrees(
            graph,
            twin,
            &self.held,
            &self.dev,
            rng,
            &format!("Llama window, step {step}"),
        )
    }
}

struct AttentionWork {
    dev: Device,
    rotary: RotaryTables,
}

impl ThreadWork for AttentionWork {
    type Graph<'a> = CachedAttentionGraph<'a>;
    type Twin = StaticKvCache;

    fn new(dev: &Device, rng: &mut SmallRng) -> Result<Self, GraphError> {
        let rotary = attention_rotary(dev)?;
        let (q, k, v) = (
            attention_input(rng, dev)?,
            attention_input(rng, dev)?,
            attention_input(rng, dev)?,
        );
        cached_attention(
            dev,
            &q,
            &k,
            &v,
            &scalar_u32(0, dev)?,
            &rotary,
            &mut attention_cache(dev)?,
        )
        .map_err(c)?;
        Ok(AttentionWork {
            dev: dev.clone(),
            rotary,
        })
    }

    fn capture<'a>(
        &'a self,
        rt: &Runtime,
        rng: &mut SmallRng,
    ) -> Result<(CachedAttentionGraph<'a>, StaticKvCache), GraphError> {
        let dev = &self.dev;
        let (q, k, v) = (
            attention_input(rng, dev)?,
            attention_input(rng, dev)?,
            attention_input(rng, dev)?,
        );
        let graph = CachedAttentionGraph::capture(
            rt,
            &q,
            &k,
            &v,
            &scalar_u32(0, dev)?,
            &self.rotary,
            attention_cache(dev)?,
        )?;
        Ok((graph, attention_cache(dev)?))
    }

    fn step(
        &self,
        graph: &mut CachedAttentionGraph<'_>,
        twin: &mut StaticKvCache,
        rng: &mut SmallRng,
        step: usize,
    ) -> Result<(), GraphError> {
        attention_agrees(graph, twin, &self.rotary, &self.dev, rng, step as u32)
    }
}

/// Runs `f` unless an earlier stage of this thread failed (a panic counts as a failure), then
/// waits for every thread at `barrier`: a failed thread still reaches each barrier, so that
/// no thread waits for it forever.
fn stage<T>(
    failed: &mut Option<GraphError>,
    barrier: &Barrier,
    f: impl FnOnce() -> Result<T, GraphError>,
) -> Option<T> {
    let out = if failed.is_none() {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                *failed = Some(e);
                None
            }
            Err(_) => {
                *failed = Some(fail("panicked".into()));
                None
            }
        }
    } else {
        None
    };
    barrier.wait();
    out
}

/// Replays every live graph of `lanes` at steps `steps`, against eager on its twin.
fn replay_lanes<W: ThreadWork>(
    work: &W,
    lanes: &mut [Option<(W::Graph<'_>, W::Twin)>],
    rng: &mut SmallRng,
    steps: std::ops::Range<usize>,
    drop_at: Option<(usize, usize)>,
) -> Result<(), GraphError> {
    for step in steps {
        for (lane, slot) in lanes.iter_mut().enumerate() {
            if let Some((graph, twin)) = slot {
                work.step(graph, twin, rng, step)
                    .map_err(|e| fail(format!("graph {lane}, step {step}: {e}")))?;
            }
        }
        if let Some((at, which)) = drop_at {
            if at == step {
                lanes[which] = None;
            }
        }
    }
    Ok(())
}

/// One thread: the shared runtime or one of its own; two graphs captured, replayed, one of
/// them dropped at a random step; a third captured while the survivor lives; all replayed,
/// then dropped in random order. Captures happen between barriers, when no thread of the
/// shared runtime uses it (its contract: candle's runtime captures on the stream it was
/// given), and replays, eager runs and drops of all threads overlap.
fn thread_lanes<W: ThreadWork>(
    shared: Option<&(Device, Runtime)>,
    tag: &str,
    barrier: &Barrier,
) -> Result<String, GraphError> {
    let mut failed = None;
    let mut rng = fresh_rng(tag);
    let prepared = stage(&mut failed, barrier, || {
        let own = match shared {
            Some(_) => None,
            None => Some(candle_runtime()?),
        };
        let dev = &own
            .as_ref()
            .or(shared)
            .ok_or_else(|| fail("no runtime".into()))?
            .0;
        let work = W::new(dev, &mut rng)?;
        dev.synchronize().map_err(c)?;
        Ok((own, work))
    });
    let (own, work) = match prepared {
        Some((own, work)) => (own, Some(work)),
        None => (None, None),
    };
    let rt = own.as_ref().or(shared).map(|(_, rt)| rt);
    let ready = || {
        Ok::<_, GraphError>((
            work.as_ref().ok_or_else(|| fail("not prepared".into()))?,
            rt.ok_or_else(|| fail("no runtime".into()))?,
        ))
    };
    let mut lanes: Vec<Option<(W::Graph<'_>, W::Twin)>> = Vec::new();
    stage(&mut failed, barrier, || {
        let (work, rt) = ready()?;
        for _ in 0..2 {
            lanes.push(Some(work.capture(rt, &mut rng)?));
        }
        Ok(())
    });
    let drop_at = (rng.random_range(0..3), rng.random_range(0..2));
    stage(&mut failed, barrier, || {
        replay_lanes(ready()?.0, &mut lanes, &mut rng, 0..3, Some(drop_at))
    });
    stage(&mut failed, barrier, || {
        let (work, rt) = ready()?;
        lanes.push(Some(work.capture(rt, &mut rng)?));
        Ok(())
    });
    stage(&mut failed, barrier, || {
        replay_lanes(ready()?.0, &mut lanes, &mut rng, 3..6, None)?;
        let mut order: Vec<usize> = (0..lanes.len()).collect();
        order.shuffle(&mut rng);
        for lane in order {
            lanes[lane] = None;
        }
        Ok(())
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(format!(
            "{tag}: 3 graphs captured, replayed like eager and dropped (graph {} after step {})",
            drop_at.1, drop_at.0
        )),
    }
}

/// Pairs: candle × rt-shared, candle × drops, modelstate × rt-shared, modelstate × rt-per-thread, modelstate × drops, rt-per-thread × kvcache, rt-shared × kvcache, drops × kvcache, verify × rt-shared, verify × rt-per-thread, verify × drops
///
/// Six threads: an MLP, a Llama held through `ModelState` and an attention step over a
/// `StaticKvCache` (all three with `verify = "every"`), each kind on one thread sharing one
/// candle runtime and on one thread with a runtime of its own. Each captures two graphs,
/// replays them against eager on twins of their state while the other threads replay and
/// drop theirs, drops one at a random step, captures a third beside the survivor, replays
/// both and drops all in random order; every replay equals eager bitwise. (Captures happen
/// between barriers: the shared runtime's contract is that no thread uses it while another
/// captures.)
#[gpu_test]
fn candle_graphs_on_threads_sharing_a_runtime_or_with_their_own(
    _rt: Runtime,
) -> Result<(), GraphError> {
    const KINDS: usize = 3;
    let shared = candle_runtime()?;
    let barrier = Barrier::new(2 * KINDS);
    let results: Vec<Result<String, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2 * KINDS)
            .map(|t| {
                let (shared, barrier) = ((t < KINDS).then_some(&shared), &barrier);
                let mode = if shared.is_some() {
                    "shared runtime"
                } else {
                    "own runtime"
                };
                scope.spawn(move || {
                    let tag = format!("candle_graphs_on_threads_{t}");
                    let done = match t % KINDS {
                        0 => thread_lanes::<MlpWork>(shared, &tag, barrier),
                        1 => thread_lanes::<LlamaWork>(shared, &tag, barrier),
                        _ => thread_lanes::<AttentionWork>(shared, &tag, barrier),
                    };
                    done.map_err(|e| format!("thread {t} ({mode}): {e}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".to_owned())))
            .collect()
    });
    for r in results.iter().flatten() {
        eprintln!("{r}");
    }
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "threads failed: {failed:#?}");
    Ok(())
}

/// Pairs: candle × rt-shared
///
/// A candle graph captured on one thread and sent to another: replays there equal candle
/// eager while the capturing thread lives. That thread then ends, and candle's upload cache
/// of that thread (the small shape uploads the graph's copies read) is freed with it, its
/// memory reused by new tensors: each later replay must still equal eager or be refused with
/// `ForeignMemoryMoved` before it launches, never silently wrong; and a new capture on this
/// thread works.
#[gpu_test]
fn a_candle_graph_replays_on_another_thread_and_after_its_capturing_thread_ended(
    _rt: Runtime,
) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng =
        fresh_rng("a_candle_graph_replays_on_another_thread_and_after_its_capturing_thread_ended");
    let dim = 128;
    let mlp = Mlp::new(&dev, 3, dim).map_err(c)?;
    let x0 = row(&mut rng, dim, &dev)?;
    dev.synchronize().map_err(c)?;
    let mut graph = std::thread::scope(|scope| -> Result<_, GraphError> {
        let (to_main, from_capturer) = std::sync::mpsc::channel();
        let (to_capturer, from_main) = std::sync::mpsc::channel::<()>();
        let (rt, x0, mlp) = (&rt, &x0, &mlp);
        let capturer = scope.spawn(move || {
            let captured = MlpUnverifiedGraph::capture(rt, x0, mlp);
            let _ = to_main.send(captured);
            // Alive until the other thread has replayed.
            let _ = from_main.recv();
        });
        let graph = from_capturer
            .recv()
            .map_err(|e| fail(format!("the capturing thread: {e}")));
        let checked = graph.and_then(|graph| {
            let mut graph = graph?;
            for replay in 0..4 {
                let x = row(&mut rng, dim, &dev)?;
                let eager = host(&mlp.forward(&x).map_err(c)?)?;
                same(
                    &eager,
                    &host(graph.replay(&x)?.result)?,
                    format!("on another thread, replay {replay}"),
                )?;
            }
            Ok(graph)
        });
        drop(to_capturer);
        capturer
            .join()
            .map_err(|_| fail("the capturing thread panicked".into()))?;
        checked
    })?;
    dev.synchronize().map_err(c)?;
    // New small tensors, zeros, where the freed uploads were.
    let bystanders = (1..=64)
        .map(|n| Tensor::zeros(n, DType::U32, &dev))
        .collect::<candle::Result<Vec<_>>>()
        .map_err(c)?;
    for replay in 0..4 {
        let x = row(&mut rng, dim, &dev)?;
        let eager = host(&mlp.forward(&x).map_err(c)?)?;
        match graph.replay(&x) {
            Ok(out) => same(
                &eager,
                &host(out.result)?,
                format!("after the capturing thread ended, replay {replay}"),
            )?,
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        GraphError::ForeignMemoryMoved {
                            graph: "mlp_unverified",
                            ..
                        }
                    ),
                    "after the capturing thread ended, replay {replay}: {e:?}"
                );
                eprintln!("refused after the capturing thread ended: {e}");
                break;
            }
        }
    }
    drop(bystanders);
    still_usable(&dev, &rt, &mut rng, "after the capturing thread ended")
}

// ---- The runtime's features reached from a candle body (G21) ----

/// `y · Wᵀ` through the runtime's cuBLAS handle (`rt.blas()`), on the tensors' storage.
fn blas_linear(rt: &Runtime, x: &Tensor, w: &Tensor) -> candle::Result<Tensor> {
    let ((rows, k), (n, _)) = (x.dims2()?, w.dims2()?);
    let mut y = rt
        .stream()
        .alloc_zeros::<f32>(rows * n)
        .map_err(GraphError::from)?;
    {
        let (xs, ws) = (storage_of(x)?, storage_of(w)?);
        matmul(
            rt,
            cuda_f32(&xs)?,
            cuda_f32(&ws)?,
            &mut y,
            MatMul::nt(rows, n, k),
        )?;
    }
    tensor_of(y, x.device(), (rows, n))
}

/// A fork: the side branch copies `y` while candle's GELU of `y` runs on the runtime's
/// stream; the copy and the GELU.
fn fork_gelu(rt: &Runtime, y: &Tensor) -> candle::Result<(Tensor, Tensor)> {
    let mut copy = rt
        .stream()
        .alloc_zeros::<f32>(y.elem_count())
        .map_err(GraphError::from)?;
    let gelu = {
        let ys = storage_of(y)?;
        let ys = cuda_f32(&ys)?;
        rt.fork(|side| {
            side.memcpy(side.read(ys), side.write(&mut copy))?;
            y.gelu().map_err(c)
        })?
    };
    Ok((tensor_of(copy, y.device(), y.shape().clone())?, gelu))
}

/// A decode-like step that reaches the runtime from its candle body: a `graph_if` zeroes
/// the cache for a new sequence (candle's fill kernels, in place); a `graph_while` redraws
/// `noise` from the graph-safe generator until its first value is positive, writing the
/// step's key and value into the cache in place on every iteration (candle's scatter
/// kernel); a `graph_while_unrolled` redraws until it is above 0.5; the runtime's own
/// generator draws a jitter; `rt.blas()` multiplies by the foreign model's weights; a fork
/// copies the product beside candle's GELU of it; candle attends over the cache.
#[allow(clippy::too_many_arguments)] // the step's inputs and each state kind, one parameter each
#[cuda_graph(warmup = 2, check_determinism = true)]
fn runtime_from_candle(
    dev: &Device,
    x: &Tensor,
    pos: &Tensor,
    reset: &Tensor,
    #[state] head: &ModelState<Linear>,
    #[state] g: &Generator,
    #[state] cache: &mut StaticKvCache,
    #[state] noise: &mut CudaSlice<f32>,
) -> candle::Result<Tensor> {
    let rt = runtime_of(dev)?;
    let d = x.dim(1)?;
    let fresh = rt.condition(false)?;
    {
        let r = storage_of(reset)?;
        fresh.set_from(&rt, cuda_u32(&r)?, Compare::Ne, 0u32)?;
    }
    rt.graph_if(&fresh, |_| cache.reset().map_err(c))?;
    let at = cache.at(pos, 1)?;
    let kv = x.reshape((1, 1, 1, d))?;
    cache.write(0, &at, &kv, &kv)?;
    g.normal(&rt, noise, 0.0, 1.0)?;
    let again = rt.condition(false)?;
    again.set_from(&rt, &*noise, Compare::Le, 0.0)?;
    rt.graph_while(&again, Some(16), |rt| {
        g.normal(rt, noise, 0.0, 1.0)?;
        cache.write(0, &at, &kv, &kv).map_err(c)?;
        again.set_from(rt, &*noise, Compare::Le, 0.0)
    })?;
    let higher = rt.condition(false)?;
    higher.set_from(&rt, &*noise, Compare::Le, 0.5)?;
    rt.graph_while_unrolled(&higher, Some(16), 4, |rt| {
        g.normal(rt, noise, 0.0, 1.0)?;
        higher.set_from(rt, &*noise, Compare::Le, 0.5)
    })?;
    let mut jitter = rt
        .stream()
        .alloc_zeros::<f32>(d)
        .map_err(GraphError::from)?;
    rt.rng().uniform(&rt, &mut jitter, -0.125, 0.125)?;
    let drawn = rt.stream().clone_dtod(&*noise).map_err(GraphError::from)?;
    let h = ((x + tensor_of(drawn, dev, (1, d))?)? + tensor_of(jitter, dev, (1, d))?)?;
    let y = blas_linear(&rt, &h, head.model().weight())?;
    let (copy, gelu) = fork_gelu(&rt, &y)?;
    let q = (gelu + copy)?.reshape((1, 1, 1, d))?;
    let att =
        (q.matmul(&cache.keys(0)?.t()?)? * (1.0 / (d as f64).sqrt()))?.broadcast_add(at.mask())?;
    candle_nn::ops::softmax_last_dim(&att)?.matmul(cache.values(0)?)
}

/// Pairs: while × candle, if × candle, unrolled × candle, fork × candle, rng × candle, candle × cublas, while × modelstate, if × modelstate, unrolled × modelstate, fork × modelstate, rng × modelstate, modelstate × cublas, while × kvcache, if × kvcache, unrolled × kvcache, fork × kvcache, rng × kvcache, kvcache × cublas
///
/// A candle body that reaches its runtime (`Runtime::find_by_stream`) and records a
/// `graph_if` and a `graph_while` around candle's in-place kernels on a `StaticKvCache`, a
/// `graph_while_unrolled`, draws of the body's generator and of the runtime's, a GEMM on
/// `rt.blas()` over a `ModelState`'s weights and a fork beside a candle op; the capture
/// checked for determinism. Six replays with fresh inputs, two of them new sequences, against
/// the function called eagerly on twins of the cache, the noise and the generator (the
/// runtime's generator put back where the replay started): result, cache, noise and both
/// generators' seeds and offsets equal after each.
#[gpu_test]
fn the_runtime_reached_from_a_candle_body_records_branches_loops_draws_gemms_and_forks(
    _rt: Runtime,
) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime_untracked()?;
    let mut rng = fresh_rng(
        "the_runtime_reached_from_a_candle_body_records_branches_loops_draws_gemms_and_forks",
    );
    let (d, max_len) = (64, 8);
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let head = ModelState::from_varmap(
        candle_nn::linear_no_bias(d, d, vb.pp("head")).map_err(c)?,
        &varmap,
    );
    let seed = rng.random::<u64>();
    let (g, twin) = (rt.generator(seed)?, rt.generator(seed)?);
    let new_cache = || StaticKvCache::new(1, (1, 1, max_len, d), DType::F32, &dev).map_err(c);
    let new_noise = || rt.stream().alloc_zeros::<f32>(d).map_err(GraphError::from);
    let (mut eager_cache, mut eager_noise) = (new_cache()?, new_noise()?);
    let mut graph = RuntimeFromCandleGraph::capture(
        &rt,
        &row(&mut rng, d, &dev)?,
        &scalar_u32(0, &dev)?,
        &scalar_u32(1, &dev)?,
        &head,
        &g,
        new_cache()?,
        new_noise()?,
    )?;
    assert!(
        graph.info().checks_time > Duration::ZERO,
        "check_determinism = true did not run: {graph}"
    );
    assert_eq!(
        g.seed_and_offset(&rt)?,
        twin.seed_and_offset(&rt)?,
        "the warmup's draws were not undone"
    );
    for step in 0..6u32 {
        let x = row(&mut rng, d, &dev)?;
        let (pos, reset) = (
            scalar_u32(step % 3, &dev)?,
            scalar_u32(u32::from(step % 3 == 0), &dev)?,
        );
        let before = rt.rng().seed_and_offset(&rt)?;
        let ours = host(graph.replay(&x, &pos, &reset)?.result)?;
        let after = rt.rng().seed_and_offset(&rt)?;
        assert_ne!(
            before, after,
            "step {step}: the runtime's generator did not move"
        );
        rt.rng().set_seed_and_offset(&rt, before.0, before.1)?;
        let eager = runtime_from_candle(
            &dev,
            &x,
            &pos,
            &reset,
            &head,
            &twin,
            &mut eager_cache,
            &mut eager_noise,
        );
        same(
            &host(&eager.map_err(c)?)?,
            &ours,
            format!("step {step}: result"),
        )?;
        assert_eq!(
            rt.rng().seed_and_offset(&rt)?,
            after,
            "step {step}: the runtime's generator"
        );
        assert_eq!(
            g.seed_and_offset(&rt)?,
            twin.seed_and_offset(&rt)?,
            "step {step}: the body's generator"
        );
        let state = graph.state_mut();
        let keys = |cache: &StaticKvCache| host(cache.keys(0).map_err(c)?);
        same(
            &keys(&eager_cache)?,
            &keys(state.cache)?,
            format!("step {step}: cached keys"),
        )?;
        let noise = rt.stream().clone_dtoh(&state.noise)?;
        same(
            &rt.stream().clone_dtoh(&eager_noise)?,
            &noise,
            format!("step {step}: noise"),
        )?;
    }
    Ok(())
}

/// A candle op that allocates its output inside a conditional body (`construct` 0:
/// `graph_while`, 1: `graph_if`, 2: `graph_while_unrolled`), beside a foreign model and a
/// static cache: the host loop or branch eagerly; refused at capture.
#[cuda_graph(warmup = 1)]
fn candle_op_in_conditional(
    dev: &Device,
    x: &Tensor,
    pos: &Tensor,
    #[state] head: &ModelState<Linear>,
    #[state] cache: &mut StaticKvCache,
    #[constant] construct: u32,
) -> candle::Result<Tensor> {
    let rt = runtime_of(dev)?;
    let d = x.dim(1)?;
    let at = cache.at(pos, 1)?;
    let go = rt.condition(true)?;
    let step = |rt: &Runtime| -> Result<(), GraphError> {
        let kv = head
            .model()
            .forward(x)
            .and_then(|y| y.reshape((1, 1, 1, d)))
            .map_err(c)?;
        cache.write(0, &at, &kv, &kv).map_err(c)?;
        go.set(rt, false)
    };
    match construct {
        0 => rt.graph_while(&go, Some(2), step)?,
        1 => rt.graph_if(&go, step)?,
        _ => rt.graph_while_unrolled(&go, Some(2), 2, step)?,
    }
    cache.keys(0)?.sum_keepdim(2)
}

/// The fork of [`fork_gelu`] alone.
#[cuda_graph(warmup = 1)]
fn forked_gelu(dev: &Device, y: &Tensor) -> candle::Result<Tensor> {
    let rt = runtime_of(dev)?;
    let (copy, gelu) = fork_gelu(&rt, y)?;
    gelu + copy
}

/// Pairs: while × candle, if × candle, unrolled × candle, fork × candle, while × modelstate, if × modelstate, unrolled × modelstate, while × kvcache, if × kvcache, unrolled × kvcache
///
/// What the runtime cannot record from a candle body: a candle op that allocates its output
/// inside a `graph_while`, a `graph_if` or a `graph_while_unrolled` (beside a `ModelState`
/// and a `StaticKvCache`) runs eagerly and is refused at capture, naming the conditional
/// body; a fork on a device whose cudarc event tracking is on (`Device::new_cuda` as it is)
/// is refused naming event tracking. After each refusal the runtime captures and replays a
/// new graph like eager. Each refusal must reach the user as its typed `GraphError`
/// (`ForbiddenInConditional`, `EventTracking`), as it does from a cudarc body.
#[gpu_test]
fn candle_work_the_runtime_cannot_record_is_refused_with_its_typed_error(
    _rt: Runtime,
) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng =
        fresh_rng("candle_work_the_runtime_cannot_record_is_refused_with_its_typed_error");
    let d = 32;
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let head = ModelState::from_varmap(
        candle_nn::linear_no_bias(d, d, vb.pp("head")).map_err(c)?,
        &varmap,
    );
    let new_cache = || StaticKvCache::new(1, (1, 1, 8, d), DType::F32, &dev).map_err(c);
    let mut untyped = Vec::new();
    for (construct, name) in [
        (0u32, "graph_while"),
        (1, "graph_if"),
        (2, "graph_while_unrolled"),
    ] {
        let (x, pos) = (row(&mut rng, d, &dev)?, scalar_u32(0, &dev)?);
        candle_op_in_conditional(&dev, &x, &pos, &head, &mut new_cache()?, construct)
            .map_err(|e| fail(format!("{name}, eagerly: {e}")))?;
        let err =
            CandleOpInConditionalGraph::capture(&rt, &x, &pos, &head, new_cache()?, construct)
                .map(drop)
                .expect_err("a candle op that allocates inside a conditional body was captured");
        eprintln!("{name}: refused: {err}");
        assert!(
            err.to_string().contains("inside a conditional body"),
            "{name}: {err}"
        );
        if !carries(&err, |g| {
            matches!(g, GraphError::ForbiddenInConditional { .. })
        }) {
            untyped.push(format!("{name}: {err:?}"));
        }
        still_usable(&dev, &rt, &mut rng, &format!("after the refused {name}"))?;
    }
    let err = ForkedGeluGraph::capture(&rt, &row(&mut rng, d, &dev)?)
        .map(drop)
        .expect_err("a fork on a context with event tracking on was captured");
    eprintln!("fork: refused: {err}");
    assert!(err.to_string().contains("event tracking"), "fork: {err}");
    if !carries(&err, |g| matches!(g, GraphError::EventTracking { .. })) {
        untyped.push(format!("fork: {err:?}"));
    }
    still_usable(&dev, &rt, &mut rng, "after the refused fork")?;
    assert!(
        untyped.is_empty(),
        "refusals from candle bodies reach the user only as text (GraphError::User), not as their \
         typed GraphError:\n{}",
        untyped.join("\n")
    );
    Ok(())
}

/// `x` plus candle's own normal numbers (`Tensor::randn`, candle's cuRAND generator), no
/// checks at capture.
#[cuda_graph(warmup = 1, verify = "never", check_determinism = false)]
fn candle_noise(dev: &Device, x: &Tensor) -> candle::Result<Tensor> {
    x + Tensor::randn(0f32, 1.0, x.shape(), dev)?
}

/// The same, the capture checked for determinism.
#[cuda_graph(warmup = 1, verify = "never", check_determinism = true)]
fn candle_noise_checked(dev: &Device, x: &Tensor) -> candle::Result<Tensor> {
    x + Tensor::randn(0f32, 1.0, x.shape(), dev)?
}

/// Four replays of a `candle_noise` graph on fresh inputs: the noise each adds (its output
/// less its input) has mean 0 and deviation 1, and no two replays add the same noise.
fn draws_fresh(
    what: &str,
    dev: &Device,
    rng: &mut SmallRng,
    mut replay: impl FnMut(&Tensor) -> Result<Vec<f32>, GraphError>,
) -> Result<(), GraphError> {
    let n = 4096;
    let mut seen: Vec<Vec<f32>> = Vec::new();
    for r in 0..4 {
        let host_x = random_vec(rng, n);
        let out = replay(&Tensor::from_vec(host_x.clone(), n, dev).map_err(c)?)?;
        let noise: Vec<f32> = out.iter().zip(&host_x).map(|(o, x)| o - x).collect();
        let mean = noise.iter().sum::<f32>() / n as f32;
        let std = (noise.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32).sqrt();
        assert!(
            mean.abs() < 0.1 && (0.9..1.1).contains(&std),
            "{what}, replay {r}: noise of mean {mean}, deviation {std}"
        );
        for (earlier, e) in seen.iter().enumerate() {
            let apart = max_abs_diff(e, &noise);
            assert!(
                apart > 0.1,
                "{what}: replay {r} added the noise of replay {earlier} (within {apart}): candle's \
                 Tensor::randn repeats its numbers in a graph"
            );
        }
        seen.push(noise);
    }
    Ok(())
}

/// Pairs: rng × candle
///
/// candle's own random numbers (`Tensor::randn`: candle's cuRAND generator, whose position is
/// kept by cuRAND on the host side) in a graph, captured without and with the determinism
/// check: each capture is either refused with an error (and the runtime goes on) or its
/// replays draw fresh numbers (mean 0, deviation 1, different on every replay); a graph
/// whose replays repeat the capture's numbers fails.
#[gpu_test]
fn candles_own_random_numbers_in_a_graph_are_fresh_or_refused(
    _rt: Runtime,
) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng = fresh_rng("candles_own_random_numbers_in_a_graph_are_fresh_or_refused");
    let x0 = Tensor::zeros(4096, DType::F32, &dev).map_err(c)?;
    match CandleNoiseGraph::capture(&rt, &x0) {
        Ok(mut graph) => draws_fresh("no checks", &dev, &mut rng, |x| {
            host(graph.replay(x)?.result)
        })?,
        Err(e) => eprintln!("no checks: refused: {e}"),
    }
    still_usable(&dev, &rt, &mut rng, "candle's randn, no checks")?;
    match CandleNoiseCheckedGraph::capture(&rt, &x0) {
        Ok(mut graph) => {
            assert!(
                graph.info().checks_time > Duration::ZERO,
                "check_determinism = true did not run: {graph}"
            );
            draws_fresh("check_determinism", &dev, &mut rng, |x| {
                host(graph.replay(x)?.result)
            })?
        }
        Err(e) => eprintln!("check_determinism: refused: {e}"),
    }
    still_usable(&dev, &rt, &mut rng, "candle's randn, check_determinism")
}

// ---- `#[cuda_graph]` functions called from candle bodies, with early launches (G15, G14) ----

/// `gelu(x · Wᵀ + b)` of a candle-nn layer by the library's `linear_bias_gelu` kernel on the
/// tensors' storage, launched early (while the kernel before it finishes) or in order.
/// `y` holds `rows · n` floats, allocated before the kernel that comes before this one: an
/// allocation or a memset in between would leave the kernel nothing to launch early after.
fn linear_gelu(
    rt: &Runtime,
    early: bool,
    x: &Tensor,
    layer: &Linear,
    mut y: CudaSlice<f32>,
) -> candle::Result<Tensor> {
    let ((rows, k), (n, _)) = (x.dims2()?, layer.weight().dims2()?);
    let bias = layer
        .bias()
        .ok_or_else(|| candle::Error::Msg("the layer has no bias".into()))?;
    {
        let (xs, ws, bs) = (
            storage_of(x)?,
            storage_of(layer.weight())?,
            storage_of(bias)?,
        );
        linear_bias_gelu(
            rt,
            early,
            cuda_f32(&xs)?,
            cuda_f32(&ws)?,
            cuda_f32(&bs)?,
            &mut y,
            rows,
            n,
            k,
        )?;
    }
    tensor_of(y, x.device(), (rows, n))
}

/// Two layers of a foreign model (`ModelState`), each `linear_bias_gelu` on the tensors'
/// storage, after candle's GELU of the input; `early` launches both layers early.
#[cuda_graph(warmup = 2, check_determinism = true)]
fn early_layers(
    dev: &Device,
    x: &Tensor,
    #[state] layers: &ModelState<(Linear, Linear)>,
    #[constant] early: bool,
) -> candle::Result<Tensor> {
    let rt = runtime_of(dev)?;
    let (first, second) = layers.model();
    let rows = x.dim(0)?;
    // Both outputs first, so that each layer's kernel follows a kernel.
    let alloc = |layer: &Linear| -> candle::Result<CudaSlice<f32>> {
        let n = layer.weight().dim(0)?;
        Ok(rt
            .stream()
            .alloc_zeros::<f32>(rows * n)
            .map_err(GraphError::from)?)
    };
    let (y1, y2) = (alloc(first)?, alloc(second)?);
    let h = linear_gelu(&rt, early, &x.gelu()?, first, y1)?;
    linear_gelu(&rt, early, &h, second, y2)
}

/// `h` as this step's key and value, written into the cache at `pos`, attending over it.
#[cuda_graph(warmup = 2, check_determinism = true)]
fn attend(
    dev: &Device,
    h: &Tensor,
    pos: &Tensor,
    #[state] cache: &mut StaticKvCache,
) -> candle::Result<Tensor> {
    let _ = dev;
    let d = h.dim(1)?;
    let at = cache.at(pos, 1)?;
    let kv = h.reshape((1, 1, 1, d))?;
    let (ck, cv) = cache.write(0, &at, &kv, &kv)?;
    let att = (kv.matmul(&ck.t()?)? * (1.0 / (d as f64).sqrt()))?.broadcast_add(at.mask())?;
    candle_nn::ops::softmax_last_dim(&att)?.matmul(&cv)
}

/// A running sum of the step's outputs, `(1, 1, 1, d)`: written state of the user's own type.
#[derive(DeviceState)]
struct Stats {
    sum: Tensor,
}

/// A candle body that calls two `#[cuda_graph]` functions: [`early_layers`] (a foreign model,
/// early launches) and [`attend`] (a static cache), with a derived bias between them and a
/// derived running sum after.
#[allow(clippy::too_many_arguments)] // the step's inputs and each state kind, one parameter each
#[cuda_graph(warmup = 2, check_determinism = true)]
fn nested_step(
    dev: &Device,
    x: &Tensor,
    pos: &Tensor,
    #[state] layers: &ModelState<(Linear, Linear)>,
    #[state] bias: &Bias,
    #[state] cache: &mut StaticKvCache,
    #[state] stats: &mut Stats,
    #[constant] early: bool,
) -> candle::Result<Tensor> {
    let h = early_layers(dev, x, layers, early)?.broadcast_add(&bias.b)?;
    let out = attend(dev, &h, pos, cache)?;
    let sum = stats.sum.add(&out)?;
    stats.sum.slice_set(&sum, 0, 0)?;
    Ok(out)
}

/// Pairs: early × candle, early × modelstate, early × kvcache, early × nested, early × debugchecks, candle × nested, modelstate × nested, nested × kvcache, debugchecks × nested, devstate-ro × nested, devstate-rw × nested, devstate-ro × modelstate, devstate-rw × modelstate, modelstate × kvcache, devstate-rw × kvcache
///
/// Early launches from a candle body: two layers of a `ModelState` model launched early
/// after a candle kernel, captured with and without early launch (programmatic edges only
/// in the first); and a candle body that calls that function and another `#[cuda_graph]`
/// function writing a `StaticKvCache`, with derived read-only and written state around them.
/// All captures checked for determinism (asserted to have run). Replays on fresh inputs at
/// positions 0 to 4 equal the functions called eagerly on twins of the cache and the sum,
/// early and in-order graphs bitwise alike; state compared after each replay.
#[gpu_test]
fn candle_bodies_call_graph_functions_that_launch_early(_rt: Runtime) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng = fresh_rng("candle_bodies_call_graph_functions_that_launch_early");
    let (d, max_len) = (64, 8);
    let varmap = candle_nn::VarMap::new();
    let layers = (
        linear(&varmap, &dev, "first", d, d)?,
        linear(&varmap, &dev, "second", d, d)?,
    );
    let layers = ModelState::from_varmap(layers, &varmap);
    let bias = Bias {
        b: Tensor::from_vec(random_vec(&mut rng, d), d, &dev).map_err(c)?,
    };
    let x0 = Tensor::from_vec(random_vec(&mut rng, 4 * d), (4, d), &dev).map_err(c)?;
    let mut early = EarlyLayersGraph::capture(&rt, &x0, &layers, true)?;
    let mut in_order = EarlyLayersGraph::capture(&rt, &x0, &layers, false)?;
    assert!(
        early.info().early_edges >= 1,
        "no programmatic edge: {early}"
    );
    assert_eq!(in_order.info().early_edges, 0, "{in_order}");
    for graph in [&early, &in_order] {
        assert!(
            graph.info().checks_time > Duration::ZERO,
            "check_determinism = true did not run: {graph}"
        );
    }
    for replay in 0..4 {
        let x = Tensor::from_vec(random_vec(&mut rng, 4 * d), (4, d), &dev).map_err(c)?;
        let eager = host(&early_layers(&dev, &x, &layers, true).map_err(c)?)?;
        same(
            &eager,
            &host(early.replay(&x)?.result)?,
            format!("early layers, replay {replay}"),
        )?;
        same(
            &eager,
            &host(in_order.replay(&x)?.result)?,
            format!("in-order layers, replay {replay}"),
        )?;
    }

    let new_cache = || StaticKvCache::new(1, (1, 1, max_len, d), DType::F32, &dev).map_err(c);
    let new_stats = || -> Result<Stats, GraphError> {
        Ok(Stats {
            sum: Tensor::zeros((1, 1, 1, d), DType::F32, &dev).map_err(c)?,
        })
    };
    let (mut eager_cache, mut eager_stats) = (new_cache()?, new_stats()?);
    let mut nested = NestedStepGraph::capture(
        &rt,
        &row(&mut rng, d, &dev)?,
        &scalar_u32(0, &dev)?,
        &layers,
        &bias,
        new_cache()?,
        new_stats()?,
        true,
    )?;
    assert!(
        nested.info().early_edges >= 1,
        "the called function's early launches left no programmatic edge: {nested}"
    );
    assert!(
        nested.info().checks_time > Duration::ZERO,
        "check_determinism = true did not run: {nested}"
    );
    for pos in 0..5u32 {
        let (x, p) = (row(&mut rng, d, &dev)?, scalar_u32(pos, &dev)?);
        let ours = host(nested.replay(&x, &p)?.result)?;
        let eager = nested_step(
            &dev,
            &x,
            &p,
            &layers,
            &bias,
            &mut eager_cache,
            &mut eager_stats,
            true,
        );
        same(
            &host(&eager.map_err(c)?)?,
            &ours,
            format!("nested step at {pos}: result"),
        )?;
        let state = nested.state_mut();
        let keys = |cache: &StaticKvCache| host(cache.keys(0).map_err(c)?);
        same(
            &keys(&eager_cache)?,
            &keys(state.cache)?,
            format!("nested step at {pos}: cached keys"),
        )?;
        same(
            &host(&eager_stats.sum)?,
            &host(&state.stats.sum)?,
            format!("nested step at {pos}: running sum"),
        )?;
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
