//! Built-in verification on a GPU: correct graphs verify clean and leave everything as a
//! plain replay would; planted bugs (a host counter that changes the kernel or its
//! arguments, a read of memory nobody initialised, state swapped under the graph) are each
//! reported with a message that names them.

use std::sync::atomic::{AtomicU32, Ordering};

use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, Generator, GraphError, Runtime, Tolerance, When};
use workloads::testing::{fresh_rng, gpu_test, random_vec};

const SRC: &str = r#"
extern "C" __global__ void axpy(const float *x, const float *noise, float *acc, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { acc[i] += x[i]; y[i] = a * acc[i] + noise[i]; }
}
extern "C" __global__ void scale(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void negate(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = -a * x[i];
}
extern "C" __global__ void copy(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"#;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// A correct body with everything verification must handle: `&mut` state, random numbers
/// from a generator of the caller's, a temporary, a constant.
#[cuda_graph(warmup = 2, verify = "never")]
fn noisy_accumulate(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] rng: &Generator,
    #[state] acc: &mut CudaSlice<f32>,
    #[constant] a: f32,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len();
    let mut noise = rt.stream().alloc_zeros::<f32>(n)?;
    rng.normal(rt, &mut noise, 0.0, 1.0)?;
    let f = rt.function(SRC, "axpy")?;
    let ni = n as i32;
    // SAFETY: reads `n` floats of `x` and `noise`, updates `n` of `acc`, writes `n` of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&noise)
            .arg(&mut *acc)
            .arg(&mut *y)
            .arg(&a)
            .arg(&ni)
            .launch(grid(n))?;
    }
    Ok(())
}

#[gpu_test]
fn a_correct_graph_verifies_clean_and_leaves_what_a_replay_leaves(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "a_correct_graph_verifies_clean_and_leaves_what_a_replay_leaves";
    let mut rng = fresh_rng(test);
    let n = 3001;
    let s = rt.stream().clone();
    let start = random_vec(&mut rng, n);
    let xs: Vec<Vec<f32>> = (0..4).map(|_| random_vec(&mut rng, n)).collect();
    // Two identical set-ups: one verifies its first replay, the other only replays.
    let (ga, gb) = (rt.generator(7)?, rt.generator(7)?);
    let (mut acc_a, mut acc_b) = (s.clone_htod(&start)?, s.clone_htod(&start)?);
    let mut a = NoisyAccumulateGraph::capture(&rt, &xs[0], &ga, &mut acc_a, 0.5, n)?;
    let mut b = NoisyAccumulateGraph::capture(&rt, &xs[0], &gb, &mut acc_b, 0.5, n)?;

    let report = a.verify(&xs[0], Tolerance::BITWISE)?;
    assert!(report.is_ok(), "{report}");
    assert_eq!(
        report.items.len(),
        2,
        "the output and the `&mut` state: {report}"
    );
    assert!(report.items.iter().all(|i| i.bitwise_equal), "{report}");
    let text = report.to_string();
    assert!(
        text.contains("output `y`") && text.contains("state `acc`"),
        "{text}"
    );

    let ya = s.clone_dtoh(a.outputs().y)?;
    let yb = s.clone_dtoh(b.replay(&xs[0])?.y)?;
    assert_eq!(ya, yb, "verify leaves the replay's outputs");
    for x in &xs[1..] {
        let ya = s.clone_dtoh(a.replay(x)?.y)?;
        let yb = s.clone_dtoh(b.replay(x)?.y)?;
        assert_eq!(
            ya, yb,
            "and the state and the generator where a replay leaves them"
        );
    }
    assert_eq!(ga.seed_and_offset(&rt)?, gb.seed_and_offset(&rt)?);
    Ok(())
}

static CALLS: AtomicU32 = AtomicU32::new(0);

/// Planted: a host counter picks the kernel.
#[cuda_graph(warmup = 2, check_determinism = true)]
fn counter_picks_the_kernel(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    // Planted past the compile-time check (`host-static-state`) on purpose: the runtime's
    // determinism check is what must refuse it.
    let call = graph_runtime::replays_as_captured!(CALLS.fetch_add(1, Ordering::SeqCst));
    let name = if call.is_multiple_of(2) {
        "scale"
    } else {
        "negate"
    };
    let f = rt.function(SRC, name)?;
    let n = x.len() as i32;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut *y)
            .arg(&2.0f32)
            .arg(&n)
            .launch(grid(x.len()))?;
    }
    Ok(())
}

