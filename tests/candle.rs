//! candle code as graphs (feature `candle`): an MLP and a decoder step written with candle-nn
//! blocks, captured with `#[cuda_graph]` and compared with candle eager on fresh random
//! inputs, over several replays with the inputs changed in between; and what cannot work is
//! refused with its typed error, leaving the runtime usable.

#[path = "../examples/common/candle_models.rs"]
mod candle_models;

use candle_models::{greedy, Decoder, DecoderConfig, KvCache, Mlp};
use graph_runtime::candle::candle_core::{self as candle, DType, Device, Tensor};
use graph_runtime::{cuda_graph, GraphError, Runtime, Tolerance};
use workloads::check::first_mismatch;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

#[cuda_graph(warmup = 2, verify = "never")]
fn mlp_forward(dev: &Device, x: &Tensor, #[state] mlp: &Mlp) -> candle::Result<Tensor> {
    let _ = dev;
    mlp.forward(x)
}

#[cuda_graph(warmup = 2, verify = "never")]
fn decode(
    dev: &Device,
    token: &Tensor,
    pos: &Tensor,
    #[state] model: &Decoder,
    #[state] cache: &mut KvCache,
) -> candle::Result<Tensor> {
    let _ = dev;
    model.step(token, pos, cache)
}

/// A body that grows a cache the candle-transformers way: the tensor made before the capture
/// is replaced (and so freed) inside it.
#[cuda_graph(warmup = 1, verify = "never")]
fn grow_cache(
    dev: &Device,
    x: &Tensor,
    #[state] cache: &mut [Tensor; 1],
) -> candle::Result<Tensor> {
    let _ = dev;
    let grown = Tensor::cat(&[&cache[0], x], 0)?;
    cache[0] = grown;
    cache[0].sum_keepdim(0)
}

/// A model that hides its cache from the graph (`skip`): the graph cannot see that the body
/// replaces it (with a tensor of the same shape), so the capture itself meets the free of a
/// tensor made before it.
#[derive(graph_runtime::DeviceState)]
struct HiddenCache {
    #[device_state(skip)]
    cache: std::sync::Mutex<Tensor>,
}

#[cuda_graph(warmup = 1, verify = "never")]
fn grow_hidden_cache(dev: &Device, x: &Tensor, #[state] m: &HiddenCache) -> candle::Result<Tensor> {
    let _ = dev;
    let mut cache = m.cache.lock().unwrap_or_else(|p| p.into_inner());
    let updated = cache.broadcast_add(x)?;
    *cache = updated;
    cache.sum_keepdim(0)
}

/// candle's device on CUDA 0 and a runtime on its stream.
fn candle_runtime() -> Result<(Device, Runtime), GraphError> {
    let dev = Device::new_cuda(0).map_err(|e| GraphError::User(Box::new(e)))?;
    let rt = Runtime::from_candle(&dev)?;
    Ok((dev, rt))
}

fn c(e: candle::Error) -> GraphError {
    GraphError::User(Box::new(e))
}

fn host(t: &Tensor) -> Result<Vec<f32>, GraphError> {
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(c)
}

#[gpu_test]
fn mlp_graph_equals_candle_eager(_rt: Runtime) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng = fresh_rng("mlp_graph_equals_candle_eager");
    let (layers, dim) = (6, 256);
    let mlp = Mlp::new(&dev, layers, dim).map_err(c)?;
    let x0 = Tensor::from_vec(random_vec(&mut rng, dim), (1, dim), &dev).map_err(c)?;
    let mut graph = MlpForwardGraph::capture(&rt, &x0, &mlp)?;
    assert!(graph.info().kinds.kernels >= layers, "{graph}");
    for replay in 0..5 {
        // A fresh input every replay; every other one from the host.
        let data = random_vec(&mut rng, dim);
        let x = Tensor::from_vec(data, (1, dim), &dev).map_err(c)?;
        let eager = host(&mlp.forward(&x).map_err(c)?)?;
        let out = if replay % 2 == 0 {
            graph.replay(&x)?
        } else {
            let on_host = x.to_device(&Device::Cpu).map_err(c)?;
            graph.replay(&on_host)?
        };
        let ours = host(out.result)?;
        assert_eq!(ours.len(), dim);
        let diff = first_mismatch(&eager, &ours);
        assert!(
            diff.is_none(),
            "replay {replay}: graph differs from candle eager: {diff:?}"
        );
    }
    // The built-in verification compares with an eager run of the same function.
    let x = Tensor::from_vec(random_vec(&mut rng, dim), (1, dim), &dev).map_err(c)?;
    graph.verify(&x, Tolerance::BITWISE)?.into_result()?;
    Ok(())
}

