//! How the examples time their workloads.
//!
//! Timings are medians of [`REPEATS`] measurements. A *wall* time is `iters` calls issued
//! back to back, then one synchronize, divided by `iters`: what a caller that keeps the GPU
//! busy sees per call. A *GPU* time comes from CUDA events around the same loop.
//!
//! [`once`] and [`wall_once`] time a single run instead, for work whose state is reset
//! between runs.
//!
//! The `_aligned` variants call a function before each batch of calls, after the stream is
//! idle: a barrier between the ranks of a multi-GPU program, so that every rank's batch
//! starts together and no rank times its wait for another.

use std::time::Instant;

use graph_runtime::cudarc::driver::sys::CUevent_flags;
use graph_runtime::cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use graph_runtime::{GraphError, Runtime};

use crate::kernels::HOLD;

/// Measurements per timing; the median is reported.
pub const REPEATS: usize = 7;

/// The median of `v` (the upper one of the two middle values for an even length).
///
/// # Panics
/// If `v` is empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of no values");
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// How a batch of calls is timed.
#[derive(Clone, Copy)]
enum Clock {
    /// The host's clock, the stream synchronized before and after the batch.
    Wall,
    /// CUDA events recorded on the stream around the batch.
    Gpu,
}

/// What runs before each batch of calls, once the stream is idle.
type Align<'a> = Option<&'a mut dyn FnMut() -> Result<(), GraphError>>;

/// Median over [`REPEATS`] of the time per call (µs) of `f` called `iters` times back to back,
/// `align` called before each batch.
fn per_call_us(
    s: &CudaStream,
    iters: usize,
    mut f: impl FnMut() -> Result<(), GraphError>,
    clock: Clock,
    mut align: Align<'_>,
) -> Result<f64, GraphError> {
    let iters = iters.max(1);
    let mut batch = || -> Result<f64, GraphError> {
        if let Some(align) = align.as_mut() {
            s.synchronize()?;
            align()?;
        }
        let us = match clock {
            Clock::Wall => {
                wall_once(s, || {
                    for _ in 0..iters {
                        f()?;
                    }
                    Ok(())
                })?
                .1
            }
            Clock::Gpu => {
                let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                for _ in 0..iters {
                    f()?;
                }
                let end = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                end.synchronize()?;
                start.elapsed_ms(&end)? as f64 * 1e3
            }
        };
        Ok(us / iters as f64)
    };
    let per = (0..REPEATS)
        .map(|_| batch())
        .collect::<Result<Vec<f64>, GraphError>>()?;
    Ok(median(per))
}

/// Median over [`REPEATS`] of the wall time per call (µs) of `f` called `iters` times back to
/// back, the stream synchronized before and after each batch of calls.
pub fn wall_us(
    s: &CudaStream,
    iters: usize,
    f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    per_call_us(s, iters, f, Clock::Wall, None)
}

/// Median over [`REPEATS`] of the GPU time per call (µs) of `f` called `iters` times,
/// measured with CUDA events recorded on `s` around the loop.
pub fn gpu_us(
    s: &CudaStream,
    iters: usize,
    f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    per_call_us(s, iters, f, Clock::Gpu, None)
}

/// [`wall_us`] with `align` called before each batch of calls, once the stream is idle (a
/// host barrier between ranks, so that they start each batch together).
pub fn wall_us_aligned(
    s: &CudaStream,
    iters: usize,
    mut align: impl FnMut() -> Result<(), GraphError>,
    f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    per_call_us(s, iters, f, Clock::Wall, Some(&mut align))
}

/// [`gpu_us`] with `align` called before each batch of calls, once the stream is idle.
pub fn gpu_us_aligned(
    s: &CudaStream,
    iters: usize,
    mut align: impl FnMut() -> Result<(), GraphError>,
    f: impl FnMut() -> Result<(), GraphError>,
) -> Result<f64, GraphError> {
    per_call_us(s, iters, f, Clock::Gpu, Some(&mut align))
}