static SCALE: AtomicU32 = AtomicU32::new(0);

/// Planted: a host counter changes a kernel argument.
#[cuda_graph(warmup = 2, check_determinism = true)]
fn counter_in_an_argument(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    // Planted past the compile-time check on purpose, as above.
    let a = graph_runtime::replays_as_captured!(SCALE.fetch_add(1, Ordering::SeqCst)) as f32;
    let f = rt.function(SRC, "scale")?;
    let n = x.len() as i32;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut *y)
            .arg(&a)
            .arg(&n)
            .launch(grid(x.len()))?;
    }
    Ok(())
}

#[gpu_test]
fn host_dependent_recordings_are_refused_at_capture(rt: Runtime) -> Result<(), GraphError> {
    let x = rt.stream().clone_htod(&[1.0f32; 128])?;
    let err = CounterPicksTheKernelGraph::capture(&rt, &x, 128).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::WarmupDiverged {
                graph: "counter_picks_the_kernel",
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("[negate]") && msg.contains("[scale]"), "{msg}");

    let err = CounterInAnArgumentGraph::capture(&rt, &x, 128).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, GraphError::NondeterministicCapture { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("node 0") && msg.contains("kernel `scale` with argument 2"),
        "{msg}"
    );
    // The runtime is usable and a deterministic body still captures with the check on.
    SCALE.store(0, Ordering::SeqCst);
    let mut ok = CopiesGraph::capture(&rt, &x, 128)?;
    assert!(ok.info().checks_time > std::time::Duration::ZERO);
    assert_eq!(rt.stream().clone_dtoh(ok.replay(&x)?.y)?, vec![1.0f32; 128]);
    Ok(())
}

#[cuda_graph(warmup = 1, check_determinism = true)]
fn copies(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let f = rt.function(SRC, "copy")?;
    let n = x.len() as i32;
    let mut tmp = rt.stream().alloc_zeros::<f32>(x.len())?;
    // SAFETY: reads `n` floats of its first buffer, writes `n` of its second.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut tmp)
            .arg(&n)
            .launch(grid(x.len()))?;
        rt.stream()
            .launch_builder(&f)
            .arg(&tmp)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(x.len()))?;
    }
    Ok(())
}

/// Planted: reads a temporary before anything wrote it (then fills it for next time).
#[cuda_graph(warmup = 1, verify = "never")]
fn reads_uninitialised(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let f = rt.function(SRC, "copy")?;
    let n = x.len() as i32;
    // SAFETY: deliberately not initialised: the bug this test plants.
    let mut tmp = unsafe { rt.stream().alloc::<f32>(x.len()) }?;
    // SAFETY: reads `n` floats of its first buffer, writes `n` of its second.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&tmp)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(x.len()))?;
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut tmp)
            .arg(&n)
            .launch(grid(x.len()))?;
    }
    Ok(())
}

/// The same bug, with every replay verifying itself.
#[cuda_graph(warmup = 1, verify = "every")]
fn reads_uninitialised_checked(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    reads_uninitialised(rt, x, y)
}

#[gpu_test]
fn a_read_of_uninitialised_memory_is_reported(rt: Runtime) -> Result<(), GraphError> {
    let n = 4096;
    let s = rt.stream().clone();
    let x = vec![2.0f32; n];
    let mut graph = ReadsUninitialisedGraph::capture(&rt, &x, n)?;
    graph.replay(&x)?;
    // Leave a recognisable pattern where the eager side's temporary will be allocated.
    let bait = s.clone_htod(&vec![12345.0f32; n])?;
    drop(bait);
    let report = graph.verify(&vec![3.0f32; n], Tolerance::BITWISE)?;
    assert!(!report.is_ok(), "{report}");
    let item = &report.items[0];
    assert_eq!(item.name, "y");
    assert_eq!(item.first_difference, Some(0), "{report}");
    let err = report.into_result().unwrap_err();
    assert!(matches!(
        err,
        GraphError::VerifyMismatch {
            graph: "reads_uninitialised",
            ..
        }
    ));
    assert!(err.to_string().contains("MISMATCH"), "{err}");

    let mut checked = ReadsUninitialisedCheckedGraph::capture(&rt, &x, n)?;
    checked.launch()?; // fill the graph's temporary with x
    let bait = s.clone_htod(&vec![12345.0f32; n])?;
    drop(bait);
    let err = checked.replay(&vec![5.0f32; n]).unwrap_err();
    assert!(matches!(err, GraphError::VerifyMismatch { .. }), "{err:?}");
    Ok(())
}

