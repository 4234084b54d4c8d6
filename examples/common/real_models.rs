//! What the real-models tier (`17-candle-bert`, `18-candle-resnet`, `19-candle-llama-window`)
//! shares: one measurement of a candle-transformers model, eager and as a graph, and how it is
//! printed (tables) and recorded (`--json`, bench `real_models`, read by `08-report`).
//!
//! A measurement, in order:
//! 1. the first eager forward, timed alone: it loads candle's kernels (PTX JIT) and sets up
//!    cuBLAS, so it says what a cold start costs and stays out of the eager figure;
//! 2. the capture (warmup runs, capture, instantiate), timed, with the device's free memory
//!    (`cuMemGetInfo`) read before and after it and the runtime's graph pool after it;
//! 3. the first replay, timed alone (on a new input);
//! 4. the agreement: candle eager and the graph on `inputs` new random inputs, one replay
//!    after the other, compared bit for bit (the largest absolute difference is printed
//!    too), then `verify` on one more input;
//! 5. the timing: host wall clock per call, back-to-back calls between two synchronizes,
//!    median of 7 (`workloads::timing`), eager and replay on the same input.

#![allow(dead_code)] // each program uses part of it

use std::sync::Arc;
use std::time::Instant;

use bench_report::record::{Record, Side};
use bench_report::table::{us, Table};
use graph_runtime::candle::candle_core::{self as candle, Device, Tensor};
use graph_runtime::cudarc::driver::CudaStream;
use graph_runtime::{BoxError, GraphError, GraphInfo, GraphMemory, Runtime};
use workloads::check::max_abs_diff;
use workloads::testing::gpu_required;
use workloads::timing::{iters_for, wall_once, wall_us};

/// The bench (workload family) of every record of the tier: one table in the report.
pub const BENCH: &str = "real_models";

