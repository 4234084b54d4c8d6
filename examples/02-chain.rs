//! # 02 — launch overhead: a chain of tiny kernels
//!
//! The benchmark of the foundation: a chain of N tiny kernels (256 floats each, N = 10, 100,
//! 1000, 10000), measured four ways in one run:
//!
//! * eager: the annotated function called directly, one cudarc launch per kernel;
//! * ours: the `#[cuda_graph]` replay (the graph's input node pointed at the new input, then
//!   one launch) and `launch` (inputs as they are);
//! * ours, early launch: the same chain with every kernel launched early (programmatic
//!   dependent launch: each kernel is scheduled while the one before it finishes);
//! * raw: the same kernels captured by hand with cudarc (`begin_capture` … `end_capture`),
//!   replayed after a `memcpy_dtod` of the input, as a user would write it;
//! * PyTorch: `scripts/torch_chain.py` (eager `add_`, `torch.cuda.graph` replay), when
//!   `python3` with torch is on the machine.
//!
//! The first table compares like with like: on Hopper the L2 hashes addresses, so the same
//! chain of tiny kernels runs up to ~10% faster or slower depending only on where its buffer
//! sits (H200: 0.83–0.92 µs per node over 8 placements). So it measures `--placements` graphs
//! of ours, each with its own static buffers, and on each graph's own buffers the hand-written
//! capture with the same input copy (raw) and two floors captured by hand with no copy: plain
//! edges, and early launch (programmatic edges); median and range over the placements.
//! Placement moves real workloads far less (H200, `BENCH_PAD_BYTES` shifting every buffer:
//! MLP batch 1 and 64 within 1%, decode step within 0.2%), so the library leaves static
//! buffers where the allocator puts them; when benchmarking tiny kernels, compare on the same
//! buffers or over several placements.
//!
//! Figures: wall µs per replay (back-to-back replays, then one sync), µs per node, host µs
//! spent inside one replay call, GPU µs per node (CUDA events), and capture + instantiate
//! time. Each timing is the median of 7 measurements (captures: of 3), each measurement about
//! 20 ms of calls; the run takes well under 30 s on an H100, and says on stderr where the
//! time went.
//!
//! The capture-cost table splits a capture of ours (from its `GraphInfo`: capture, inspect,
//! instantiate, upload) and the same chain captured by hand (begin, launches, end;
//! `cuGraphInstantiateWithFlags` with AUTO_FREE_ON_LAUNCH, as ours; `cuGraphUpload`, as
//! ours), after the same two eager runs, interleaved (`--capture-rounds`, medians). It also
//! compares ours with a hand capture of N + 1 kernels: as many nodes as ours, whose graph
//! holds its input copy node besides the chain. On an H200 (four runs): at N = 100, 1000 and
//! 10,000 ours costs what raw does (0.98–1.01, 1.00–1.03 and 0.93–1.00×); at N = 10 it costs
//! 5–13 µs more (1.14–1.22×), of which the input copy node is 2–3 µs (against N + 1 kernels:
//! 1.04–1.13×) and the rest the bookkeeping around the capture (reading the node kinds,
//! the capture frame). The copy node pays for itself at the first replay: it saves about
//! 4 µs of host time on every replay against raw's input copy. (Every capture of ours used
//! to read the device's free memory after its upload, 8–60 µs of `cuMemGetInfo`, even when
//! it did not measure executable memory: that was the 7–36 µs it cost above raw at N ≤ 100.)
//!
//! `--capture-only` prints only that table, with hand captures that add, one at a time,
//! what ours does besides the chain, and the two recorded graphs instantiated again,
//! alternately. On an H200: the input copy node, the node walk, the two events and two
//! capture-info queries together cost what one more kernel node does; the instantiate flag,
//! work left on the stream and an allocation freed before the capture make no difference;
//! instantiating and uploading in one call (`CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`) saves
//! nothing; instantiating costs up to twice as much with cold CPU caches (8 MiB of host
//! memory touched just before: +16–19 µs at N = 10), so capture times of small graphs vary
//! with what the host did just before.
//!
//! Run: `cargo run --release --example 02-chain` (add `-- 10 100` to choose N, `--json` for
//! the report's JSON lines, `--no-torch` to leave PyTorch out, `--capture-only` for the
//! capture cost alone).
//!
//! It uses `graph-runtime` (and cudarc through it), `clap` and `serde_json`: the kernels,
//! timing and report records it needs are at the end of this file.

use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use graph_runtime::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use graph_runtime::cudarc::driver::DevicePtr;
use graph_runtime::cudarc::driver::{
    CudaGraph, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use graph_runtime::{cuda_graph, BoxError, EarlyLaunch, GraphError, Runtime, Tolerance};
use record::{read_output, Record, Side};

const ELEMS: usize = 256;
/// GPU time one measurement of replays aims at: `iters` replays of a chain of `n` kernels,
/// about 1 µs a node.
const BATCH_US: usize = 20_000;

/// Launch overhead: a chain of N tiny kernels, eager, as our graph, as a hand-written cudarc
/// capture, and in PyTorch.
#[derive(Parser)]
struct Args {
    /// Kernels per chain.
    #[arg(default_values_t = [10, 100, 1000, 10_000], value_parser = clap::value_parser!(u32).range(1..))]
    kernels: Vec<u32>,
    /// Print one JSON line per chain length after the tables (for the report).
    #[arg(long)]
    json: bool,
    /// Leave out PyTorch (`scripts/torch_chain.py`).
    #[arg(long)]
    no_torch: bool,
    /// Buffer placements of the like-for-like table: that many graphs of ours (each with its
    /// own static buffers), each raw capture on the same buffers as one of them.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    placements: u32,
    /// Captures of each kind per chain length in the capture-cost table (medians).
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u32).range(1..=101))]
    capture_rounds: u32,
    /// Only the capture-cost table, with the probe's variants (hand captures that add, one at a
    /// time, what ours does besides the chain; each recorded graph instantiated again).
    #[arg(long)]
    capture_only: bool,
}

/// Calls per measurement for a chain of `n` kernels: about [`BATCH_US`] of replays.
fn iters_for_chain(n: usize) -> usize {
    (BATCH_US / n).clamp(3, 2_000)
}

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

