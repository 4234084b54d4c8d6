//! # 02 — launch overhead: a chain of tiny kernels
//!
//! The benchmark of the foundation: a chain of N tiny kernels (256 floats each, N = 10, 100,
//! 1000, 10000), measured four ways in one run:
//!
//! * eager: the annotated function called directly, one cudarc launch per kernel;
//! * ours: the `#[cuda_graph]` replay (input copy + graph launch) and `launch` (no copy);
//! * raw: the same kernels captured by hand with cudarc (`begin_capture` … `end_capture`),
//!   replayed with the same input copy;
//! * PyTorch: `scripts/torch_chain.py` (eager `add_`, `torch.cuda.graph` replay), when
//!   `python3` with torch is on the machine.
//!
//! Figures: wall µs per replay (back-to-back replays, then one sync), µs per node, host µs
//! spent inside one replay call, GPU µs per node (CUDA events), and capture + instantiate
//! time. Each timing is the median of 7 measurements (captures: of 3).
//!
//! Run: `cargo run --release --example 02-chain` (add `-- 10 100` to choose N).

use std::process::Command;
use std::time::{Duration, Instant};

use cuda_graphs::bench::{gpu_us, median, wall_us, REPEATS};
use cuda_graphs::kernels::ELEMENTWISE;
use cuda_graphs::testing::runtime_or_skip;
use graph_runtime::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use graph_runtime::cudarc::driver::{
    CudaGraph, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use graph_runtime::{cuda_graph, GraphError, Runtime};

const ELEMS: usize = 256;

/// `y = x + 1`, then `kernels - 1` times `y += 1`.
#[cuda_graph(warmup = 2)]
fn chain(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] kernels: usize,
) -> Result<(), GraphError> {
    launch_chain(rt.stream(), rt, x, y, kernels)
}

fn launch_chain(
    s: &CudaStream,
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    kernels: usize,
) -> Result<(), GraphError> {
    let first = rt.function(ELEMENTWISE, "add_scalar")?;
    let inc = rt.function(ELEMENTWISE, "add_one_inplace")?;
    let n = x.len() as i32;
    let cfg = LaunchConfig::for_num_elems(n as u32);
    // SAFETY: each kernel touches `n` floats of buffers holding `n`.
    unsafe {
        s.launch_builder(&first)
            .arg(x)
            .arg(&mut *y)
            .arg(&1.0f32)
            .arg(&n)
            .launch(cfg)?;
        for _ in 1..kernels {
            s.launch_builder(&inc).arg(&mut *y).arg(&n).launch(cfg)?;
        }
    }
    Ok(())
}

/// Host time spent inside one call of `a` and of `b` (µs, medians): bursts of 16 calls that
/// the GPU queue absorbs, timed without the sync that follows; `a` and `b` alternate so that
/// both see the same machine state. 51 rounds.
fn host_per_call_pair(
    s: &CudaStream,
    mut a: impl FnMut() -> Result<(), GraphError>,
    mut b: impl FnMut() -> Result<(), GraphError>,
) -> Result<(f64, f64), GraphError> {
    const BURST: usize = 16;
    const ROUNDS: usize = 51;
    let burst = |f: &mut dyn FnMut() -> Result<(), GraphError>| -> Result<f64, GraphError> {
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..BURST {
            f()?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / BURST as f64;
        s.synchronize()?;
        Ok(us)
    };
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ta.push(burst(&mut a)?);
        tb.push(burst(&mut b)?);
    }
    Ok((median(ta), median(tb)))
}

/// The same chain captured by hand with cudarc, as a user would without this library.
fn raw_capture(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    kernels: usize,
) -> Result<(CudaGraph, Duration), GraphError> {
    let s = rt.stream();
    launch_chain(s, rt, x, y, kernels)?; // warm: compile, load
    s.synchronize()?;
    let t = Instant::now();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    launch_chain(s, rt, x, y, kernels)?;
    let graph = s
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)?
        .expect("the chain records kernels");
    graph.upload()?;
    Ok((graph, t.elapsed()))
}

struct Row {
    n: usize,
    eager_us: f64,
    ours_us: f64,
    ours_launch_us: f64,
    raw_us: f64,
    raw_launch_us: f64,
    ours_host_us: f64,
    raw_host_us: f64,
    ours_launch_host_us: f64,
    raw_launch_host_us: f64,
    ours_gpu_us: f64,
    raw_gpu_us: f64,
    ours_capture_ms: f64,
    ours_capture_total_ms: f64,
    raw_capture_ms: f64,
}