/// candle's device on CUDA 0, seeded with `seed`, the runtime on its stream, and the stream;
/// `None` (with the reason on stderr) on a machine without a usable GPU, unless
/// `CUDA_GRAPH_REQUIRE_GPU` asks for one.
pub fn device_or_skip(
    example: &str,
    seed: u64,
) -> Result<Option<(Device, Runtime, Arc<CudaStream>)>, BoxError> {
    let dev = match Device::new_cuda(0) {
        Ok(dev) => dev,
        Err(e) if !gpu_required() => {
            eprintln!("skipped {example}: no usable GPU ({e})");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let rt = Runtime::from_candle(&dev)?;
    let stream = dev.as_cuda_device()?.cuda_stream();
    dev.set_seed(seed)?;
    Ok(Some((dev, rt, stream)))
}

/// What one measurement found.
pub struct Figures {
    /// The record's workload key (`bert/8`), shared with `scripts/torch_real_models.py`.
    pub workload: String,
    /// The workload in words.
    pub what: String,
    /// The workload's shape, compared with PyTorch's record.
    pub shape: Vec<(&'static str, serde_json::Value)>,
    /// The first eager forward (kernel loading and cuBLAS set-up included), µs.
    pub first_eager_us: f64,
    /// Eager µs per forward, warm.
    pub eager_us: f64,
    /// Warmup runs + capture + instantiate + upload, ms.
    pub capture_ms: f64,
    /// The first replay (input copy included), µs.
    pub first_replay_us: f64,
    /// µs per replay (input copy included), warm.
    pub graph_us: f64,
    /// New inputs compared.
    pub inputs: usize,
    /// Whether every compared output was bitwise candle eager's.
    pub bitwise: bool,
    /// The largest |graph − eager| over the compared outputs.
    pub max_abs_diff: f32,
    /// The largest |eager output| (what the difference is to be read against).
    pub max_abs_out: f32,
    /// Whether `verify` (bitwise) agreed on one more input.
    pub verified: bool,
    /// What the graph says about itself.
    pub info: GraphInfo,
    /// The runtime's graph memory pool after the capture.
    pub pool: GraphMemory,
    /// Device memory the capture took: free memory before it minus free memory after it
    /// (`cuMemGetInfo`; negative when it gave memory back).
    pub capture_mem_bytes: i64,
}

impl Figures {
    /// Whether the graph agreed with candle eager (the example's exit status).
    pub fn agree(&self) -> bool {
        self.bitwise && self.verified
    }

    /// The `--json` record.
    pub fn record(&self) -> Record {
        self.record_in(BENCH)
    }

    /// The `--json` record, in workload family `bench`.
    pub fn record_in(&self, bench: &str) -> Record {
        let mut r = Record::new(
            bench,
            Side::Ours,
            self.workload.clone(),
            self.what.clone(),
            self.eager_us,
            self.graph_us,
        );
        for (k, v) in &self.shape {
            r = r.shape(k, v.clone());
        }
        let i = &self.info;
        r.kernels(i.kinds.kernels)
            .check(
                format!(
                    "output bitwise, candle eager vs graph, {} new inputs; verify",
                    self.inputs
                ),
                self.agree(),
            )
            .with("nodes", i.nodes())
            .with("first_eager_us", self.first_eager_us)
            .with("capture_ms", self.capture_ms)
            .with("warmup_ms", ms(i.warmup_time))
            .with("capture_only_ms", ms(i.capture_time))
            .with("instantiate_ms", ms(i.instantiate_time))
            .with("first_replay_us", self.first_replay_us)
            .with("max_abs_diff", self.max_abs_diff)
            .with("temp_bytes", i.temp_bytes)
            .with("temp_requested_bytes", i.temp_requested_bytes)
            .with("pool_added_bytes", i.pool_added_bytes)
            .with("pool_shared_bytes", i.pool_shared_bytes)
            .with("device_bytes", i.device_bytes())
            .with("static_bytes", i.static_bytes)
            .with("state_snapshot_bytes", i.state_snapshot_bytes)
            .with("pool_reserved_bytes", self.pool.reserved)
            .with("pool_used_high_bytes", self.pool.used_high)
            .with("capture_mem_bytes", self.capture_mem_bytes)
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn user(e: candle::Error) -> GraphError {
    GraphError::User(e.into())
}

/// The output as host `f32`s.
pub fn host(t: &Tensor) -> Result<Vec<f32>, GraphError> {
    t.flatten_all()
        .and_then(|t| t.to_dtype(candle::DType::F32))
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(user)
}

/// The model of one measurement: how to make an input, run it eagerly, capture it, replay
/// and verify the graph (closures over the example's graph type).
pub struct Model<I, G, FI, FE, FC, FR, FV> {
    /// A new random input.
    pub input: FI,
    /// candle eager.
    pub eager: FE,
    /// `XGraph::capture(..)` on an input.
    pub capture: FC,
    /// `graph.replay(..)`, the result tensor cloned (a handle, no copy).
    pub replay: FR,
    /// `graph.verify(.., Tolerance::BITWISE)`, whether it agreed.
    pub verify: FV,
    /// What the closures take and make.
    pub types: std::marker::PhantomData<(I, G)>,
}

/// Measures one workload (see the module docs); `info` reads the graph's [`GraphInfo`].
#[allow(clippy::too_many_arguments)]
pub fn measure<I, G, FI, FE, FC, FR, FV>(
    rt: &Runtime,
    stream: &Arc<CudaStream>,
    workload: String,
    what: String,
    shape: Vec<(&'static str, serde_json::Value)>,
    inputs: usize,
    mut m: Model<I, G, FI, FE, FC, FR, FV>,
    info: impl Fn(&G) -> GraphInfo,
) -> Result<Figures, BoxError>
where
    FI: FnMut() -> candle::Result<I>,
    FE: FnMut(&I) -> candle::Result<Tensor>,
    FC: FnOnce(&I) -> Result<G, GraphError>,
    FR: FnMut(&mut G, &I) -> Result<Tensor, GraphError>,
    FV: FnMut(&mut G, &I) -> Result<bool, GraphError>,
{
    // 1. The first eager forward: kernel loading (PTX JIT) and cuBLAS set-up.
    let x0 = (m.input)()?;
    let (_, first_eager_us) = wall_once(stream, || (m.eager)(&x0).map_err(user))?;

    // 2. The capture, with the device's free memory around it.
    stream.synchronize()?;
    rt.reset_graph_memory_high()?;
    let (free_before, _) = rt.mem_info()?;
    let t0 = Instant::now();
    let mut graph = (m.capture)(&x0)?;
    stream.synchronize()?;
    let capture_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (free_after, _) = rt.mem_info()?;
    let pool = rt.graph_memory()?;
    let capture_mem_bytes = free_before as i64 - free_after as i64;

    // 3. The first replay, on a new input (compared below with the others).
    let x1 = (m.input)()?;
    let (first, first_replay_us) = wall_once(stream, || (m.replay)(&mut graph, &x1))?;
    let mut pairs = vec![(host(&(m.eager)(&x1).map_err(user)?)?, host(&first)?)];
    drop(first);

    // 4. Agreement on new inputs, one replay after the other.
    for _ in 1..inputs.max(1) {
        let x = (m.input)()?;
        let eager = host(&(m.eager)(&x).map_err(user)?)?;
        let ours = host(&(m.replay)(&mut graph, &x)?)?;
        pairs.push((eager, ours));
    }
    let bitwise = pairs.iter().all(|(e, g)| {
        e.len() == g.len() && e.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits())
    });
    let max_abs_diff = pairs
        .iter()
        .map(|(e, g)| max_abs_diff(e, g))
        .fold(0f32, f32::max);
    let max_abs_out = pairs
        .iter()
        .flat_map(|(e, _)| e.iter())
        .fold(0f32, |m, x| m.max(x.abs()));
    let verified = (m.verify)(&mut graph, &(m.input)()?)?;

    // 5. Timing, eager and replay on the same input.
    let x = (m.input)()?;
    let probe = wall_us(stream, 3, || (m.eager)(&x).map(drop).map_err(user))?;
    let iters = iters_for(probe, 300_000.0, 10, 1000);
    let eager_us = wall_us(stream, iters, || (m.eager)(&x).map(drop).map_err(user))?;
    let graph_us = wall_us(stream, iters, || (m.replay)(&mut graph, &x).map(drop))?;

    Ok(Figures {
        workload,
        what,
        shape,
        first_eager_us,
        eager_us,
        capture_ms,
        first_replay_us,
        graph_us,
        inputs: inputs.max(1),
        bitwise,
        max_abs_diff,
        max_abs_out,
        verified,
        info: info(&graph),
        pool,
        capture_mem_bytes,
    })
}

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1024.0 * 1024.0))
}

/// The timing table, the memory table and the agreement lines of `rows`.
pub fn print(rows: &[Figures]) {
    let mut t = Table::new(&[
        "workload",
        ">candle eager µs",
        ">graph µs",
        ">speedup",
        ">first eager call ms",
        ">capture ms (warmup + capture + instantiate)",
        ">first replay µs",
        ">nodes (kernels)",
    ]);
    for f in rows {
        t.row(vec![
            f.what.clone(),
            us(f.eager_us),
            us(f.graph_us),
            format!("{:.2}×", f.eager_us / f.graph_us),
            format!("{:.1}", f.first_eager_us / 1e3),
            format!(
                "{:.1} ({:.1} + {:.1} + {:.1})",
                f.capture_ms,
                ms(f.info.warmup_time),
                ms(f.info.capture_time),
                ms(f.info.instantiate_time)
            ),
            us(f.first_replay_us),
            format!("{} ({})", f.info.nodes(), f.info.kinds.kernels),
        ]);
    }
    print!("{}", t.to_markdown());
    println!();
    let mut m = Table::new(&[
        "workload (MiB)",
        ">temporaries (high-water mark)",
        ">temporaries (sum of allocations)",
        ">pool added / shared",
        ">graph's device bytes",
        ">static buffers",
        ">state snapshot",
        ">graph pool reserved",
        ">graph pool used, high",
        ">free memory taken by the capture",
    ]);
    for f in rows {
        let i = &f.info;
        m.row(vec![
            f.what.clone(),
            mib(i.temp_bytes as f64),
            mib(i.temp_requested_bytes as f64),
            format!(
                "{} / {}",
                mib(i.pool_added_bytes as f64),
                mib(i.pool_shared_bytes as f64)
            ),
            mib(i.device_bytes() as f64),
            mib(i.static_bytes as f64),
            mib(i.state_snapshot_bytes as f64),
            mib(f.pool.reserved as f64),
            mib(f.pool.used_high as f64),
            mib(f.capture_mem_bytes as f64),
        ]);
    }
    print!("{}", m.to_markdown());
    println!(
        "\n(graph pool: the runtime's, shared by its graphs, read after each capture; free \
         memory: cuMemGetInfo before and after the capture)\n"
    );
    for f in rows {
        println!(
            "{}: graph {} candle eager bitwise on {} new inputs (largest |difference| {:.2e}, \
             largest |output| {:.2e}); verify: {}",
            f.what,
            if f.bitwise { "=" } else { "!=" },
            f.inputs,
            f.max_abs_diff,
            f.max_abs_out,
            if f.verified { "bitwise" } else { "FAILED" }
        );
    }
}

/// Prints `rows` (and their records with `json`); an error when a graph disagreed with candle
/// eager.
pub fn finish(rows: &[Figures], json: bool) -> Result<(), BoxError> {
    print(rows);
    if json {
        for f in rows {
            println!("{}", f.record().line());
        }
    }
    let bad: Vec<&str> = rows
        .iter()
        .filter(|f| !f.agree())
        .map(|f| f.what.as_str())
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the graph's output differs from candle eager: {}",
            bad.join("; ")
        )
        .into())
    }
}