/// The same chain with every kernel launched early: each may be scheduled while the one
/// before it finishes, and waits for it (`griddepcontrol.wait`) before touching `y`. A capture
/// keeps that as programmatic edges.
#[cuda_graph(warmup = 2)]
fn chain_early(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] kernels: usize,
) -> Result<(), GraphError> {
    let first = rt.function(ELEMENTWISE, "add_scalar_early")?;
    let inc = rt.function(ELEMENTWISE, "add_one_inplace_early")?;
    let n = x.len() as i32;
    let cfg = LaunchConfig::for_num_elems(n as u32);
    // SAFETY: each kernel touches `n` floats of buffers holding `n`, and waits for the kernel
    // before it (`griddepcontrol.wait`) before reading or writing anything.
    unsafe {
        rt.launch_early(&first)
            .buf(x)
            .buf_mut(&mut *y)
            .arg(1.0f32)
            .arg(n)
            .launch(cfg)?;
        for _ in 1..kernels {
            rt.launch_early(&inc).buf_mut(&mut *y).arg(n).launch(cfg)?;
        }
    }
    Ok(())
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

/// Host time spent inside one call of `a` and of `b` (µs, medians of [`REPEATS`]): bursts
/// of `burst` calls that the GPU queue absorbs, timed without the sync that follows; `a` and
/// `b` alternate so that both see the same machine state.
fn host_per_call_pair(
    s: &CudaStream,
    burst: usize,
    mut a: impl FnMut() -> Result<(), GraphError>,
    mut b: impl FnMut() -> Result<(), GraphError>,
) -> Result<(f64, f64), GraphError> {
    let timed = |f: &mut dyn FnMut() -> Result<(), GraphError>| -> Result<f64, GraphError> {
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..burst {
            f()?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / burst as f64;
        s.synchronize()?;
        Ok(us)
    };
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        ta.push(timed(&mut a)?);
        tb.push(timed(&mut b)?);
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

/// The chain captured by hand on raw device addresses: `y = x + 1`, then `kernels - 1` times
/// `y += 1`, with ordinary launches or with early launches (programmatic edges). Capturing
/// it on the addresses of our graph's own buffers compares like with like.
fn hand_chain(rt: &Runtime, x: u64, y: u64, kernels: usize, early: bool) -> Result<(), GraphError> {
    let s = rt.stream();
    let (first, inc) = if early {
        ("add_scalar_early", "add_one_inplace_early")
    } else {
        ("add_scalar", "add_one_inplace")
    };
    let first = rt.function(ELEMENTWISE, first)?;
    let inc = rt.function(ELEMENTWISE, inc)?;
    let n = ELEMS as i32;
    let cfg = LaunchConfig::for_num_elems(n as u32);
    // SAFETY: `x` and `y` address live buffers of `ELEMS` floats (the caller keeps them alive
    // while the graph recorded here can run); each kernel touches `n = ELEMS` floats, and the
    // early-launch kernels wait for the kernel before them before touching memory.
    unsafe {
        if early {
            EarlyLaunch::new(s, &first)
                .arg(x)
                .arg(y)
                .arg(1.0f32)
                .arg(n)
                .launch(cfg)?;
            for _ in 1..kernels {
                EarlyLaunch::new(s, &inc).arg(y).arg(n).launch(cfg)?;
            }
        } else {
            s.launch_builder(&first)
                .arg(&x)
                .arg(&y)
                .arg(&1.0f32)
                .arg(&n)
                .launch(cfg)?;
            for _ in 1..kernels {
                s.launch_builder(&inc).arg(&y).arg(&n).launch(cfg)?;
            }
        }
    }
    Ok(())
}

/// [`hand_chain`] captured (after one eager run) into an instantiated, uploaded graph.
fn hand_capture(
    rt: &Runtime,
    x: u64,
    y: u64,
    kernels: usize,
    early: bool,
    copy_from: Option<&CudaSlice<f32>>,
) -> Result<CudaGraph, GraphError> {
    let s = rt.stream();
    hand_chain(rt, x, y, kernels, early)?;
    s.synchronize()?;
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    if let Some(src) = copy_from {
        // The input copy a replay of ours does, into the same input buffer.
        let (sp, _sync) = src.device_ptr(s);
        // SAFETY: `x` addresses a live buffer of `ELEMS` floats and `src` holds `ELEMS`
        // floats; the copy is recorded, not run.
        unsafe {
            graph_runtime::cudarc::driver::result::memcpy_dtod_async(
                x,
                sp,
                ELEMS * std::mem::size_of::<f32>(),
                s.cu_stream(),
            )
        }?;
    }
    hand_chain(rt, x, y, kernels, early)?;
    let graph = s
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)?
        .expect("the chain records kernels");
    graph.upload()?;
    Ok(graph)
}

/// Median, least and greatest of `v`.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (median(v.to_vec()), lo, hi)
}

/// Like for like, per placement: ours, raw on ours' buffers, the two floors, and the raw
/// capture on buffers of its own (µs per replay, wall).
#[derive(Default)]
struct Placed {
    ours: Vec<f64>,
    raw_same: Vec<f64>,
    floor_plain: Vec<f64>,
    floor_early: Vec<f64>,
    raw_own: Vec<f64>,
    ours_early: Vec<f64>,
}

/// Wall µs per replay of ours and of hand captures on the same buffers, over `placements`
/// graphs of ours (each with its own static buffers, so at its own addresses).
fn like_for_like(rt: &Runtime, n: usize, placements: usize) -> Result<Placed, GraphError> {
    let s = rt.stream().clone();
    let iters = iters_for_chain(n);
    let host_x: Vec<f32> = (0..ELEMS).map(|i| i as f32).collect();
    let src = s.clone_htod(&host_x)?;
    let want: Vec<f32> = host_x.iter().map(|v| v + n as f32).collect();
    // Every graph of ours stays alive until the end, so that each sits at its own address.
    let mut graphs = Vec::new();
    let mut earlies = Vec::new();
    let mut users = Vec::new();
    let mut out = Placed::default();
    for _ in 0..placements {
        let mut g = ChainGraph::capture(rt, &src, ELEMS, n)?;
        let y = {
            let y = g.replay(&src)?.y;
            let (p, _sync) = y.device_ptr(&s);
            p
        };
        // The graph's static input: the replay's copy writes it; ours reads it. A raw copy into
        // a buffer of the same placement: the first node's source.
        let mut xs = s.alloc_zeros::<f32>(ELEMS)?;
        let x = {
            let (p, _sync) = xs.device_ptr(&s);
            p
        };
        let raw_same = hand_capture(rt, x, y, n, false, Some(&src))?;
        let plain = hand_capture(rt, x, y, n, false, None)?;
        let early = hand_capture(rt, x, y, n, true, None)?;
        s.memcpy_dtod(&src, &mut xs)?;
        for (what, graph) in [("raw", &raw_same), ("plain", &plain), ("early", &early)] {
            let mut got = vec![0f32; ELEMS];
            // SAFETY: `y` addresses our graph's output buffer of `ELEMS` floats, alive (the
            // graph is); the stream is synchronized before the host copy reads it.
            unsafe {
                graph_runtime::cudarc::driver::result::memset_d8_async(
                    y,
                    0,
                    ELEMS * 4,
                    s.cu_stream(),
                )?;
                graph.launch()?;
                s.synchronize()?;
                graph_runtime::cudarc::driver::result::memcpy_dtoh_sync(&mut got, y)?;
            }
            assert_eq!(got, want, "hand capture ({what}) on our buffers");
        }
        s.synchronize()?;
        out.ours
            .push(wall_us(&s, iters, || g.replay(&src).map(|_| ()))?);
        out.raw_same
            .push(wall_us(&s, iters, || Ok(raw_same.launch()?))?);
        out.floor_plain
            .push(wall_us(&s, iters, || Ok(plain.launch()?))?);
        out.floor_early
            .push(wall_us(&s, iters, || Ok(early.launch()?))?);
        // The raw capture as a user writes it, on buffers of its own.
        let mut ux = s.alloc_zeros::<f32>(ELEMS)?;
        let mut uy = s.alloc_zeros::<f32>(ELEMS)?;
        let (raw, _t) = raw_capture(rt, &ux, &mut uy, n)?;
        out.raw_own.push(wall_us(&s, iters, || {
            s.memcpy_dtod(&src, &mut ux)?;
            Ok(raw.launch()?)
        })?);
        assert_eq!(s.clone_dtoh(&uy)?, want, "raw replay");
        let mut e = ChainEarlyGraph::capture(rt, &src, ELEMS, n)?;
        out.ours_early
            .push(wall_us(&s, iters, || e.replay(&src).map(|_| ()))?);
        assert_eq!(
            s.clone_dtoh(e.replay(&src)?.y)?,
            want,
            "early-launch replay"
        );
        users.push((ux, uy, raw));
        earlies.push(e);
        graphs.push((g, xs, raw_same, plain, early));
    }
    drop(users);
    drop(earlies);
    drop(graphs);
    Ok(out)
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
    /// The same chain launched early: replay µs, launch-only µs, GPU µs.
    early_us: f64,
    early_launch_us: f64,
    early_gpu_us: f64,
    early_edges: usize,
}

/// Seconds spent in each phase of one measurement, for the log on stderr.
#[derive(Default)]
struct Phases {
    eager: f64,
    capture: f64,
    replay: f64,
    host: f64,
}

fn measure(rt: &Runtime, n: usize, phases: &mut Phases) -> Result<Row, GraphError> {
    let s = rt.stream().clone();
    let iters = iters_for_chain(n);
    let host_x: Vec<f32> = (0..ELEMS).map(|i| i as f32).collect();
    let src = s.clone_htod(&host_x)?;
    let want: Vec<f32> = host_x.iter().map(|v| v + n as f32).collect();

    // Eager.
    let t = Instant::now();
    let mut y = s.alloc_zeros::<f32>(ELEMS)?;
    chain(rt, &src, &mut y, n)?;
    assert_eq!(s.clone_dtoh(&y)?, want, "eager chain");
    let eager_us = wall_us(&s, iters.div_ceil(4).max(2), || chain(rt, &src, &mut y, n))?;
    phases.eager += t.elapsed().as_secs_f64();

    // Ours: capture three times, keep the last graph, report median times.
    let t = Instant::now();
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
    assert_eq!(info.kinds.kernels, n, "one node per kernel");
    assert_eq!(info.kinds.input_copies, 1, "and the input's copy node");
    assert_eq!(s.clone_dtoh(graph.replay(&src)?.y)?, want, "graph replay");
    verified(graph.verify(&src, Tolerance::BITWISE)?)?;

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
    phases.capture += t.elapsed().as_secs_f64();

    let t = Instant::now();
    let ours_us = wall_us(&s, iters, || graph.replay(&src).map(|_| ()))?;
    let ours_launch_us = wall_us(&s, iters, || graph.launch().map(|_| ()))?;
    let ours_gpu_us = gpu_us(&s, iters, || graph.replay(&src).map(|_| ()))?;
    let raw_us = wall_us(&s, iters, || raw_replay(&mut xs))?;
    let raw_gpu_us = gpu_us(&s, iters, || raw_replay(&mut xs))?;
    let raw_launch_us = wall_us(&s, iters, || Ok(raw.launch()?))?;
    let mut early = ChainEarlyGraph::capture(rt, &src, ELEMS, n)?;
    assert_eq!(
        s.clone_dtoh(early.replay(&src)?.y)?,
        want,
        "early-launch replay"
    );
    let early_edges = early.info().early_edges;
    let early_us = wall_us(&s, iters, || early.replay(&src).map(|_| ()))?;
    let early_launch_us = wall_us(&s, iters, || early.launch().map(|_| ()))?;
    let early_gpu_us = gpu_us(&s, iters, || early.replay(&src).map(|_| ()))?;
    drop(early);
    phases.replay += t.elapsed().as_secs_f64();

    // Host time per call: bursts the GPU queue absorbs (16 calls; fewer for the longest
    // chains, whose replays take milliseconds of GPU time each).
    let t = Instant::now();
    let burst = (40_000 / n).clamp(4, 16);
    let (ours_host_us, raw_host_us) = host_per_call_pair(
        &s,
        burst,
        || graph.replay(&src).map(|_| ()),
        || raw_replay(&mut xs),
    )?;
    let (ours_launch_host_us, raw_launch_host_us) = host_per_call_pair(
        &s,
        burst,
        || graph.launch().map(|_| ()),
        || Ok(raw.launch()?),
    )?;
    phases.host += t.elapsed().as_secs_f64();

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
        early_us,
        early_launch_us,
        early_gpu_us,
        early_edges,
    })
}

