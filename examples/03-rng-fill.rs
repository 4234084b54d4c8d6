//! # 03 — graph-safe random numbers, and how fast they are
//!
//! Random kernels read their generator's seed and offset from device memory and move the
//! offset on the device, so a captured graph draws fresh numbers on every replay with no
//! registration (see `graph_runtime::rng`). This example shows that, then fills 256 MiB of
//! f32 with uniform and normal numbers and compares the bandwidth with the device's own
//! memset (write) and copy (read + write), and with `torch.rand` / `torch.randn` when
//! PyTorch is installed (`scripts/torch_rng.py`, same run).
//!
//! Run: `cargo run --release --example 03-rng-fill`
//!
//! It uses `graph-runtime` (and cudarc through it) and `serde_json` for PyTorch's figures:
//! the helpers it needs (the timing, the verification line) are at the end of this file.

use std::process::Command;

use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::{cuda_graph, GraphError, Runtime, Tolerance};

const BYTES: usize = 256 << 20;
const ITERS: usize = 20;

/// Noise for, say, a diffusion step: drawn from the runtime's default generator.
#[cuda_graph(warmup = 2)]
fn noise(rt: &Runtime, out: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    rt.rng().normal(rt, out, 0.0, 1.0)
}

fn gbps(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

fn main() -> Result<(), GraphError> {
    let Some(rt) = runtime_or_skip("03-rng-fill")? else {
        return Ok(());
    };
    let s = rt.stream().clone();

    // 1. Fresh numbers on every replay, no registration step.
    let mut graph = NoiseGraph::capture(&rt, 8)?;
    // Verification draws the same numbers on both sides: the generator is rewound between
    // the eager run and the replay.
    println!("{}", verified(graph.verify(Tolerance::BITWISE)?)?);
    for k in 0..3 {
        let out = graph.replay()?;
        let v = s.clone_dtoh(out.out)?;
        println!("replay {k}: {:.4} {:.4} {:.4} …", v[0], v[1], v[2]);
    }
    drop(graph);

    // 2. Bandwidth on 256 MiB.
    let n = BYTES / 4;
    let mut buf = s.alloc_zeros::<f32>(n)?;
    let other = s.alloc_zeros::<f32>(n)?;
    let g = rt.generator(1234)?;
    let uniform_ms = gpu_us(&s, ITERS, || g.uniform(&rt, &mut buf, 0.0, 1.0))? / 1e3;
    let normal_ms = gpu_us(&s, ITERS, || g.normal(&rt, &mut buf, 0.0, 1.0))? / 1e3;
    let mut big = NoiseGraph::capture(&rt, n)?;
    let graph_ms = gpu_us(&s, ITERS, || big.launch().map(|_| ()))? / 1e3;
    let memset_ms = gpu_us(&s, ITERS, || Ok(s.memset_zeros(&mut buf)?))? / 1e3;
    let copy_ms = gpu_us(&s, ITERS, || Ok(s.memcpy_dtod(&other, &mut buf)?))? / 1e3;

    let device = rt.context().name().unwrap_or_default();
    println!("\nfill 256 MiB of f32 on {device} (median of {REPEATS} × {ITERS}, CUDA events)");
    println!("| operation | ms | GB/s written | % of memset write bandwidth |");
    println!("|---|---:|---:|---:|");
    let w = gbps(BYTES, memset_ms);
    for (name, ms) in [
        ("memset (write bandwidth)", memset_ms),
        ("uniform f32 (eager)", uniform_ms),
        ("normal f32 (eager)", normal_ms),
        ("normal f32 (graph replay)", graph_ms),
    ] {
        println!(
            "| {name} | {ms:.4} | {:.0} | {:.0}% |",
            gbps(BYTES, ms),
            100.0 * gbps(BYTES, ms) / w
        );
    }
    println!(
        "| copy (read + write) | {copy_ms:.4} | {:.0} read+write | |",
        gbps(2 * BYTES, copy_ms)
    );

    match Command::new("python3").arg("scripts/torch_rng.py").output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            // One JSON object per line: {"op": "rand", "ms": 0.123}.
            for line in text.lines() {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue;
                };
                if let (Some(op), Some(ms)) = (v["op"].as_str(), v["ms"].as_f64()) {
                    println!(
                        "| torch.{op} (PyTorch, same run) | {ms:.4} | {:.0} | {:.0}% |",
                        gbps(BYTES, ms),
                        100.0 * gbps(BYTES, ms) / w
                    );
                }
            }
        }
        Ok(out) => println!(
            "\nPyTorch: not run ({})",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("failed")
        ),
        Err(e) => println!("\nPyTorch: not run (python3: {e})"),
    }
    Ok(())
}

/// Measurements per timing; the median is reported.
const REPEATS: usize = 7;

/// The runtime on device 0, or `None` (with the reason on stderr) on a machine without a
/// usable GPU: no driver, no device, or a CUDA library missing.
fn runtime_or_skip(program: &str) -> Result<Option<Runtime>, GraphError> {
    match Runtime::new(0) {
        Ok(rt) => Ok(Some(rt)),
        Err(
            e @ (GraphError::NoDriver
            | GraphError::NoDevice { .. }
            | GraphError::MissingLibrary { .. }),
        ) => {
            eprintln!("skipped {program}: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
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

/// Median over [`REPEATS`] of the GPU time per call (µs) of `f` called `iters` times,
/// measured with CUDA events recorded on `s` around the loop.
fn gpu_us(
    s: &graph_runtime::cudarc::driver::CudaStream,
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
    per_call.sort_by(f64::total_cmp);
    Ok(per_call[per_call.len() / 2])
}
