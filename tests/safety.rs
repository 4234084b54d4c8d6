//! The safety promises, tried the way a careless user would on a GPU: state replaced under a
//! graph, a body that replaces its own parameters, warmup that changes `&mut` state, a panic
//! or an error in the warmup, a graph that outlives its runtime handle, a fork whose side
//! branch reads a buffer that is freed right after the join, out of memory at every stage
//! of a capture, a kernel replaced inside state, and state of another stream lent or freed
//! while a replay still reads it.
//!
//! What cannot be written at all (a view replaced through `state_mut()`, a field of the
//! graph assigned, a side-branch buffer dropped before the join) is in `ui-tests/`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use graph_runtime::cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, is_capturing, DeviceState, GraphError, Runtime, When};
use workloads::testing::{fresh_rng, gpu_test, random_vec};

const SRC: &str = r#"
extern "C" __global__ void accumulate(const float *x, float *acc, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += x[i];
}
extern "C" __global__ void count(unsigned int *counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) counter[0] += 1u;
}
extern "C" __global__ void scale(const float *x, const float *w, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + w[i];
}
extern "C" __global__ void slow_copy(const float *x, float *y, int n, int spin) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < spin; ++k) v = v * 1.0000001f + 0.0f;
        y[i] = x[i] + 0.0f * v;
    }
}
"#;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// State the macro cannot see into: a struct of buffers.
#[derive(DeviceState)]
struct Model {
    w: CudaSlice<f32>,
    counter: CudaSlice<u32>,
    label: String,
}

/// `y = 2x + w`, and the model's counter goes up by one per call.
#[cuda_graph(warmup = 2)]
fn scaled(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] model: &mut Model,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let (f, c) = (rt.function(SRC, "scale")?, rt.function(SRC, "count")?);
    // SAFETY: `scale` reads `n` floats of `x` and `w`, writes `n` of `y`; `count` writes one
    // word of the counter.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&model.w)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(x.len()))?;
        rt.stream()
            .launch_builder(&c)
            .arg(&mut model.counter)
            .launch(grid(1))?;
    }
    Ok(())
}

fn model(rt: &Runtime, w: &[f32]) -> Result<Model, GraphError> {
    Ok(Model {
        w: rt.stream().clone_htod(w)?,
        counter: rt.stream().alloc_zeros::<u32>(1)?,
        label: "m".into(),
    })
}

#[gpu_test]
fn state_replaced_through_state_mut_is_refused_before_the_launch(
    rt: Runtime,
) -> Result<(), GraphError> {
    let test = "state_replaced_through_state_mut_is_refused_before_the_launch";
    let mut rng = fresh_rng(test);
    let n = 2048;
    let s = rt.stream().clone();
    let mut m = model(&rt, &random_vec(&mut rng, n))?;
    let x0 = random_vec(&mut rng, n);
    let mut graph = ScaledGraph::capture(&rt, &x0, &mut m, n)?;
    graph.replay(&x0)?;

    // The careless part: a new buffer assigned to a field of the state the graph holds. The
    // old buffer is freed; another allocation of the same size may now sit at its address.
    let fresh = s.clone_htod(&vec![7.0f32; n])?;
    graph.state_mut().model.w = fresh;
    let bystander = s.clone_htod(&vec![3.0f32; n])?;
    let err = graph.replay(&x0).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::StateMoved {
                graph: "scaled",
                param: "model",
                when: When::Replay,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("buffer 1 of 2") && msg.contains("nothing was launched"),
        "{msg}"
    );
    assert!(graph.launch().is_err(), "launch checks the state too");
    assert_eq!(
        s.clone_dtoh(&bystander)?,
        vec![3.0f32; n],
        "nothing wrote the reused memory"
    );
    // The counter ran for every replay that launched: one.
    assert_eq!(s.clone_dtoh(&graph.state_mut().model.counter)?, vec![1]);
    Ok(())
}

/// A body that replaces its output during warmup.
#[cuda_graph(warmup = 2)]
fn replaces_output(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    *y = rt.stream().clone_dtod(x)?;
    Ok(())
}

