//! Four threads capturing graphs on one device at the same time, each with its own runtime,
//! and four threads sharing one runtime: the runtime serialises the capture procedures of a
//! device itself (one capture lock per device for the whole process) and records captures on
//! a capture stream of its own, so every capture succeeds, other threads' replays, reads and
//! drops are never recorded into a capture, and every replay equals eager execution on fresh
//! random inputs. No lock in this file stands in for the runtime's.
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead.

use std::sync::Barrier;

use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};
use workloads::kernels::ELEMENTWISE;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

const THREADS: usize = 4;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// `y = tanh(w * x + b)` applied `depth` times, through a temporary (a graph allocation
/// node); the default capture mode (thread-local).
#[cuda_graph(warmup = 2)]
fn layers(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    #[state] b: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] depth: usize,
) -> Result<(), GraphError> {
    let n = x.len();
    let nn = n as i32;
    let s = rt.stream();
    let (mul, add, tanh) = (
        rt.function(ELEMENTWISE, "mul")?,
        rt.function(ELEMENTWISE, "add")?,
        rt.function(ELEMENTWISE, "tanh_inplace")?,
    );
    let mut tmp = s.alloc_zeros::<f32>(n)?;
    s.memcpy_dtod(x, y)?;
    for _ in 0..depth {
        // SAFETY: every kernel reads and writes exactly `n` floats of buffers that hold `n`.
        unsafe {
            s.launch_builder(&mul)
                .arg(&*y)
                .arg(w)
                .arg(&mut tmp)
                .arg(&nn)
                .launch(grid(n))?;
            s.launch_builder(&add)
                .arg(&tmp)
                .arg(b)
                .arg(&mut *y)
                .arg(&nn)
                .launch(grid(n))?;
            s.launch_builder(&tanh)
                .arg(&mut *y)
                .arg(&nn)
                .launch(grid(n))?;
        }
    }
    Ok(())
}

/// `acc += x + k` and `y = acc`, through a temporary, captured in global mode: the mode in
/// which any other thread's synchronising call invalidates a capture (CUDA error 901).
#[cuda_graph(warmup = 2, mode = "global")]
fn accumulate(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] acc: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] k: f32,
) -> Result<(), GraphError> {
    let n = x.len();
    let nn = n as i32;
    let s = rt.stream();
    let add_scalar = rt.function(ELEMENTWISE, "add_scalar")?;
    let add = rt.function(ELEMENTWISE, "add")?;
    let mut shifted = s.alloc_zeros::<f32>(n)?;
    // SAFETY: every kernel reads and writes exactly `n` floats of buffers that hold `n`;
    // `add` reads element i of both inputs before writing element i of `y`.
    unsafe {
        s.launch_builder(&add_scalar)
            .arg(x)
            .arg(&mut shifted)
            .arg(&k)
            .arg(&nn)
            .launch(grid(n))?;
        s.launch_builder(&add)
            .arg(&*acc)
            .arg(&shifted)
            .arg(&mut *y)
            .arg(&nn)
            .launch(grid(n))?;
    }
    s.memcpy_dtod(&*y, acc)?;
    Ok(())
}