#[gpu_test]
fn decoder_graph_serves_every_position(_rt: Runtime) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let mut rng = fresh_rng("decoder_graph_serves_every_position");
    let cfg = DecoderConfig {
        layers: 2,
        max_len: 32,
        ..DecoderConfig::SMALL
    };
    let model = Decoder::new(&dev, cfg).map_err(c)?;
    let eager_cache = KvCache::new(&dev, &cfg).map_err(c)?;
    let graph_cache = KvCache::new(&dev, &cfg).map_err(c)?;
    let u32_tensor = |v: u32, shape: &[usize]| Tensor::from_vec(vec![v], shape, &dev).map_err(c);
    let mut graph = DecodeGraph::capture(
        &rt,
        &u32_tensor(0, &[1, 1])?,
        &u32_tensor(0, &[1])?,
        &model,
        graph_cache,
    )?;
    // 12 positions, each with a random token: the graph's logits equal eager's at each.
    let mut tokens = Vec::new();
    for pos in 0..12u32 {
        let token = rand::Rng::random_range(&mut rng, 0..cfg.vocab as u32);
        tokens.push(token);
        let (t, p) = (u32_tensor(token, &[1, 1])?, u32_tensor(pos, &[1])?);
        let eager = host(&model.step(&t, &p, &eager_cache).map_err(c)?)?;
        let ours = host(graph.replay(&t, &p)?.result)?;
        let diff = first_mismatch(&eager, &ours);
        assert!(
            diff.is_none(),
            "position {pos}: graph logits differ from candle eager: {diff:?}"
        );
        let next = greedy(graph.outputs().result).map_err(c)?;
        assert_eq!(next.dims(), &[1, 1]);
    }
    // The caches hold the same keys after 12 steps.
    let a = host(&eager_cache.k[1])?;
    let b = host(&graph.state_mut().cache.k[1])?;
    assert_eq!(first_mismatch(&a, &b), None, "the caches differ");
    Ok(())
}

#[gpu_test]
fn replacing_a_pre_capture_tensor_is_a_typed_error(_rt: Runtime) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let x = Tensor::ones((1, 8), DType::F32, &dev).map_err(c)?;
    let mut cache = [Tensor::zeros((4, 8), DType::F32, &dev).map_err(c)?];
    let err = GrowCacheGraph::capture(&rt, &x, &mut cache).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::FreedInCapture { .. } | GraphError::StateMoved { .. }
        ),
        "{err:?}"
    );
    eprintln!("refused: {err}");
    // The runtime still captures and replays.
    let mlp = Mlp::new(&dev, 2, 8).map_err(c)?;
    let mut graph = MlpForwardGraph::capture(&rt, &x, &mlp)?;
    let eager = host(&mlp.forward(&x).map_err(c)?)?;
    assert_eq!(host(graph.replay(&x)?.result)?, eager);
    Ok(())
}

#[gpu_test]
fn untracked_tensor_freed_in_capture_is_a_typed_error(_rt: Runtime) -> Result<(), GraphError> {
    let (dev, rt) = candle_runtime()?;
    let x = Tensor::ones((1, 8), DType::F32, &dev).map_err(c)?;
    let hidden = HiddenCache {
        cache: std::sync::Mutex::new(Tensor::zeros((4, 8), DType::F32, &dev).map_err(c)?),
    };
    let err = GrowHiddenCacheGraph::capture(&rt, &x, &hidden).unwrap_err();
    eprintln!("refused: {err}");
    assert!(matches!(err, GraphError::FreedInCapture { .. }), "{err:?}");
    // The hidden cache now holds a tensor allocated inside the failed capture: its address was
    // never the program's, so it is not freed (a leak of one test tensor). A body whose shapes
    // change between runs is refused before that, as a host copy recorded into the graph.
    std::mem::forget(hidden);
    // Errors cudarc recorded meanwhile were cleared: the runtime still works.
    let mlp = Mlp::new(&dev, 2, 8).map_err(c)?;
    let mut graph = MlpForwardGraph::capture(&rt, &x, &mlp)?;
    let eager = host(&mlp.forward(&x).map_err(c)?)?;
    assert_eq!(host(graph.replay(&x)?.result)?, eager);
    Ok(())
}