#[gpu_test]
fn a_body_that_replaces_its_output_is_refused(rt: Runtime) -> Result<(), GraphError> {
    let err = ReplacesOutputGraph::capture(&rt, &vec![1.0f32; 64], 64).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::StateMoved {
                param: "y",
                when: When::Warmup { run: 1 },
                ..
            }
        ),
        "{err:?}"
    );
    usable(&rt)
}

/// Counts its calls and accumulates its input into `acc`: both `&mut` state.
#[cuda_graph(warmup = 3)]
fn counted(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] calls: &mut CudaSlice<u32>,
    #[state] acc: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let (a, c) = (rt.function(SRC, "accumulate")?, rt.function(SRC, "count")?);
    // SAFETY: `accumulate` reads `n` floats of `x` and updates `n` of `acc`; `count` writes
    // one word.
    unsafe {
        rt.stream()
            .launch_builder(&a)
            .arg(x)
            .arg(&mut *acc)
            .arg(&n)
            .launch(grid(x.len()))?;
        rt.stream()
            .launch_builder(&c)
            .arg(&mut *calls)
            .launch(grid(1))?;
    }
    Ok(())
}

/// The same, with the accumulator opted out of the restore.
#[cuda_graph(warmup = 3)]
fn counted_keep(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] calls: &mut CudaSlice<u32>,
    #[state(no_restore)] acc: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    counted(rt, x, calls, acc)
}

#[gpu_test]
fn warmup_leaves_mut_state_as_it_found_it(rt: Runtime) -> Result<(), GraphError> {
    let test = "warmup_leaves_mut_state_as_it_found_it";
    let mut rng = fresh_rng(test);
    let n = 1000;
    let s = rt.stream().clone();
    let start = random_vec(&mut rng, n);
    let (mut g_calls, mut g_acc) = (s.clone_htod(&[5u32])?, s.clone_htod(&start)?);
    let (mut e_calls, mut e_acc) = (s.clone_htod(&[5u32])?, s.clone_htod(&start)?);
    let xs: Vec<Vec<f32>> = (0..6).map(|_| random_vec(&mut rng, n)).collect();

    let mut graph = CountedGraph::capture(&rt, &xs[0], &mut g_calls, &mut g_acc)?;
    assert_eq!(graph.info().state_snapshot_bytes, 4 + 4 * n);
    {
        let st = graph.state_mut();
        assert_eq!(s.clone_dtoh(&st.calls)?, vec![5], "warmup undone: counter");
        assert_eq!(
            s.clone_dtoh(&st.acc)?,
            start,
            "warmup undone: accumulator, bitwise"
        );
    }
    for x in &xs {
        graph.replay(x)?;
        let xd = s.clone_htod(x)?;
        counted(&rt, &xd, &mut e_calls, &mut e_acc)?;
    }
    let st = graph.state_mut();
    assert_eq!(s.clone_dtoh(&st.calls)?, s.clone_dtoh(&e_calls)?);
    assert_eq!(
        s.clone_dtoh(&st.acc)?,
        s.clone_dtoh(&e_acc)?,
        "N replays = N eager calls"
    );
    drop(graph);

    // Opted out: the warmup's three calls stay in the accumulator.
    let (mut k_calls, mut k_acc) = (s.clone_htod(&[0u32])?, s.alloc_zeros::<f32>(n)?);
    let ones = vec![1.0f32; n];
    let mut keep = CountedKeepGraph::capture(&rt, &ones, &mut k_calls, &mut k_acc)?;
    assert_eq!(keep.info().state_snapshot_bytes, 4);
    let st = keep.state_mut();
    assert_eq!(s.clone_dtoh(&st.calls)?, vec![0]);
    assert_eq!(s.clone_dtoh(&st.acc)?, vec![3.0f32; n]);
    Ok(())
}

static PANIC_ON_RUN: AtomicU32 = AtomicU32::new(0);
static RUNS: AtomicU32 = AtomicU32::new(0);