/// State the caller can swap between replays.
#[derive(graph_runtime::DeviceState)]
struct Weights {
    w: CudaSlice<f32>,
}

#[cuda_graph(warmup = 1, verify = "never")]
fn weighted(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] weights: &mut Weights,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let _ = x;
    rt.stream().memcpy_dtod(&weights.w, y)?;
    Ok(())
}

#[gpu_test]
fn state_swapped_under_the_graph_is_named_by_verify(rt: Runtime) -> Result<(), GraphError> {
    let s = rt.stream().clone();
    let mut weights = Weights {
        w: s.clone_htod(&[1.0f32; 64])?,
    };
    let mut graph = WeightedGraph::capture(&rt, &[0.0f32; 64], &mut weights, 64)?;
    assert!(graph.verify(&[0.0f32; 64], Tolerance::BITWISE)?.is_ok());
    graph.state_mut().weights.w = s.clone_htod(&[2.0f32; 64])?;
    let err = graph.verify(&[0.0f32; 64], Tolerance::BITWISE).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::StateMoved {
                param: "weights",
                when: When::Replay,
                ..
            }
        ),
        "{err:?}"
    );
    Ok(())
}

#[gpu_test]
fn the_summary_and_the_dot_file_describe_the_graph(rt: Runtime) -> Result<(), GraphError> {
    let x = rt.stream().clone_htod(&[1.0f32; 256])?;
    let graph = CopiesGraph::capture(&rt, &x, 256)?;
    let summary = graph.to_string();
    assert!(summary.starts_with("graph `copies`"), "{summary}");
    assert!(summary.contains("copy ×2"), "{summary}");
    assert!(
        summary.contains("1 allocs") && summary.contains("1 frees"),
        "{summary}"
    );
    let path = std::env::temp_dir().join(format!("copies-{}.dot", std::process::id()));
    graph.graph().write_dot(&path, false)?;
    let dot = std::fs::read_to_string(&path).map_err(|e| GraphError::User(e.into()))?;
    let _ = std::fs::remove_file(&path);
    assert!(dot.contains("digraph"), "{dot}");
    eprintln!("{summary}");
    Ok(())
}

// ---- The net under the compile-time checks: a host value frozen at capture ----

/// A learning-rate schedule of the user's: a host object the body reads through a helper,
/// which the compile-time checks cannot see into.
struct Schedule {
    step: AtomicU32,
}

impl Schedule {
    fn rate(&self) -> f32 {
        if self.step.load(Ordering::Relaxed) < 3 {
            0.5
        } else {
            0.25
        }
    }
}

static SCHEDULE: Schedule = Schedule {
    step: AtomicU32::new(0),
};

fn learning_rate() -> f32 {
    SCHEDULE.rate()
}

/// `y = rate · x`, the rate read from the host schedule: frozen into the graph at capture.
#[cuda_graph(warmup = 1, verify = "doubling")]
fn scaled_by_schedule(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let a = learning_rate();
    let n = x.len();
    let f = rt.function(SRC, "scale")?;
    let ni = n as i32;
    // SAFETY: reads `n` floats of `x`, writes `n` of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut *y)
            .arg(&a)
            .arg(&ni)
            .launch(grid(n))?;
    }
    Ok(())
}

/// The schedule changes after replay 3; the frozen rate is caught at replay 4, the next one
/// the doubling schedule verifies, naming the graph, the output and the replay.
#[gpu_test]
fn a_frozen_host_value_is_caught_at_the_next_doubling_replay(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_frozen_host_value_is_caught_at_the_next_doubling_replay");
    let n = 1000;
    SCHEDULE.step.store(0, Ordering::Relaxed);
    let mut graph = ScaledByScheduleGraph::capture(&rt, &random_vec(&mut rng, n), n)?;
    for replay in 1..=3 {
        graph.replay(&random_vec(&mut rng, n))?;
        SCHEDULE.step.store(replay, Ordering::Relaxed);
    }
    let err = graph.replay(&random_vec(&mut rng, n)).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            GraphError::VerifyMismatch {
                graph: "scaled_by_schedule",
                ..
            }
        ) && text.contains("replay 4")
            && text.contains("output `y`"),
        "{text}"
    );
    SCHEDULE.step.store(0, Ordering::Relaxed);
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