/// Wall and GPU time per call (µs, medians of [`REPEATS`]) of a function called eagerly and
/// of its graph: the four figures of a benchmark example's row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EagerGraph {
    /// Wall time per eager call.
    pub eager_us: f64,
    /// Wall time per graph launch (or replay).
    pub graph_us: f64,
    /// GPU time per eager call.
    pub eager_gpu_us: f64,
    /// GPU time per graph launch.
    pub graph_gpu_us: f64,
}

impl EagerGraph {
    /// Times `eager`, then `graph`, each `iters` calls per measurement: wall time, then GPU
    /// time ([`wall_us`], [`gpu_us`]).
    pub fn measure(
        s: &CudaStream,
        iters: usize,
        mut eager: impl FnMut() -> Result<(), GraphError>,
        mut graph: impl FnMut() -> Result<(), GraphError>,
    ) -> Result<Self, GraphError> {
        Ok(EagerGraph {
            eager_us: wall_us(s, iters, &mut eager)?,
            eager_gpu_us: gpu_us(s, iters, &mut eager)?,
            graph_us: wall_us(s, iters, &mut graph)?,
            graph_gpu_us: gpu_us(s, iters, &mut graph)?,
        })
    }

    /// [`EagerGraph::measure`] with `align` called before each batch of calls, once the stream
    /// is idle ([`wall_us_aligned`], [`gpu_us_aligned`]): every rank of a multi-GPU program
    /// calls it at the same time.
    pub fn measure_aligned(
        s: &CudaStream,
        iters: usize,
        mut align: impl FnMut() -> Result<(), GraphError>,
        mut eager: impl FnMut() -> Result<(), GraphError>,
        mut graph: impl FnMut() -> Result<(), GraphError>,
    ) -> Result<Self, GraphError> {
        Ok(EagerGraph {
            eager_us: wall_us_aligned(s, iters, &mut align, &mut eager)?,
            eager_gpu_us: gpu_us_aligned(s, iters, &mut align, &mut eager)?,
            graph_us: wall_us_aligned(s, iters, &mut align, &mut graph)?,
            graph_gpu_us: gpu_us_aligned(s, iters, &mut align, &mut graph)?,
        })
    }

    /// The slower of two ranks' figures, one by one: a multi-GPU step takes as long as its
    /// slowest rank.
    pub fn slower(&self, other: &Self) -> Self {
        EagerGraph {
            eager_us: self.eager_us.max(other.eager_us),
            graph_us: self.graph_us.max(other.graph_us),
            eager_gpu_us: self.eager_gpu_us.max(other.eager_gpu_us),
            graph_gpu_us: self.graph_gpu_us.max(other.graph_gpu_us),
        }
    }
}

/// One timed run of work measured once per run (a whole generation or solve, whose state is
/// reset between runs), and what it returned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Once<R> {
    /// What the work returned.
    pub value: R,
    /// Host wall time (µs) from just before the work until the stream is idle.
    pub wall_us: f64,
    /// GPU time (µs) between CUDA events recorded on the stream around the work.
    pub gpu_us: f64,
}

/// Runs `f` once, the stream idle before and synchronized after: its wall time and its GPU
/// time ([`Once`]). For the wall time alone, [`wall_once`] records no events.
pub fn once<R>(
    s: &CudaStream,
    f: impl FnOnce() -> Result<R, GraphError>,
) -> Result<Once<R>, GraphError> {
    s.synchronize()?;
    let t = Instant::now();
    let start = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let value = f()?;
    let stop = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    s.synchronize()?;
    let wall_us = t.elapsed().as_secs_f64() * 1e6;
    let gpu_us = start.elapsed_ms(&stop)? as f64 * 1e3;
    Ok(Once {
        value,
        wall_us,
        gpu_us,
    })
}

/// Runs `f` once, the stream idle before and synchronized after: what it returned and the
/// host wall time (µs) until the stream is idle.
pub fn wall_once<R>(
    s: &CudaStream,
    f: impl FnOnce() -> Result<R, GraphError>,
) -> Result<(R, f64), GraphError> {
    s.synchronize()?;
    let t = Instant::now();
    let value = f()?;
    s.synchronize()?;
    Ok((value, t.elapsed().as_secs_f64() * 1e6))
}