impl Row {
    /// The report's record of this chain.
    fn record(&self) -> Record {
        let n = self.n;
        Record::new(
            "chain",
            Side::Ours,
            format!("chain/{n}"),
            format!("chain of {n} tiny kernels"),
            self.eager_us,
            self.ours_us,
        )
        .shape("kernels_n", n)
        .kernels(n)
        .with("graph_launch_us", self.ours_launch_us)
        .with("graph_gpu_us", self.ours_gpu_us)
        .with("graph_host_us", self.ours_host_us)
        .with("raw_us", self.raw_us)
        .with("raw_launch_us", self.raw_launch_us)
        .with("raw_host_us", self.raw_host_us)
        .with("capture_ms", self.ours_capture_ms)
        .with("raw_capture_ms", self.raw_capture_ms)
        .with("early_us", self.early_us)
        .with("early_launch_us", self.early_launch_us)
        .with("early_gpu_us", self.early_gpu_us)
    }
}

/// PyTorch's records of the same chains, from `scripts/torch_chain.py`, if `python3` with
/// torch is here.
fn torch_records(ns: &[usize]) -> Result<Vec<Record>, String> {
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
    read_output(&text)
        .map(|o| o.records)
        .map_err(|e| format!("{script}: {e}"))
}

fn main() -> Result<(), BoxError> {
    let started = Instant::now();
    let args = Args::parse();
    let ns: Vec<usize> = args.kernels.iter().map(|&n| n as usize).collect();
    let Some(rt) = runtime_or_skip("02-chain") else {
        return Ok(());
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
    eprintln!(
        "02-chain: runtime, kernels and warm-up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let rounds = args.capture_rounds as usize;
    let mut costs = Vec::new();
    for &n in &ns {
        let t = Instant::now();
        costs.push(capture_cost::measure(&rt, n, rounds, args.capture_only)?);
        eprintln!(
            "02-chain: N = {n}: capture cost in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    if args.capture_only {
        capture_cost::print(&costs, rounds);
        println!(
            "\ntwo untimed events (what ours creates per graph): {:.2} µs",
            capture_cost::two_events_us(&rt, 101)?
        );
        return Ok(());
    }
    let mut placed = Vec::new();
    for &n in &ns {
        let t = Instant::now();
        placed.push((n, like_for_like(&rt, n, args.placements as usize)?));
        eprintln!(
            "02-chain: N = {n}: like for like over {} placements in {:.1} s",
            args.placements,
            t.elapsed().as_secs_f64()
        );
    }
    let mut rows = Vec::new();
    for &n in &ns {
        let mut p = Phases::default();
        rows.push(measure(&rt, n, &mut p)?);
        eprintln!(
            "02-chain: N = {n}: eager {:.1} s, captures {:.1} s, replays {:.1} s, host timing {:.1} s",
            p.eager, p.capture, p.replay, p.host
        );
    }
    let t = Instant::now();
    let torch = if args.no_torch {
        Err("--no-torch".to_owned())
    } else {
        torch_records(&ns)
    };
    eprintln!("02-chain: PyTorch in {:.1} s", t.elapsed().as_secs_f64());

    println!(
        "like for like: µs per node (wall, back-to-back replays), median [least–greatest] over {} placements; \
         raw, plain floor and early floor are captured by hand on the same buffers as ours (raw: with the same \
         input copy; floors: no copy, the fastest CUDA allows with plain and with programmatic edges)",
        args.placements
    );
    println!("| N | ours µs/node | raw same buffers µs/node | ours/raw (median of per-placement ratios) | floor plain µs/node | floor early-launch µs/node | ours early-launch µs/node | raw own buffers µs/node |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (n, p) in &placed {
        let per = |v: &[f64]| {
            let (m, lo, hi) = spread(v);
            let n = *n as f64;
            format!("{:.3} [{:.3}–{:.3}]", m / n, lo / n, hi / n)
        };
        let ratios: Vec<f64> = p.ours.iter().zip(&p.raw_same).map(|(o, r)| o / r).collect();
        let (rm, rlo, rhi) = spread(&ratios);
        println!(
            "| {n} | {} | {} | {rm:.3} [{rlo:.3}–{rhi:.3}] | {} | {} | {} | {} |",
            per(&p.ours),
            per(&p.raw_same),
            per(&p.floor_plain),
            per(&p.floor_early),
            per(&p.ours_early),
            per(&p.raw_own)
        );
    }
    println!();
    println!("wall time per replay (µs) and per kernel/node (µs)");
    println!("| N | eager µs/kernel | ours replay µs | ours µs/node | raw cudarc replay µs | raw µs/node | ours/raw | ours early-launch µs/node | early/raw | ours launch-only µs | raw launch-only µs | speedup vs eager |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let n = r.n as f64;
        println!(
            "| {} | {:.2} | {:.1} | {:.3} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.1} | {:.1}× |",
            r.n,
            r.eager_us / n,
            r.ours_us,
            r.ours_us / n,
            r.raw_us,
            r.raw_us / n,
            r.ours_us / r.raw_us,
            r.early_us / n,
            r.early_us / r.raw_us,
            r.ours_launch_us,
            r.raw_launch_us,
            r.eager_us / r.ours_us
        );
    }
    println!("\nearly launch: GPU µs per node (CUDA events) and programmatic edges");
    println!("| N | ours GPU µs/node | ours early-launch GPU µs/node | early-launch launch-only µs | programmatic edges |");
    println!("|---:|---:|---:|---:|---:|");
    for r in &rows {
        let n = r.n as f64;
        println!(
            "| {} | {:.3} | {:.3} | {:.1} | {} |",
            r.n,
            r.ours_gpu_us / n,
            r.early_gpu_us / n,
            r.early_launch_us,
            r.early_edges
        );
    }
    capture_cost::print(&costs, rounds);
    println!("\nhost time inside one call (µs; ours replay = point the input node at the new input + launch, raw replay = input copy + launch), GPU time per node (µs, CUDA events), capture + instantiate (ms)");
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
            for tr in &t {
                let Some(n) = tr.shape_num("kernels_n") else {
                    continue;
                };
                if let Some(r) = rows.iter().find(|r| r.n as f64 == n) {
                    println!(
                        "| {n} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} |",
                        tr.eager_us / n,
                        tr.graph_us / n,
                        r.ours_us / n,
                        tr.num("replay_host_us").unwrap_or(f64::NAN),
                        r.ours_host_us,
                        tr.num("capture_ms").unwrap_or(f64::NAN)
                    );
                }
            }
        }
        Ok(_) => println!("\nPyTorch: not run (the script printed no records)"),
        Err(why) => println!("\nPyTorch: not run ({why})"),
    }
    if args.json {
        println!();
        for r in &rows {
            println!("{}", r.record().line());
        }
    }
    eprintln!("02-chain: {:.1} s in all", started.elapsed().as_secs_f64());
    Ok(())
}

// What this example needs besides graph-runtime: the kernels, the timing, the verification
// line, and the report's records (the JSON lines `08-report` reads).

/// The chain's kernels, CUDA C compiled by NVRTC. The `_early` pair is written for early
/// launch (see `graph_runtime::launch`): wait for the kernel before touching memory, then
/// let the next one be scheduled; before sm_90 the two instructions are left out.
const ELEMENTWISE: &str = r#"
extern "C" __global__ void add_scalar(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + a;
}

extern "C" __global__ void add_one_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] + 1.0f;
}

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
"#;