/// What one thread does: its own runtime on device 0, `rounds` rounds of capturing a
/// `layers` graph and (with `global`) an `accumulate` graph captured in global mode, each
/// replayed on fresh inputs and compared with eager calls of the same function, bitwise (the
/// same kernels in the same order). With `after_capture`, every thread waits there once it
/// has captured: global mode makes CUDA fail the synchronising calls of every other thread
/// while a capture records, by design, so global-mode graphs are captured while the other
/// threads only capture.
fn worker(
    thread: usize,
    start: &Barrier,
    after_capture: Option<&Barrier>,
    global: bool,
) -> Result<String, GraphError> {
    // Every barrier is reached also when a step before it failed, so that one thread's
    // error never leaves the others waiting.
    let prepared = (|| -> Result<_, GraphError> {
        let rt = Runtime::new(0)?;
        let s = rt.stream().clone();
        let mut rng = fresh_rng(&format!("four_threads_capture_thread_{thread}"));
        let n = 4099 + 64 * thread;
        let w = s.clone_htod(&random_vec(&mut rng, n))?;
        let b = s.clone_htod(&random_vec(&mut rng, n))?;
        let starts: Vec<Vec<f32>> = (0..3).map(|_| random_vec(&mut rng, n)).collect();
        let accs = starts
            .iter()
            .map(|v| s.clone_htod(v))
            .collect::<Result<Vec<_>, _>>()?;
        let eager_accs = starts
            .iter()
            .map(|v| s.clone_htod(v))
            .collect::<Result<Vec<_>, _>>()?;
        let x0s = (0..3)
            .map(|_| s.clone_htod(&random_vec(&mut rng, n)))
            .collect::<Result<Vec<_>, _>>()?;
        s.synchronize()?;
        Ok((rt, s, rng, n, w, b, x0s, accs, eager_accs))
    })();
    // Every thread is ready before any captures.
    start.wait();
    let (rt, s, mut rng, n, w, b, x0s, mut accs, eager_accs) = match prepared {
        Ok(p) => p,
        Err(e) => {
            if let Some(barrier) = after_capture {
                barrier.wait();
            }
            return Err(e);
        }
    };
    // While capturing, a thread makes no CUDA call of its own outside `capture` (its
    // buffers are ready), so that in global mode nothing but the captures themselves meets.
    let mut graphs = Vec::new();
    let mut captured = Ok(());
    for (round, (acc, acc_eager)) in accs.iter_mut().zip(eager_accs).enumerate() {
        let depth = 1 + (thread + round) % 4;
        let k = round as f32 + 0.5;
        let x0 = &x0s[round];
        let step = (|| -> Result<_, GraphError> {
            let layers = LayersGraph::capture(&rt, x0, &w, &b, n, depth)?;
            // The graph borrows `acc`; it is compared through `state_mut()`.
            let accumulate = if global {
                Some(AccumulateGraph::capture(&rt, x0, acc, n, k)?)
            } else {
                None
            };
            Ok((depth, layers, accumulate, acc_eager, k))
        })();
        match step {
            Ok(g) => graphs.push(g),
            Err(e) => {
                captured = Err(e);
                break;
            }
        }
    }
    if let Some(barrier) = after_capture {
        barrier.wait();
    }
    captured?;
    let mut replays = 0;
    for (round, (depth, layers, accumulate, acc_eager, k)) in graphs.iter_mut().enumerate() {
        for replay in 0..4 {
            let x = random_vec(&mut rng, n);
            let xd = s.clone_htod(&x)?;
            let ours = s.clone_dtoh(layers.replay(&x)?.y)?;
            let mut eager = s.alloc_zeros::<f32>(n)?;
            self::layers(&rt, &xd, &w, &b, &mut eager, *depth)?;
            assert_eq!(
                ours,
                s.clone_dtoh(&eager)?,
                "thread {thread}, round {round}, replay {replay}: `layers` differs from eager"
            );
            if let Some(accumulate) = accumulate.as_mut() {
                let ours = s.clone_dtoh(accumulate.replay(&xd)?.y)?;
                let mut eager = s.alloc_zeros::<f32>(n)?;
                self::accumulate(&rt, &xd, acc_eager, &mut eager, *k)?;
                assert_eq!(
                    ours,
                    s.clone_dtoh(&eager)?,
                    "thread {thread}, round {round}, replay {replay}: `accumulate` differs from eager"
                );
                replays += 1;
            }
            replays += 1;
        }
        if let Some(accumulate) = accumulate.as_mut() {
            assert_eq!(
                s.clone_dtoh(&accumulate.state_mut().acc)?,
                s.clone_dtoh(acc_eager)?,
                "thread {thread}, round {round}: the accumulator"
            );
        }
    }
    drop(graphs);
    drop(accs);
    Ok(format!(
        "thread {thread}: 6 graphs, {replays} replays equal to eager"
    ))
}