/// Calls queued behind one hold in [`per_call_gpu_us`]: few enough for CUDA's launch queue.
pub const HELD_CALLS: usize = 200;

/// How long the GPU is held per queued call: more than any host (PyTorch's included) takes
/// to queue one call and its two events.
const HOLD_NS_PER_CALL: u64 = 40_000;

/// The GPU time (µs) of each of `iters` calls of `f` when the GPU runs them back to back:
/// the time between CUDA events recorded on the runtime's stream before the first call and
/// after each call. In batches of [`HELD_CALLS`], the stream is held by a kernel that spins
/// (`kernels::HOLD`) while the host queues the batch, so no call waits for the host to issue
/// it. `align` runs before each batch, once the stream is idle (a barrier between ranks).
/// The distribution of one operation's cost in a busy stream, for percentiles
/// ([`percentile`]).
pub fn per_call_gpu_us(
    rt: &Runtime,
    iters: usize,
    mut align: impl FnMut() -> Result<(), GraphError>,
    mut f: impl FnMut() -> Result<(), GraphError>,
) -> Result<Vec<f64>, GraphError> {
    let s = rt.stream();
    let hold = rt.function(HOLD, "hold_for")?;
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let iters = iters.max(1);
    let batch = HELD_CALLS.min(iters);
    let events = (0..=batch)
        .map(|_| s.context().new_event(flags))
        .collect::<Result<Vec<_>, _>>()?;
    let mut times = Vec::with_capacity(iters);
    while times.len() < iters {
        let calls = batch.min(iters - times.len());
        s.synchronize()?;
        align()?;
        let ns = HOLD_NS_PER_CALL * calls as u64;
        let mut launch = s.launch_builder(&hold);
        launch.arg(&ns);
        // SAFETY: `hold_for` takes one `unsigned long long` by value and touches no memory.
        unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;
        events[0].record(s)?;
        for event in &events[1..=calls] {
            f()?;
            event.record(s)?;
        }
        s.synchronize()?;
        for pair in events[..=calls].windows(2) {
            times.push(pair[0].elapsed_ms(&pair[1])? as f64 * 1e3);
        }
    }
    Ok(times)
}

/// The `p`-th percentile (0 to 100) of `v`, the nearest-rank value.
///
/// # Panics
/// If `v` is empty.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    assert!(!v.is_empty(), "percentile of no values");
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// How many calls of about `estimate_us` each fill `budget_us`, clamped to `[min, max]`.
pub fn iters_for(estimate_us: f64, budget_us: f64, min: usize, max: usize) -> usize {
    let n = if estimate_us.is_finite() && estimate_us > 0.0 {
        (budget_us / estimate_us).floor()
    } else {
        max as f64
    };
    (n.max(0.0) as usize).clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_lengths() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(vec![5.0]), 5.0);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    #[should_panic(expected = "median of no values")]
    fn median_of_nothing_panics() {
        median(Vec::new());
    }

    #[test]
    fn the_slower_rank_figure_by_figure() {
        let a = EagerGraph {
            eager_us: 1.0,
            graph_us: 4.0,
            eager_gpu_us: 2.0,
            graph_gpu_us: 0.5,
        };
        let b = EagerGraph {
            eager_us: 3.0,
            graph_us: 2.0,
            eager_gpu_us: 2.5,
            graph_gpu_us: 0.25,
        };
        let want = EagerGraph {
            eager_us: 3.0,
            graph_us: 4.0,
            eager_gpu_us: 2.5,
            graph_gpu_us: 0.5,
        };
        assert_eq!(a.slower(&b), want);
        assert_eq!(b.slower(&a), want);
    }

    #[test]
    fn iteration_counts_fill_the_budget() {
        assert_eq!(iters_for(100.0, 10_000.0, 1, 1000), 100);
        assert_eq!(iters_for(1.0, 10_000.0, 1, 1000), 1000);
        assert_eq!(iters_for(1e6, 10_000.0, 3, 1000), 3);
        assert_eq!(iters_for(0.0, 10_000.0, 3, 50), 50);
        assert_eq!(iters_for(f64::NAN, 10_000.0, 3, 50), 50);
    }
}