/// Draws from the runtime's generator, updates `&mut` state, then fails on one warmup run:
/// by panicking or by returning an error. Which run fails is host state that only the
/// warmup runs and the capture see (hence the opt-in).
#[cuda_graph(warmup = 3, host_effects_not_replayed)]
fn fails_in_warmup(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] calls: &mut CudaSlice<u32>,
    noise: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.rng().uniform(rt, noise, 0.0, 1.0)?;
    let c = rt.function(SRC, "count")?;
    // SAFETY: `count` writes one word of `calls`.
    unsafe {
        rt.stream()
            .launch_builder(&c)
            .arg(&mut *calls)
            .launch(grid(1))?
    };
    let _ = x;
    let run = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
    let mode = PANIC_ON_RUN.load(Ordering::SeqCst);
    if run == 2 && mode == 1 {
        panic!("planted panic in warmup run 2");
    }
    if run == 2 && mode == 2 {
        return Err(GraphError::User("planted error in warmup run 2".into()));
    }
    Ok(())
}

#[gpu_test]
fn a_panic_and_an_error_in_warmup_restore_the_same_state(rt: Runtime) -> Result<(), GraphError> {
    let s = rt.stream().clone();
    let x = s.alloc_zeros::<f32>(500)?;
    let mut calls = s.clone_htod(&[10u32])?;
    let before_rng = rt.rng().seed_and_offset(&rt)?;
    for (mode, what) in [(1, "panic"), (2, "error")] {
        PANIC_ON_RUN.store(mode, Ordering::SeqCst);
        RUNS.store(0, Ordering::SeqCst);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            FailsInWarmupGraph::capture(&rt, &x, &mut calls, 500).map(|_| ())
        }));
        match (mode, outcome) {
            (1, Err(_)) => {}
            (2, Ok(Err(e))) => assert!(e.to_string().contains("planted error"), "{e}"),
            (_, other) => panic!("{what}: unexpected outcome {:?}", other.map(|r| r.err())),
        }
        assert_eq!(
            rt.rng().seed_and_offset(&rt)?,
            before_rng,
            "{what} in warmup: the generator is where it was"
        );
        assert_eq!(
            s.clone_dtoh(&calls)?,
            vec![10],
            "{what}: the state is where it was"
        );
        usable(&rt)?;
    }
    PANIC_ON_RUN.store(0, Ordering::SeqCst);
    let mut graph = FailsInWarmupGraph::capture(&rt, &x, &mut calls, 500)?;
    graph.replay(&x)?;
    Ok(())
}

/// Draws from the runtime's default generator: the case that crashed when the runtime was
/// dropped before the graph.
#[cuda_graph(warmup = 1)]
fn draws(rt: &Runtime, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let _ = x;
    rt.rng().normal(rt, y, 0.0, 1.0)?;
    Ok(())
}

#[gpu_test]
fn a_graph_keeps_its_runtime_alive(rt: Runtime) -> Result<(), GraphError> {
    let x = rt.stream().alloc_zeros::<f32>(16)?;
    let mut graph = DrawsGraph::capture(&rt, &x, 4096)?;
    let stream = rt.stream().clone();
    drop(x);
    drop(rt); // the user's last handle
    let a = stream.clone_dtoh(graph.replay(&[0.0f32; 16])?.y)?;
    let b = stream.clone_dtoh(graph.replay(&[0.0f32; 16])?.y)?;
    assert_ne!(
        a, b,
        "fresh numbers on every replay, after the handle was dropped"
    );
    let mean = a.iter().sum::<f32>() / a.len() as f32;
    assert!(mean.abs() < 0.1, "normal draws: mean {mean}");
    Ok(())
}

/// The side branch reads `x` slowly while the runtime's stream goes on; `x` is a buffer of
/// the caller, freed right after the join, and the next allocation of its size is written
/// at once. Before the borrow-checked fork, `x` could be freed inside the closure and its
/// memory reused while the side kernel still read it.
#[cuda_graph(warmup = 2)]
fn side_reads(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    z: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let f = rt.function(SRC, "slow_copy")?;
    rt.fork(|side| {
        let tmp = side.scratch::<f32>(x.len())?;
        // SAFETY: `slow_copy` reads `n` floats of its first buffer and writes `n` of its
        // second; both handles hold `n`.
        unsafe {
            side.launch_builder(&f)
                .buf(side.read(x))
                .buf_mut(tmp)
                .arg(n)
                .arg(2000i32)
                .launch(grid(x.len()))?;
            side.launch_builder(&f)
                .buf(tmp)
                .buf_mut(side.write(y))
                .arg(n)
                .arg(0i32)
                .launch(grid(x.len()))?;
        }
        rt.stream().memcpy_dtod(x, z)?; // concurrently on the runtime's stream
        Ok(())
    })
}