/// Runs `work(t)` for `t` in `0..THREADS` on that many threads at once: each thread's
/// result, its error or its panic as text.
fn on_threads<T: Send>(
    work: impl Fn(usize) -> Result<T, GraphError> + Sync,
) -> Vec<Result<T, String>> {
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = (0..THREADS)
            .map(|t| scope.spawn(move || work(t).map_err(|e| e.to_string())))
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(panic) => Err(panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".to_owned())),
            })
            .collect()
    })
}

/// Fails with every thread's error, if any thread failed.
fn assert_none_failed<T>(results: &[Result<T, String>]) {
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(t, r)| r.as_ref().err().map(|e| format!("thread {t}: {e}")))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {THREADS} threads failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Runs `worker` on four threads at once and fails with every thread's error.
fn four_threads(test: &str, global: bool) -> Result<(), GraphError> {
    let start = Barrier::new(THREADS);
    let after = Barrier::new(THREADS);
    let results = on_threads(|t| worker(t, &start, global.then_some(&after), global));
    for r in results.iter().flatten() {
        eprintln!("{test}: {r}");
    }
    assert_none_failed(&results);
    Ok(())
}

/// Four threads capture at once, half the graphs in global mode (each capture's warmup
/// synchronises and allocates while the others want to record: without the runtime's lock
/// this is CUDA error 901), then, once all have captured, replay and compare.
#[gpu_test]
fn four_threads_capture_at_once_on_one_device(_rt: Runtime) -> Result<(), GraphError> {
    four_threads("four_threads_capture_at_once_on_one_device", true)
}

/// Four threads capture (thread-local mode, the default), replay and run eagerly at once,
/// as a server with a model per thread does: while one thread records, the others replay,
/// copy and run eager work on their own streams.
#[gpu_test]
fn four_threads_capture_and_replay_at_once(_rt: Runtime) -> Result<(), GraphError> {
    four_threads("four_threads_capture_and_replay_at_once", false)
}

/// What one thread of a shared runtime does, as the README's first program would if four
/// threads ran it at once: `rounds` times, capture a `layers` graph of its own, replay it on
/// fresh inputs, read the outputs through `rt.stream()` and compare them with an eager call.
fn shared_worker(thread: usize, rt: &Runtime, rounds: usize) -> Result<usize, GraphError> {
    let mut rng = fresh_rng(&format!("one_runtime_shared_by_four_threads_{thread}"));
    let n = 2051 + 64 * thread;
    let w = rt.stream().clone_htod(&random_vec(&mut rng, n))?;
    let b = rt.stream().clone_htod(&random_vec(&mut rng, n))?;
    let mut replays = 0;
    for round in 0..rounds {
        let depth = 1 + (thread + round) % 4;
        let x0 = rt.stream().clone_htod(&random_vec(&mut rng, n))?;
        let mut graph = LayersGraph::capture(rt, &x0, &w, &b, n, depth)?;
        for replay in 0..3 {
            let x = random_vec(&mut rng, n);
            let ours = rt.stream().clone_dtoh(graph.replay(&x)?.y)?;
            let xd = rt.stream().clone_htod(&x)?;
            let mut eager = rt.stream().alloc_zeros::<f32>(n)?;
            layers(rt, &xd, &w, &b, &mut eager, depth)?;
            assert_eq!(
                ours,
                rt.stream().clone_dtoh(&eager)?,
                "thread {thread}, round {round}, replay {replay}: graph vs eager"
            );
            replays += 1;
        }
    }
    Ok(replays)
}

/// One `Runtime` shared by four threads, each capturing, replaying and reading at once:
/// captures are serialised and record on the runtime's capture stream, other threads' work is
/// never recorded into them, and every replay equals eager.
#[gpu_test]
fn one_runtime_shared_by_four_threads(rt: Runtime) -> Result<(), GraphError> {
    let rounds = 12;
    let results = on_threads(|t| shared_worker(t, &rt, rounds));
    assert_none_failed(&results);
    let replays: usize = results.iter().flatten().sum();
    assert_eq!(replays, THREADS * rounds * 3);
    // The runtime is still whole.
    rt.synchronize()?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