fn measure(rt: &Runtime, n: usize) -> Result<Row, GraphError> {
    let s = rt.stream().clone();
    let iters = (200_000 / n).clamp(3, 2_000);
    let host_x: Vec<f32> = (0..ELEMS).map(|i| i as f32).collect();
    let src = s.clone_htod(&host_x)?;
    let want: Vec<f32> = host_x.iter().map(|v| v + n as f32).collect();

    // Eager.
    let mut y = s.alloc_zeros::<f32>(ELEMS)?;
    chain(rt, &src, &mut y, n)?;
    assert_eq!(s.clone_dtoh(&y)?, want, "eager chain");
    let eager_us = wall_us(&s, iters.div_ceil(4).max(2), || chain(rt, &src, &mut y, n))?;

    // Ours: capture three times, keep the last graph, report median times.
    let (mut totals, mut captures) = (Vec::new(), Vec::new());
    let mut graph = None;
    for _ in 0..3 {
        drop(graph.take()); // free the previous graph before the next capture
        let t = Instant::now();
        let g = ChainGraph::capture(rt, &src, ELEMS, n)?;
        totals.push(t.elapsed().as_secs_f64() * 1e3);
        let info = g.info();
        captures.push((info.capture_time + info.instantiate_time).as_secs_f64() * 1e3);
        graph = Some(g);
    }
    let mut graph = graph.expect("captured three times");
    let (ours_capture_total_ms, ours_capture_ms) = (median(totals), median(captures));
    let info = graph.info().clone();
    assert_eq!(info.nodes(), n, "one node per kernel");
    assert_eq!(s.clone_dtoh(graph.replay(&src)?.y)?, want, "graph replay");
    let ours_us = wall_us(&s, iters, || graph.replay(&src).map(|_| ()))?;
    let ours_launch_us = wall_us(&s, iters, || graph.launch().map(|_| ()))?;
    let ours_gpu_us = gpu_us(&s, iters, || graph.replay(&src).map(|_| ()))?;

    // Raw cudarc, same kernels, same stream, same input copy.
    let mut xs = s.alloc_zeros::<f32>(ELEMS)?;
    let mut ys = s.alloc_zeros::<f32>(ELEMS)?;
    let mut raw_times = Vec::new();
    let mut raw = None;
    for _ in 0..3 {
        drop(raw.take());
        let (g, t) = raw_capture(rt, &xs, &mut ys, n)?;
        raw_times.push(t.as_secs_f64() * 1e3);
        raw = Some(g);
    }
    let raw = raw.expect("captured three times");
    let raw_capture_ms = median(raw_times);
    let raw_replay = |xs: &mut CudaSlice<f32>| -> Result<(), GraphError> {
        s.memcpy_dtod(&src, xs)?;
        raw.launch()?;
        Ok(())
    };
    raw_replay(&mut xs)?;
    assert_eq!(s.clone_dtoh(&ys)?, want, "raw replay");
    let raw_us = wall_us(&s, iters, || raw_replay(&mut xs))?;
    let raw_gpu_us = gpu_us(&s, iters, || raw_replay(&mut xs))?;
    let raw_launch_us = wall_us(&s, iters, || Ok(raw.launch()?))?;

    let (ours_host_us, raw_host_us) = host_per_call_pair(
        &s,
        || graph.replay(&src).map(|_| ()),
        || raw_replay(&mut xs),
    )?;
    let (ours_launch_host_us, raw_launch_host_us) =
        host_per_call_pair(&s, || graph.launch().map(|_| ()), || Ok(raw.launch()?))?;

    Ok(Row {
        n,
        eager_us,
        ours_us,
        ours_launch_us,
        raw_us,
        raw_launch_us,
        ours_host_us,
        raw_host_us,
        ours_launch_host_us,
        raw_launch_host_us,
        ours_gpu_us,
        raw_gpu_us,
        ours_capture_ms,
        ours_capture_total_ms,
        raw_capture_ms,
    })
}

/// PyTorch figures for the same chain, if `python3` with torch is here.
struct TorchRow {
    eager_us_per_op: f64,
    graph_us_per_replay: f64,
    replay_host_us: f64,
    capture_ms: f64,
}