#[gpu_test]
fn buffers_read_by_a_fork_outlive_the_join(rt: Runtime) -> Result<(), GraphError> {
    let test = "buffers_read_by_a_fork_outlive_the_join";
    let mut rng = fresh_rng(test);
    let n = 65_536;
    let s = rt.stream().clone();
    for round in 0..3 {
        // Eagerly: `x` is dropped right after the fork and its memory handed out again.
        let host = random_vec(&mut rng, n);
        let (mut y, mut z) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
        {
            let x = s.clone_htod(&host)?;
            side_reads(&rt, &x, &mut y, &mut z)?;
        }
        let reuse = s.clone_htod(&vec![-1.0f32; n])?;
        assert_eq!(s.clone_dtoh(&y)?, host, "round {round}: eager side branch");
        assert_eq!(s.clone_dtoh(&z)?, host, "round {round}: eager main branch");
        drop(reuse);
    }
    let mut graph = SideReadsGraph::capture(&rt, &random_vec(&mut rng, n), n, n)?;
    for replay in 0..4 {
        let host = random_vec(&mut rng, n);
        let out = graph.replay(&host)?;
        assert_eq!(s.clone_dtoh(out.y)?, host, "replay {replay}: side branch");
        assert_eq!(s.clone_dtoh(out.z)?, host, "replay {replay}: main branch");
    }
    Ok(())
}

/// Allocates nothing eagerly, but `bytes` of temporaries while captured.
#[cuda_graph(warmup = 1)]
fn big_when_captured(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[constant] bytes: usize,
    #[constant] parts: usize,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    if is_capturing() {
        // `parts` temporaries alive at once, each `bytes / parts`.
        let mut held = Vec::new();
        for _ in 0..parts {
            let mut t = s.alloc_zeros::<u8>(bytes / parts)?;
            s.memset_zeros(&mut t)?;
            held.push(t);
        }
        drop(held);
    }
    s.memcpy_dtod(x, y)?;
    Ok(())
}