/// Measurements per timing; the median is reported.
const REPEATS: usize = 7;

/// The runtime on device 0, or `None` (with the reason on stderr) on a machine without a
/// usable GPU: no driver, no device, or a CUDA library missing.
///
/// # Panics
/// When the runtime fails on a GPU that is there.
fn runtime_or_skip(program: &str) -> Option<Runtime> {
    match Runtime::new(0) {
        Ok(rt) => Some(rt),
        Err(
            e @ (GraphError::NoDriver
            | GraphError::NoDevice { .. }
            | GraphError::MissingLibrary { .. }),
        ) => {
            eprintln!("skipped {program}: {e}");
            None
        }
        Err(e) => panic!("{program}: the runtime failed to start: {e}"),
    }
}

/// The first line of a verification report, or the mismatch as an error.
fn verified(report: graph_runtime::VerifyReport) -> Result<String, GraphError> {
    let report = report.into_result()?;
    Ok(report
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}

/// The median of `v` (the upper one of the two middle values for an even length).
fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of no values");
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median over [`REPEATS`] of the wall time per call (µs) of `f` called `iters` times back to
/// back, the stream synchronized before and after each batch of calls.
fn wall_us(
    s: &CudaStream,
    iters: usize,
    mut f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    let iters = iters.max(1);
    let mut per_call = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        s.synchronize()?;
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        s.synchronize()?;
        per_call.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    Ok(median(per_call))
}

/// Median over [`REPEATS`] of the GPU time per call (µs) of `f` called `iters` times,
/// measured with CUDA events recorded on `s` around the loop.
fn gpu_us(
    s: &CudaStream,
    iters: usize,
    mut f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    use graph_runtime::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    let iters = iters.max(1);
    let mut per_call = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        let start = s.record_event(Some(CU_EVENT_DEFAULT))?;
        for _ in 0..iters {
            f()?;
        }
        let end = s.record_event(Some(CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        per_call.push(start.elapsed_ms(&end)? as f64 * 1e3 / iters as f64);
    }
    Ok(median(per_call))
}

/// The report's records: one JSON object per line,
/// `{"bench":"chain","side":"ours","workload":"chain/10","what":…,"shape":{…},"eager_us":…,"graph_us":…,"kernels":10,…}`
/// (a figure that was not measured is `null`). `08-report` pairs ours with PyTorch's by
/// `workload`.
mod record {
    use serde_json::{Map, Value};

    /// Who measured.
    #[derive(Clone, Copy)]
    pub enum Side {
        /// This library.
        Ours,
    }

    /// One measurement of one workload.
    pub struct Record {
        /// Wall µs per eager call.
        pub eager_us: f64,
        /// Wall µs per graph replay.
        pub graph_us: f64,
        fields: Map<String, Value>,
    }

    impl Record {
        pub fn new(
            bench: &str,
            side: Side,
            workload: impl Into<String>,
            what: impl Into<String>,
            eager_us: f64,
            graph_us: f64,
        ) -> Self {
            let side = match side {
                Side::Ours => "ours",
            };
            let mut fields = Map::new();
            fields.insert("bench".into(), bench.into());
            fields.insert("side".into(), side.into());
            fields.insert("workload".into(), workload.into().into());
            fields.insert("what".into(), what.into().into());
            fields.insert("shape".into(), Value::Object(Map::new()));
            fields.insert("eager_us".into(), eager_us.into());
            fields.insert("graph_us".into(), graph_us.into());
            Record {
                eager_us,
                graph_us,
                fields,
            }
        }

        /// One dimension of the workload's shape.
        pub fn shape(mut self, key: &str, value: impl Into<Value>) -> Self {
            if let Some(Value::Object(shape)) = self.fields.get_mut("shape") {
                shape.insert(key.to_owned(), value.into());
            }
            self
        }

        /// Kernels per call.
        pub fn kernels(self, kernels: usize) -> Self {
            self.with("kernels", kernels as u64)
        }

        /// Any further figure.
        pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
            self.fields.insert(key.to_owned(), value.into());
            self
        }

        /// A number of the shape.
        pub fn shape_num(&self, key: &str) -> Option<f64> {
            self.fields.get("shape")?.get(key)?.as_f64()
        }

        /// A further figure, as a number.
        pub fn num(&self, key: &str) -> Option<f64> {
            self.fields.get(key)?.as_f64()
        }

        /// The record as one JSON line.
        pub fn line(&self) -> String {
            Value::Object(self.fields.clone()).to_string()
        }
    }

    /// The records among a program's output.
    pub struct Output {
        /// Every record line, in order.
        pub records: Vec<Record>,
    }

    /// The records of `text`: every line that is a JSON object, except environment lines
    /// (`{"env": …}`); other lines (tables, logs) are skipped.
    pub fn read_output(text: &str) -> Result<Output, String> {
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if !(line.starts_with('{') && line.ends_with('}')) {
                continue;
            }
            let value: Value = serde_json::from_str(line)
                .map_err(|e| format!("line {} is not a benchmark record: {e}", i + 1))?;
            let Value::Object(fields) = value else {
                continue;
            };
            if fields.contains_key("env") {
                continue;
            }
            let figure = |key: &str| fields.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN);
            records.push(Record {
                eager_us: figure("eager_us"),
                graph_us: figure("graph_us"),
                fields,
            });
        }
        Ok(Output { records })
    }
}