fn torch_rows(ns: &[usize]) -> Result<Vec<(usize, TorchRow)>, String> {
    let script = "scripts/torch_chain.py";
    if !std::path::Path::new(script).exists() {
        return Err(format!("{script} not found (run from the repository root)"));
    }
    let out = Command::new("python3")
        .arg(script)
        .args(ns.iter().map(ToString::to_string))
        .output()
        .map_err(|e| format!("python3 not runnable: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("failed").to_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("chain ")) {
        // chain <n> <eager_us_per_op> <graph_us_per_replay> <replay_host_us> <capture_ms>
        let f: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        if f.len() == 5 {
            rows.push((
                f[0] as usize,
                TorchRow {
                    eager_us_per_op: f[1],
                    graph_us_per_replay: f[2],
                    replay_host_us: f[3],
                    capture_ms: f[4],
                },
            ));
        }
    }
    Ok(rows)
}

fn main() -> Result<(), GraphError> {
    let Some(rt) = runtime_or_skip("02-chain") else {
        return Ok(());
    };
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ns = if args.is_empty() {
        vec![10, 100, 1000, 10_000]
    } else {
        args
    };
    let device = rt.context().name().unwrap_or_default();
    println!("chain of N kernels of {ELEMS} floats on {device}; median of {REPEATS}\n");

    // Pay the driver's one-time graph setup before anything is timed.
    {
        let src = rt.stream().alloc_zeros::<f32>(ELEMS)?;
        let _warm = ChainGraph::capture(&rt, &src, ELEMS, 2)?;
        let mut ys = rt.stream().alloc_zeros::<f32>(ELEMS)?;
        let _raw = raw_capture(&rt, &src, &mut ys, 2)?;
    }
    let rows = ns
        .iter()
        .map(|&n| measure(&rt, n))
        .collect::<Result<Vec<_>, _>>()?;
    let torch = torch_rows(&ns);

    println!("wall time per replay (µs) and per kernel/node (µs)");
    println!("| N | eager µs/kernel | ours replay µs | ours µs/node | raw cudarc replay µs | raw µs/node | ours/raw | ours launch-only µs | raw launch-only µs | speedup vs eager |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let n = r.n as f64;
        println!(
            "| {} | {:.2} | {:.1} | {:.3} | {:.1} | {:.3} | {:.3} | {:.1} | {:.1} | {:.1}× |",
            r.n,
            r.eager_us / n,
            r.ours_us,
            r.ours_us / n,
            r.raw_us,
            r.raw_us / n,
            r.ours_us / r.raw_us,
            r.ours_launch_us,
            r.raw_launch_us,
            r.eager_us / r.ours_us
        );
    }
    println!("\nhost time inside one call (µs; replay = input copy + launch), GPU time per node (µs, CUDA events), capture + instantiate (ms)");
    println!("| N | ours replay host µs | raw replay host µs | extra µs | ours launch host µs | raw launch host µs | ours GPU µs/node | raw GPU µs/node | ours capture+inst ms | ours incl. warmup ms | raw capture+inst ms |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let n = r.n as f64;
        println!(
            "| {} | {:.2} | {:.2} | {:+.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} |",
            r.n,
            r.ours_host_us,
            r.raw_host_us,
            r.ours_host_us - r.raw_host_us,
            r.ours_launch_host_us,
            r.raw_launch_host_us,
            r.ours_gpu_us / n,
            r.raw_gpu_us / n,
            r.ours_capture_ms,
            r.ours_capture_total_ms,
            r.raw_capture_ms
        );
    }
    match torch {
        Ok(t) if !t.is_empty() => {
            println!("\nPyTorch, same chain (x + 1 then add_(1)), same run");
            println!("| N | torch eager µs/op | torch graph µs/node | ours µs/node | torch replay host µs | ours host µs | torch capture ms |");
            println!("|---:|---:|---:|---:|---:|---:|---:|");
            for (n, tr) in &t {
                if let Some(r) = rows.iter().find(|r| r.n == *n) {
                    println!(
                        "| {} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} |",
                        n,
                        tr.eager_us_per_op,
                        tr.graph_us_per_replay / *n as f64,
                        r.ours_us / *n as f64,
                        tr.replay_host_us,
                        r.ours_host_us,
                        tr.capture_ms
                    );
                }
            }
        }
        Ok(_) => println!("\nPyTorch: not run (the script printed no rows)"),
        Err(why) => println!("\nPyTorch: not run ({why})"),
    }
    Ok(())
}