#[gpu_test]
fn out_of_memory_at_capture_gives_every_byte_back(rt: Runtime) -> Result<(), GraphError> {
    let s = rt.stream().clone();
    let x = s.clone_htod(&[1.0f32; 256])?;
    // Settle the runtime's own allocations (kernels, cuBLAS, the default generator).
    let mut warm = BigWhenCapturedGraph::capture(&rt, &x, 1 << 20, 1, 256)?;
    warm.replay(&x)?;
    drop(warm);
    rt.synchronize()?;
    rt.trim_graph_memory()?;
    let (free_before, total) = rt.mem_info()?;

    // One temporary larger than the device: refused before the driver maps anything.
    let err = BigWhenCapturedGraph::capture(&rt, &x, total + (1 << 30), 1, 256).unwrap_err();
    match &err {
        GraphError::OutOfMemory {
            requested_bytes, ..
        } => assert_eq!(*requested_bytes, Some(total + (1 << 30)), "{err}"),
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // Three temporaries alive at once, each fits, together they do not. The driver would
    // fail the upload and keep the memory (seen on an H100): refused before it tries.
    let each = free_before / 5 * 2;
    let err = BigWhenCapturedGraph::capture(&rt, &x, each * 3, 3, 256).unwrap_err();
    assert!(err.is_out_of_memory(), "{err:?}");
    assert!(
        err.requested_bytes().is_some_and(|r| r >= each * 3),
        "the sum of the temporaries: {err}"
    );
    assert!(err.to_string().contains("big_when_captured"), "{err}");

    rt.synchronize()?;
    let (free_after, _) = rt.mem_info()?;
    let lost = free_before.saturating_sub(free_after);
    assert!(
        lost <= 1 << 20,
        "free memory back within 1 MiB: before {free_before}, after {free_after}, pool {:?}",
        rt.graph_memory()?
    );
    // And the next capture in the same runtime works.
    let mut graph = BigWhenCapturedGraph::capture(&rt, &x, 1 << 20, 1, 256)?;
    assert_eq!(s.clone_dtoh(graph.replay(&x)?.y)?, vec![1.0f32; 256]);
    usable(&rt)
}

/// The body's own eager allocation does not fit.
#[cuda_graph(warmup = 1)]
fn too_big_eagerly(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[constant] bytes: usize,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let t = rt.stream().alloc_zeros::<u8>(bytes)?;
    drop(t);
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[gpu_test]
fn out_of_memory_in_warmup_names_the_size(rt: Runtime) -> Result<(), GraphError> {
    let x = rt.stream().clone_htod(&[1.0f32; 64])?;
    let (_, total) = rt.mem_info()?;
    let bytes = total + (3 << 30);
    let err = TooBigEagerlyGraph::capture(&rt, &x, bytes, 64).unwrap_err();
    match &err {
        GraphError::OutOfMemory {
            during,
            requested_bytes,
            ..
        } => {
            assert!(
                during.contains("warmup run 1 of `too_big_eagerly`"),
                "{err}"
            );
            assert_eq!(*requested_bytes, Some(bytes), "{err}");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    usable(&rt)
}

/// Owned and shared state: a graph that can live in a struct of the user's.
struct Engine {
    graph: ScaledGraph<'static>,
}

#[gpu_test]
fn an_owning_graph_lives_in_a_struct(rt: Runtime) -> Result<(), GraphError> {
    let test = "an_owning_graph_lives_in_a_struct";
    let mut rng = fresh_rng(test);
    let n = 777;
    let s = rt.stream().clone();
    let w = random_vec(&mut rng, n);
    let mut engine = Engine {
        graph: ScaledGraph::capture(&rt, &random_vec(&mut rng, n), model(&rt, &w)?, n)?,
    };
    let wd = s.clone_htod(&w)?;
    for _ in 0..3 {
        let x = random_vec(&mut rng, n);
        let got = s.clone_dtoh(engine.graph.replay(&x)?.y)?;
        let want: Vec<f32> = x.iter().zip(&w).map(|(x, w)| 2.0 * x + w).collect();
        assert_eq!(got, want);
    }
    assert_eq!(
        s.clone_dtoh(&engine.graph.state_mut().model.counter)?,
        vec![3]
    );
    // Read-only state shared through an `Arc` with the rest of the program.
    let shared = Arc::new(wd);
    let mut reader = DrawsFromGraph::capture(&rt, &x_of(&rt, n)?, shared.clone(), n)?;
    let got = s.clone_dtoh(reader.replay(&vec![1.0f32; n])?.y)?;
    let want: Vec<f32> = w.iter().map(|w| 2.0 + w).collect();
    assert_eq!(got, want);
    assert_eq!(
        Arc::strong_count(&shared),
        2,
        "the graph holds one reference"
    );
    Ok(())
}

/// `y = 2x + w` with `w` read-only state.
#[cuda_graph(warmup = 1)]
fn draws_from(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let f = rt.function(SRC, "scale")?;
    // SAFETY: reads `n` floats of `x` and `w`, writes `n` of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(w)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(x.len()))?;
    }
    Ok(())
}

fn x_of(rt: &Runtime, n: usize) -> Result<CudaSlice<f32>, GraphError> {
    Ok(rt.stream().alloc_zeros::<f32>(n)?)
}

fn usable(rt: &Runtime) -> Result<(), GraphError> {
    let y = rt.stream().clone_htod(&[1.0f32, 2.0])?;
    assert_eq!(rt.stream().clone_dtoh(&y)?, vec![1.0, 2.0]);
    rt.synchronize()
}

/// State that launches a kernel it holds itself: the function is part of the state.
#[derive(DeviceState)]
struct Launcher {
    f: CudaFunction,
    w: CudaSlice<f32>,
}

/// `y = 2x + w` through the state's own function.
#[cuda_graph(warmup = 1)]
fn through_held_function(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] l: &mut Launcher,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let mut b = rt.stream().launch_builder(&l.f);
    b.arg(x).arg(&l.w).arg(y).arg(&n);
    // SAFETY: `scale` reads `n` elements of `x` and `w` and writes `n` of `y`.
    unsafe { b.launch(grid(x.len())) }?;
    Ok(())
}

#[gpu_test]
fn a_function_replaced_inside_state_is_refused(rt: Runtime) -> Result<(), GraphError> {
    let test = "a_function_replaced_inside_state_is_refused";
    let mut rng = fresh_rng(test);
    let n = 512;
    let s = rt.stream().clone();
    let w = s.clone_htod(&random_vec(&mut rng, n))?;
    let mut l = Launcher {
        f: rt.function(SRC, "scale")?,
        w,
    };
    let x = random_vec(&mut rng, n);
    let mut graph = ThroughHeldFunctionGraph::capture(&rt, &x, &mut l, n)?;
    let mut eager = s.alloc_zeros::<f32>(n)?;
    let x_dev = s.clone_htod(&x)?;
    through_held_function(&rt, &x_dev, graph.state_mut().l, &mut eager)?;
    assert_eq!(s.clone_dtoh(graph.replay(&x)?.y)?, s.clone_dtoh(&eager)?);

    // The careless part: another kernel put in place of the one the graph launches.
    graph.state_mut().l.f = rt.function(SRC, "accumulate")?;
    let err = graph.replay(&x).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, GraphError::StateMoved { param: "l", .. }) && msg.contains("CUDA handle"),
        "{msg}"
    );
    usable(&rt)
}