#[gpu_test]
fn wrong_input_shape_and_plain_runtime_are_typed_errors(rt: Runtime) -> Result<(), GraphError> {
    let (dev, crt) = candle_runtime()?;
    let mlp = Mlp::new(&dev, 2, 16).map_err(c)?;
    let x = Tensor::zeros((1, 16), DType::F32, &dev).map_err(c)?;
    let mut graph = MlpForwardGraph::capture(&crt, &x, &mlp)?;
    let wide = Tensor::zeros((1, 17), DType::F32, &dev).map_err(c)?;
    let err = graph.replay(&wide).unwrap_err();
    assert!(
        matches!(err, GraphError::InputShape { input: "x", .. }),
        "{err:?}"
    );
    let half = Tensor::zeros((1, 16), DType::F16, &dev).map_err(c)?;
    assert!(matches!(
        graph.replay(&half).unwrap_err(),
        GraphError::InputShape { .. }
    ));
    graph.replay(&x)?;
    // A runtime that was not made from candle's device has no `Device` to give the body.
    let err = MlpForwardGraph::capture(&rt, &x, &mlp).unwrap_err();
    assert!(matches!(err, GraphError::NoCandleDevice), "{err:?}");
    Ok(())
}

#[gpu_test]
fn event_tracking_device_is_refused_with_the_fix(_rt: Runtime) -> Result<(), GraphError> {
    let dev = Device::new_cuda_with_stream(0).map_err(c)?;
    let rt = Runtime::from_candle(&dev)?;
    let mlp = Mlp::new(&dev, 2, 16).map_err(c)?;
    let x = Tensor::zeros((1, 16), DType::F32, &dev).map_err(c)?;
    let err = MlpForwardGraph::capture(&rt, &x, &mlp).unwrap_err();
    assert!(matches!(err, GraphError::EventTracking { .. }), "{err:?}");
    assert!(err.to_string().contains("disable_event_tracking"), "{err}");
    Ok(())
}

/// Four threads, each with its own `Device::new_cuda(0)` and runtime, capture candle MLPs at
/// the same moment: the runtime's capture lock for the device makes them take turns (before
/// it, two such threads invalidated each other's capture, CUDA error 901). Once all have
/// captured, each replays its graph on fresh inputs against candle eager, all threads at once.
#[gpu_test]
fn four_threads_capture_candle_graphs_at_once(_rt: Runtime) -> Result<(), GraphError> {
    const THREADS: usize = 4;
    let start = std::sync::Barrier::new(THREADS);
    let captured = std::sync::Barrier::new(THREADS);
    let worker = |thread: usize| -> Result<String, GraphError> {
        // Everything a thread needs exists before any thread captures; every barrier is
        // reached also after an error, so that no thread waits for one that failed.
        let prepared = (|| -> Result<_, GraphError> {
            let (dev, rt) = candle_runtime()?;
            let mut rng = fresh_rng(&format!("four_threads_capture_candle_{thread}"));
            let (layers, dim) = (3 + thread, 128 + 32 * thread);
            let mlp = Mlp::new(&dev, layers, dim).map_err(c)?;
            let x0 = Tensor::from_vec(random_vec(&mut rng, dim), (1, dim), &dev).map_err(c)?;
            dev.synchronize().map_err(c)?;
            Ok((dev, rt, rng, dim, mlp, x0))
        })();
        start.wait();
        let (dev, rt, mut rng, dim, mlp, x0) = match prepared {
            Ok(p) => p,
            Err(e) => {
                captured.wait();
                return Err(e);
            }
        };
        let graph = MlpForwardGraph::capture(&rt, &x0, &mlp);
        captured.wait();
        let mut graph = graph?;
        for replay in 0..4 {
            let x = Tensor::from_vec(random_vec(&mut rng, dim), (1, dim), &dev).map_err(c)?;
            let eager = host(&mlp.forward(&x).map_err(c)?)?;
            let ours = host(graph.replay(&x)?.result)?;
            if let Some(diff) = first_mismatch(&eager, &ours) {
                return Err(GraphError::User(
                    format!("thread {thread}, replay {replay}: graph differs from candle eager: {diff:?}")
                        .into(),
                ));
            }
        }
        Ok(format!("thread {thread}: 4 replays equal to candle eager"))
    };
    let results: Vec<Result<String, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let worker = &worker;
                scope.spawn(move || worker(t).map_err(|e| e.to_string()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".to_owned())))
            .collect()
    });
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    for r in results.iter().flatten() {
        eprintln!("four_threads_capture_candle_graphs_at_once: {r}");
    }
    assert!(failed.is_empty(), "threads failed: {failed:#?}");
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