/// Capture cost, phase by phase: ours (`ChainGraph::capture`, from its `GraphInfo`) against
/// the same chain captured by hand with the driver API (begin, launches, end, instantiate
/// with the same flag, upload), both after two eager runs and a synchronize, interleaved
/// round by round in a rotating order so that neither always follows the other.
mod capture_cost {
    use std::time::{Duration, Instant};

    use graph_runtime::cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
    use graph_runtime::cudarc::driver::{
        CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
    };
    use graph_runtime::{GraphError, GraphInfo, Runtime};

    use super::{launch_chain, median, ChainGraph, ELEMS};

    /// A copy kernel in a module of its own, like the input copy node of ours (probe only).
    const COPY: &str = r#"
extern "C" __global__ void probe_input_copy(const unsigned char *src, unsigned char *dst,
                                            unsigned long long bytes) {
    unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (unsigned long long i = t; i < bytes; i += (unsigned long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"#;

    /// Milliseconds of each phase of one capture.
    #[derive(Clone, Copy, Default)]
    pub struct Split {
        /// Begin capture, the launches (ours: and its input copy node), end capture.
        pub capture: f64,
        /// Reading the recorded graph's nodes (ours: kinds, temporaries, copies).
        pub inspect: f64,
        /// `cuGraphInstantiateWithFlags` (ours: and what it does around it: its two ordering
        /// events, the memory check).
        pub instantiate: f64,
        /// `cuGraphUpload`.
        pub upload: f64,
    }

    impl Split {
        pub fn total(&self) -> f64 {
            self.capture + self.inspect + self.instantiate + self.upload
        }

        fn of_ours(info: &GraphInfo) -> Self {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            Split {
                capture: ms(info.capture_time),
                inspect: ms(info.inspect_time),
                instantiate: ms(info
                    .instantiate_time
                    .saturating_sub(info.inspect_time)
                    .saturating_sub(info.upload_time)),
                upload: ms(info.upload_time),
            }
        }

        /// The median of each phase (and so not quite a split of the median total).
        fn median_of(v: &[Split]) -> Split {
            let m = |f: fn(&Split) -> f64| median(v.iter().map(f).collect());
            Split {
                capture: m(|s| s.capture),
                inspect: m(|s| s.inspect),
                instantiate: m(|s| s.instantiate),
                upload: m(|s| s.upload),
            }
        }
    }

    /// What a hand capture does besides the chain (the probe's variants).
    #[derive(Clone, Copy)]
    struct Hand<'a> {
        flags: CUgraphInstantiate_flags,
        /// A copy kernel of its own module first, as ours records its input copy node.
        copy: Option<&'a CudaFunction>,
        /// Read every node's type before instantiating, as ours does.
        walk: bool,
        /// Create two untimed events before instantiating, as ours does.
        events: bool,
        /// Work left on the stream when the capture begins (see [`Busy`]).
        busy: Busy,
        /// Instantiate and upload in one call (`cuGraphInstantiateWithParams` with
        /// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`).
        one_call: bool,
        /// Kernels beyond the chain's N (1: as many nodes as ours, whose graph also holds its
        /// input copy node).
        extra: usize,
        /// Touch 8 MiB of host memory between ending the capture and instantiating (cold
        /// caches).
        cold: bool,
        /// Ask the driver what the stream is capturing into (`cuStreamGetCaptureInfo_v3`)
        /// after beginning and after the copy node, as ours does.
        info_queries: bool,
    }

    /// `cuStreamGetCaptureInfo_v3` on a capturing stream, as ours calls it (graph and
    /// dependencies, no edge data).
    fn capture_info(s: &CudaStream) -> Result<(), GraphError> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let mut deps: *const sys::CUgraphNode = std::ptr::null();
        let mut count = 0usize;
        // SAFETY: `s` is live and capturing on this thread; the driver writes the status, the
        // graph, a pointer to its own dependency array and its length.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                s.cu_stream(),
                &mut status,
                std::ptr::null_mut(),
                &mut graph,
                &mut deps,
                std::ptr::null_mut(),
                &mut count,
            )
        }
        .result()?;
        Ok(())
    }

    /// What the stream still has queued when a hand capture begins, after the warmup's
    /// synchronize: what ours had before its generators were read to the host.
    #[derive(Clone, Copy, PartialEq)]
    enum Busy {
        Idle,
        /// A 16-byte device copy.
        Copy,
        /// A 16-byte buffer allocated before the warmup, a 16-byte copy into it, and its free
        /// (stream-ordered), as the generator snapshot of ours did.
        AllocCopyFree,
    }

    /// A graph captured, instantiated and uploaded by hand; destroyed when dropped.
    struct HandGraph {
        graph: sys::CUgraph,
        exec: sys::CUgraphExec,
        _events: Vec<CudaEvent>,
    }

    impl Drop for HandGraph {
        fn drop(&mut self) {
            // SAFETY: both handles were made by `hand` and are destroyed once, here; CUDA
            // defers destroying an executable graph until its launches are done.
            unsafe {
                if !self.exec.is_null() {
                    let _ = sys::cuGraphExecDestroy(self.exec);
                }
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }

    /// The chain captured by hand on `x`, `y`, each phase timed.
    fn hand(
        rt: &Runtime,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
        how: Hand<'_>,
    ) -> Result<(HandGraph, Split), GraphError> {
        let s = rt.stream();
        let snapshot = match how.busy {
            Busy::AllocCopyFree => Some(s.alloc_zeros::<u64>(2)?),
            _ => None,
        };
        // The same warmup as ours: two eager runs, then a synchronize.
        let n = n + how.extra;
        launch_chain(s, rt, x, y, n)?;
        launch_chain(s, rt, x, y, n)?;
        s.synchronize()?;
        if how.busy != Busy::Idle {
            let (src, _s) = y.device_ptr(s);
            let dst = match &snapshot {
                Some(buf) => buf.device_ptr(s).0,
                None => src + 16,
            };
            let from = if snapshot.is_some() { src } else { src + 32 };
            // SAFETY: both ranges are 16 bytes inside live buffers (`y`, which the chain
            // overwrites, holds 1 KiB); the copy is queued on `s` ahead of the capture.
            unsafe {
                graph_runtime::cudarc::driver::result::memcpy_dtod_async(
                    dst,
                    from,
                    16,
                    s.cu_stream(),
                )
            }?;
        }
        drop(snapshot);
        let t = Instant::now();
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        if how.info_queries {
            capture_info(s)?;
        }
        if let Some(copy) = how.copy {
            let (xp, _sync) = x.device_ptr(s);
            let zero = 0u64;
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel copies 0 bytes (nothing); it is recorded, not run.
            unsafe {
                s.launch_builder(copy)
                    .arg(&xp)
                    .arg(&xp)
                    .arg(&zero)
                    .launch(cfg)
            }?;
            if how.info_queries {
                capture_info(s)?;
            }
        }
        launch_chain(s, rt, x, y, n)?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: this thread began capturing the live stream `s` above.
        unsafe { sys::cuStreamEndCapture(s.cu_stream(), &mut graph) }.result()?;
        let capture = t.elapsed();
        let mut g = HandGraph {
            graph,
            exec: std::ptr::null_mut(),
            _events: Vec::new(),
        };
        if how.cold {
            let mut v = vec![1u8; 8 << 20];
            for (i, b) in v.iter_mut().enumerate() {
                *b = b.wrapping_add(i as u8);
            }
            std::hint::black_box(&v);
        }
        let t = Instant::now();
        if how.walk {
            let mut count = 0usize;
            // SAFETY: `graph` is live; a null array asks for the count only, then the array
            // holds `count` handles; each node belongs to the live graph.
            unsafe {
                sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count).result()?;
                let mut nodes = vec![std::ptr::null_mut(); count];
                sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count).result()?;
                let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
                for node in nodes {
                    sys::cuGraphNodeGetType(node, &mut kind).result()?;
                }
            }
        }
        let inspect = t.elapsed();
        let t = Instant::now();
        if how.events {
            for _ in 0..2 {
                g._events.push(
                    rt.context()
                        .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
                );
            }
        }
        if how.one_call {
            let mut params = sys::CUDA_GRAPH_INSTANTIATE_PARAMS {
                flags: how.flags.0 as u64
                    | CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD.0 as u64,
                hUploadStream: s.cu_stream(),
                hErrNode_out: std::ptr::null_mut(),
                result_out: sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS,
            };
            // SAFETY: `graph` is the live graph just recorded on this context; `params` lives
            // across the call and names a live stream of it.
            unsafe { sys::cuGraphInstantiateWithParams(&mut g.exec, graph, &mut params) }
                .result()?;
        } else {
            // SAFETY: `graph` is the live graph just recorded on this context.
            unsafe { sys::cuGraphInstantiateWithFlags(&mut g.exec, graph, how.flags.0 as u64) }
                .result()?;
        }
        let instantiate = t.elapsed();
        let t = Instant::now();
        if !how.one_call {
            // SAFETY: `exec` is live and `s` a live stream of its context.
            unsafe { sys::cuGraphUpload(g.exec, s.cu_stream()) }.result()?;
        }
        let upload = t.elapsed();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Ok((
            g,
            Split {
                capture: ms(capture),
                inspect: ms(inspect),
                instantiate: ms(instantiate),
                upload: ms(upload),
            },
        ))
    }

    /// `graph` instantiated again by hand (AUTO_FREE_ON_LAUNCH, as both do) and uploaded:
    /// (instantiate ms, upload ms). The executable graph is destroyed after a synchronize.
    fn reinstantiate(rt: &Runtime, graph: sys::CUgraph) -> Result<(f64, f64), GraphError> {
        let s = rt.stream();
        s.synchronize()?;
        let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        let t = Instant::now();
        // SAFETY: `graph` is a live graph of this context (the caller keeps it alive).
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags.0 as u64) }.result()?;
        let inst = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        // SAFETY: `exec` is live and `s` a live stream of its context.
        let uploaded = unsafe { sys::cuGraphUpload(exec, s.cu_stream()) }.result();
        let up = t.elapsed().as_secs_f64() * 1e3;
        let synced = s.synchronize();
        // SAFETY: `exec` was made above, its upload is done, and it is destroyed once.
        unsafe { sys::cuGraphExecDestroy(exec) }.result()?;
        uploaded?;
        synced?;
        Ok((inst, up))
    }

    /// Medians over the rounds.
    pub struct Cost {
        pub n: usize,
        pub ours: Split,
        pub raw: Split,
        /// Raw with one kernel more: as many nodes as ours (its input copy node).
        pub raw_nodes: Split,
        /// Median of the per-round ratios ours total / raw total.
        pub ratio: f64,
        /// Median of the per-round ratios ours total / raw (N + 1 kernels) total.
        pub ratio_nodes: f64,
        /// Probe variants (with `--capture-only`): (name, split).
        pub variants: Vec<(&'static str, Split)>,
        /// Probe: (ours' recorded graph, raw's recorded graph) instantiated again by hand,
        /// (instantiate ms, upload ms).
        pub again: Option<((f64, f64), (f64, f64))>,
    }

    /// `rounds` captures of each kind for a chain of `n`.
    pub fn measure(rt: &Runtime, n: usize, rounds: usize, probe: bool) -> Result<Cost, GraphError> {
        let s = rt.stream();
        let host_x: Vec<f32> = (0..ELEMS).map(|i| i as f32).collect();
        let src = s.clone_htod(&host_x)?;
        let mut xs = s.alloc_zeros::<f32>(ELEMS)?;
        s.memcpy_dtod(&src, &mut xs)?;
        let mut ys = s.alloc_zeros::<f32>(ELEMS)?;
        let copy = rt.function(COPY, "probe_input_copy")?;
        let auto_free = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let raw_how = Hand {
            flags: auto_free,
            copy: None,
            walk: false,
            events: false,
            busy: Busy::Idle,
            one_call: false,
            info_queries: false,
            extra: 0,
            cold: false,
        };
        let one_more = Hand {
            extra: 1,
            ..raw_how
        };
        // `kinds[RAW]` and `kinds[RAW_NODES]` come first in both lists; the probe's variants
        // follow.
        const RAW: usize = 0;
        const RAW_NODES: usize = 1;
        let kinds: Vec<(&'static str, Hand<'_>)> = if probe {
            vec![
                ("raw", raw_how),
                ("raw, N + 1 kernels (as many nodes as ours)", one_more),
                (
                    "raw + 8 MiB of host memory touched before instantiating",
                    Hand {
                        cold: true,
                        ..raw_how
                    },
                ),
                (
                    "raw, instantiate + upload in one call",
                    Hand {
                        one_call: true,
                        ..raw_how
                    },
                ),
                (
                    "raw + 16 B copy queued before capture",
                    Hand {
                        busy: Busy::Copy,
                        ..raw_how
                    },
                ),
                (
                    "raw + 16 B alloc, copy, free queued before capture",
                    Hand {
                        busy: Busy::AllocCopyFree,
                        ..raw_how
                    },
                ),
                (
                    "raw + copy node (own module)",
                    Hand {
                        copy: Some(&copy),
                        ..raw_how
                    },
                ),
                (
                    "raw + copy node + walk + events",
                    Hand {
                        copy: Some(&copy),
                        walk: true,
                        events: true,
                        ..raw_how
                    },
                ),
                (
                    "raw + copy node + walk + events + 2 capture-info queries",
                    Hand {
                        copy: Some(&copy),
                        walk: true,
                        events: true,
                        info_queries: true,
                        ..raw_how
                    },
                ),
            ]
        } else {
            vec![("raw", raw_how), ("raw, N + 1 kernels", one_more)]
        };
        let slots = kinds.len() + 1;
        let mut ours = Vec::new();
        let mut hands: Vec<Vec<Split>> = vec![Vec::new(); kinds.len()];
        let (mut ratios, mut ratios_nodes) = (Vec::new(), Vec::new());
        // The last round's graphs of ours and raw, instantiated again after the rounds.
        let (mut kept_ours, mut kept_raw) = (None, None);
        for round in 0..rounds {
            let mut ours_total = f64::NAN;
            let (mut raw_total, mut raw_nodes_total) = (f64::NAN, f64::NAN);
            for slot in 0..slots {
                let k = (slot + round) % slots;
                if k == kinds.len() {
                    let g = ChainGraph::capture(rt, &src, ELEMS, n)?;
                    let split = Split::of_ours(g.info());
                    ours_total = split.total();
                    ours.push(split);
                    if probe && round + 1 == rounds {
                        kept_ours = Some(g);
                    }
                } else {
                    let (g, split) = hand(rt, &xs, &mut ys, n, kinds[k].1)?;
                    if k == RAW {
                        raw_total = split.total();
                    }
                    if k == RAW_NODES {
                        raw_nodes_total = split.total();
                    }
                    hands[k].push(split);
                    if round == 0 {
                        s.memset_zeros(&mut ys)?;
                        // SAFETY: `exec` is live, instantiated on this stream's context.
                        unsafe { sys::cuGraphLaunch(g.exec, s.cu_stream()) }.result()?;
                        let kernels = (n + kinds[k].1.extra) as f32;
                        let want: Vec<f32> = host_x.iter().map(|v| v + kernels).collect();
                        assert_eq!(s.clone_dtoh(&ys)?, want, "hand capture {}", kinds[k].0);
                    }
                    s.synchronize()?;
                    if probe && k == RAW && round + 1 == rounds {
                        kept_raw = Some(g);
                    }
                }
            }
            ratios.push(ours_total / raw_total);
            ratios_nodes.push(ours_total / raw_nodes_total);
        }
        // Both recorded graphs instantiated again, alternately: whether their contents cost
        // the driver the same.
        let (mut again_ours, mut again_raw) = (Vec::new(), Vec::new());
        if let (Some(o), Some(r)) = (&kept_ours, &kept_raw) {
            for _ in 0..rounds {
                again_ours.push(reinstantiate(rt, o.graph().cu_graph())?);
                again_raw.push(reinstantiate(rt, r.graph)?);
            }
        }
        drop((kept_ours, kept_raw));
        let med2 = |v: &[(f64, f64)]| {
            (
                median(v.iter().map(|p| p.0).collect()),
                median(v.iter().map(|p| p.1).collect()),
            )
        };
        Ok(Cost {
            n,
            ours: Split::median_of(&ours),
            raw: Split::median_of(&hands[RAW]),
            raw_nodes: Split::median_of(&hands[RAW_NODES]),
            ratio: median(ratios),
            ratio_nodes: median(ratios_nodes),
            variants: kinds
                .iter()
                .zip(&hands)
                .skip(RAW_NODES + 1)
                .map(|((name, _), v)| (*name, Split::median_of(v)))
                .collect(),
            again: probe.then(|| (med2(&again_ours), med2(&again_raw))),
        })
    }

    /// Microseconds to create two untimed events (median of `rounds`).
    pub fn two_events_us(rt: &Runtime, rounds: usize) -> Result<f64, GraphError> {
        let mut v = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            let a = rt
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
            let b = rt
                .context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
            drop((a, b));
        }
        Ok(median(v))
    }

    /// Prints the table of `costs`.
    pub fn print(costs: &[Cost], rounds: usize) {
        println!(
            "\ncapture cost (ms, median of {rounds} interleaved captures each, after two eager runs): \
             ours (`capture`, from its GraphInfo) against the chain captured by hand (begin, launches, \
             end; instantiate with AUTO_FREE_ON_LAUNCH as ours; upload as ours)"
        );
        println!("| N | ours capture | ours inspect | ours instantiate | ours upload | ours total | raw capture | raw instantiate | raw upload | raw total | ours/raw | raw N + 1 total | ours/raw N + 1 |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for c in costs {
            let (o, r) = (&c.ours, &c.raw);
            println!(
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                c.n,
                o.capture,
                o.inspect,
                o.instantiate,
                o.upload,
                o.total(),
                r.capture,
                r.instantiate,
                r.upload,
                r.total(),
                c.ratio,
                c.raw_nodes.total(),
                c.ratio_nodes
            );
        }
        if costs.iter().all(|c| c.variants.is_empty()) {
            return;
        }
        println!("\ncapture probe (ms, medians): hand captures doing part of what ours does, and each recorded graph instantiated again by hand");
        println!("| N | variant | capture | inspect | instantiate | upload | total |");
        println!("|---:|---|---:|---:|---:|---:|---:|");
        for c in costs {
            let rows = [
                ("ours", c.ours),
                ("raw", c.raw),
                ("raw, N + 1 kernels", c.raw_nodes),
            ]
            .into_iter()
            .chain(c.variants.iter().copied());
            for (name, s) in rows {
                println!(
                    "| {} | {name} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                    c.n,
                    s.capture,
                    s.inspect,
                    s.instantiate,
                    s.upload,
                    s.total()
                );
            }
            if let Some(((oi, ou), (ri, ru))) = c.again {
                println!(
                    "| {} | ours' graph instantiated again | | | {oi:.3} | {ou:.3} | {:.3} |",
                    c.n,
                    oi + ou
                );
                println!(
                    "| {} | raw's graph instantiated again | | | {ri:.3} | {ru:.3} | {:.3} |",
                    c.n,
                    ri + ru
                );
            }
        }
    }
}