/// `y = x` slowly: a replay that is still running when the host moves on.
#[cuda_graph(warmup = 1)]
fn slow_read(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &mut CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] spin: i32,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let f = rt.function(SRC, "slow_copy")?;
    let mut b = rt.stream().launch_builder(&f);
    b.arg(&*w).arg(y).arg(&n).arg(&spin);
    // SAFETY: `slow_copy` reads `n` elements of `w` and writes `n` of `y`.
    unsafe { b.launch(grid(x.len())) }?;
    Ok(())
}

/// Whether a replay of `graph` was still running right before and right after `state_mut()`.
fn running_around_state_mut(
    rt: &Runtime,
    graph: &mut SlowReadGraph<'_>,
    x: &[f32],
) -> Result<(bool, bool), GraphError> {
    graph.replay(x)?;
    let done = rt.stream().record_event(None)?;
    let before = !done.try_is_complete()?;
    let _lent = graph.state_mut();
    Ok((before, !done.try_is_complete()?))
}

#[gpu_test]
fn state_of_another_stream_is_lent_only_after_the_replays(rt: Runtime) -> Result<(), GraphError> {
    let n = 256;
    let spin = 20_000_000; // tens of milliseconds per replay
    let x = vec![1.0f32; n];

    // State on the runtime's stream: its frees are ordered after the replays; no waiting.
    let mut own = rt.stream().clone_htod(&vec![2.0f32; n])?;
    let mut graph = SlowReadGraph::capture(&rt, &x, &mut own, n, spin)?;
    // (Under a tool that serialises kernels the replay may be over before `state_mut()`: then
    // this says nothing, and only the second half below is checked.)
    let (before, after) = running_around_state_mut(&rt, &mut graph, &x)?;
    assert!(
        !before || after,
        "state of the runtime's stream is lent at once"
    );
    drop(graph);

    // State on another stream: replacing or dropping it would free it on that stream, under
    // the replay; so the graph waits before it lends it.
    let other = rt.context().new_stream()?;
    let mut foreign = other.clone_htod(&vec![3.0f32; n])?;
    other.synchronize()?;
    let mut graph = SlowReadGraph::capture(&rt, &x, &mut foreign, n, spin)?;
    let (before, after) = running_around_state_mut(&rt, &mut graph, &x)?;
    if before {
        assert!(
            !after,
            "state of another stream is lent only after the replay finished"
        );
    } else {
        eprintln!("the replay was over before state_mut(): the wait cannot be seen here");
    }
    // Dropping the graph waits the same way, so the state can be freed right after it.
    graph.replay(&x)?;
    let done = rt.stream().record_event(None)?;
    let running = !done.try_is_complete()?;
    drop(graph);
    if running {
        assert!(
            done.try_is_complete()?,
            "dropping the graph waits for its replays before its state can be freed"
        );
    }
    drop(foreign);
    usable(&rt)
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
