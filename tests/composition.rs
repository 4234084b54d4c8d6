//! Features together, written the way users combine them, each against eager execution on
//! fresh random inputs over several replays (see CONTRIBUTING.md, "Features that compose"):
//!
//! * an eager island that replaces a buffer of `#[derive(DeviceState)]` state: refused before
//!   the segment after it launches, on that same replay;
//! * a body that calls another `#[cuda_graph]` function with an island: refused at capture,
//!   and both functions still work as graphs of their own and eagerly;
//! * two graphs with temporaries, one dropped: the other keeps its pool memory;
//! * random draws in the steps of `graph_while_unrolled`: bit for bit what `graph_while`
//!   draws, the generator left at the same offset;
//! * a body that spins on an event query: the watchdog names the graph within about a second;
//! * a nearly full device: a graph whose temporaries cannot be mapped is refused before the
//!   driver tries, the free memory is back afterwards, and smaller graphs still capture;
//! * cuBLAS GEMMs in a body checked for determinism (the default of debug builds): library
//!   kernels' host-address arguments do not fail the check;
//! * memory a graph addresses but does not hold (a workspace in a `skip` field), replaced
//!   between replays: the next replay is refused before anything launches, and a new capture works.
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead.

use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use graph_runtime::cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, LaunchConfig, PushKernelArg,
};
use graph_runtime::{
    cuda_graph, is_capturing, Compare, Condition, DeviceState, Generator, GraphError, Runtime, When,
};
use workloads::ops::blas::{matmul, MatMul};
use workloads::testing::{fresh_rng, gpu_test, logged_errors, random_vec};

const MIB: usize = 1 << 20;

const K: &str = concat!(
    graph_runtime::condition_device_api!(),
    r#"
extern "C" __global__ void affine(const float *x, float a, float b, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
extern "C" __global__ void add_inplace(float *y, const float *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[i];
}
extern "C" __global__ void tanh_inplace(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(y[i]);
}
extern "C" __global__ void halve_count_guarded(float *y, int n, unsigned int *iters, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] *= 0.5f;
    if (blockIdx.x == 0 && threadIdx.x == 0) iters[0] += 1u;
}
extern "C" __global__ void add_noise_guarded(float *y, const float *noise, int n, GraphCondition go) {
    if (!graph_condition_active(go)) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += 1e-3f * noise[i];
}
"#
);

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// `y = a · x + b` on the runtime's stream.
fn affine(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    a: f32,
    b: f32,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let f = rt.function(K, "affine")?;
    // SAFETY: `affine` reads `n` floats of `x` and writes `n` of `y`; both hold `n`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&a)
            .arg(&b)
            .arg(y)
            .arg(&n)
            .launch(grid(x.len()))?;
    }
    Ok(())
}

/// `y += b` on the runtime's stream.
fn add_inplace(rt: &Runtime, y: &mut CudaSlice<f32>, b: &CudaSlice<f32>) -> Result<(), GraphError> {
    assert_eq!(y.len(), b.len());
    let len = y.len();
    let n = len as i32;
    let f = rt.function(K, "add_inplace")?;
    // SAFETY: `add_inplace` reads and writes `n` floats of `y` and reads `n` of `b`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *y)
            .arg(b)
            .arg(&n)
            .launch(grid(len))?;
    }
    Ok(())
}

/// `y = tanh(y)` on the runtime's stream.
fn tanh_inplace(rt: &Runtime, y: &mut CudaSlice<f32>) -> Result<(), GraphError> {
    let len = y.len();
    let n = len as i32;
    let f = rt.function(K, "tanh_inplace")?;
    // SAFETY: `tanh_inplace` reads and writes `n` floats of `y`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(&mut *y)
            .arg(&n)
            .launch(grid(len))?;
    }
    Ok(())
}

// ---- An island that replaces a buffer of derived state ----

/// A bias the graph reads by address, in a struct the macro cannot see into.
#[derive(DeviceState)]
struct Bias {
    b: CudaSlice<f32>,
}

/// `y = 2x + 0.5`, an island (which, when told to, swaps the bias for a new buffer, as a
/// careless user would), then `y += bias`.
#[cuda_graph(warmup = 2)]
fn biased(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] m: &mut Bias,
    #[island] swap: &mut bool,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    affine(rt, x, 2.0, 0.5, y)?;
    rt.eager(|| {
        if *swap {
            m.b = rt.stream().clone_htod(&vec![7.0f32; m.b.len()])?;
        }
        Ok(())
    })?;
    add_inplace(rt, y, &m.b)
}

#[gpu_test]
fn an_island_that_replaces_state_is_refused_before_the_next_segment(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("an_island_that_replaces_state_is_refused_before_the_next_segment");
    let n = 1000;
    let s = rt.stream().clone();
    let bias = random_vec(&mut rng, n);
    let mut model = Bias {
        b: s.clone_htod(&bias)?,
    };
    let mut graph = BiasedGraph::capture(&rt, &random_vec(&mut rng, n), &mut model, false, n)?;
    let mut eager_model = Bias {
        b: s.clone_htod(&bias)?,
    };
    let mut ey = s.alloc_zeros::<f32>(n)?;
    for replay in 0..4 {
        let x = random_vec(&mut rng, n);
        let gy = s.clone_dtoh(graph.replay(&x)?.y)?;
        biased(
            &rt,
            &s.clone_htod(&x)?,
            &mut eager_model,
            &mut false,
            &mut ey,
        )?;
        assert_eq!(gy, s.clone_dtoh(&ey)?, "replay {replay}: graph vs eager");
    }
    // The island swaps the buffer on this replay: the segment after it would read the old,
    // freed one. Refused on this same replay, naming the island.
    *graph.state_mut().swap = true;
    let err = graph.replay(&random_vec(&mut rng, n)).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::StateMoved {
                when: When::Island { island: 1 },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("island 1"), "{err}");
    // The graph stays refused (its state no longer holds the captured buffer) ...
    *graph.state_mut().swap = false;
    let again = graph.replay(&random_vec(&mut rng, n)).unwrap_err();
    assert!(
        matches!(
            again,
            GraphError::StateMoved {
                when: When::Replay,
                ..
            }
        ),
        "{again:?}"
    );
    drop(graph);
    // ... and the runtime is usable: a new graph on the new state equals eager.
    s.memcpy_dtod(&model.b, &mut eager_model.b)?;
    let mut graph = BiasedGraph::capture(&rt, &random_vec(&mut rng, n), &mut model, false, n)?;
    for replay in 0..3 {
        let x = random_vec(&mut rng, n);
        let gy = s.clone_dtoh(graph.replay(&x)?.y)?;
        biased(
            &rt,
            &s.clone_htod(&x)?,
            &mut eager_model,
            &mut false,
            &mut ey,
        )?;
        assert_eq!(gy, s.clone_dtoh(&ey)?, "after: replay {replay}");
    }
    Ok(())
}

// ---- A graph function with an island called from another graph's body ----

/// `y = 3x + 1`, an island (a host step), then `y += x`.
#[cuda_graph(warmup = 1)]
fn inner_with_island(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    affine(rt, x, 3.0, 1.0, y)?;
    rt.eager(|| Ok(()))?;
    add_inplace(rt, y, x)
}

/// Calls `inner_with_island`, then `y = tanh(y)`.
#[cuda_graph(warmup = 1)]
fn outer_calls_inner(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    inner_with_island(rt, x, y)?;
    tanh_inplace(rt, y)
}

#[gpu_test]
fn a_called_graph_function_with_an_island_is_refused_at_capture(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("a_called_graph_function_with_an_island_is_refused_at_capture");
    let n = 777;
    let s = rt.stream().clone();
    let err = OuterCallsInnerGraph::capture(&rt, &random_vec(&mut rng, n), n).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            GraphError::IslandMisuse {
                graph: "outer_calls_inner",
                ..
            }
        ) && text.contains("another `#[cuda_graph]` function"),
        "{err:?}"
    );
    // Both functions still work: the inner one as a graph, the outer one eagerly, and the
    // two inner graph replays plus a tanh give what the outer function gives.
    let mut inner = InnerWithIslandGraph::capture(&rt, &random_vec(&mut rng, n), n)?;
    let (mut ey, mut iy) = (s.alloc_zeros::<f32>(n)?, s.alloc_zeros::<f32>(n)?);
    for replay in 0..4 {
        let x = random_vec(&mut rng, n);
        let dx = s.clone_htod(&x)?;
        let gy = s.clone_dtoh(inner.replay(&x)?.y)?;
        inner_with_island(&rt, &dx, &mut iy)?;
        assert_eq!(
            gy,
            s.clone_dtoh(&iy)?,
            "replay {replay}: inner graph vs eager"
        );
        outer_calls_inner(&rt, &dx, &mut ey)?;
        let expected: Vec<f32> = s.clone_dtoh(&ey)?;
        let mut composed = s.clone_htod(&gy)?;
        tanh_inplace(&rt, &mut composed)?;
        assert_eq!(
            s.clone_dtoh(&composed)?,
            expected,
            "replay {replay}: composed"
        );
    }
    Ok(())
}

// ---- Graphs dropped in any order keep each other's pool memory ----

/// `y = x + 1` through a temporary of `temp_mib` MiB.
#[cuda_graph(warmup = 1)]
fn with_temp(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] temp_mib: usize,
) -> Result<(), GraphError> {
    let n = x.len();
    let mut tmp = rt
        .stream()
        .alloc_zeros::<f32>((temp_mib * MIB / 4).max(n))?;
    affine(rt, x, 1.0, 1.0, &mut tmp)?;
    rt.stream().memcpy_dtod(&tmp.slice(0..n), y)?;
    Ok(())
}

#[gpu_test]
fn dropping_one_graph_keeps_the_pool_memory_of_another(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("dropping_one_graph_keeps_the_pool_memory_of_another");
    let n = 4096;
    let s = rt.stream().clone();
    let mut a = WithTempGraph::capture(&rt, &random_vec(&mut rng, n), n, 64)?;
    let mut b = WithTempGraph::capture(&rt, &random_vec(&mut rng, n), n, 96)?;
    a.replay(&random_vec(&mut rng, n))?;
    b.replay(&random_vec(&mut rng, n))?;
    let need = b.info().temp_bytes;
    assert!(need >= 96 * MIB, "{:?}", b.info());
    drop(a);
    rt.synchronize()?;
    let kept = rt.graph_memory()?.reserved;
    assert!(
        kept >= need,
        "after dropping graph A the pool holds {kept} bytes, graph B needs {need}"
    );
    // A trim asked for by hand keeps it too while B lives.
    assert!(
        !rt.trim_graph_memory()?,
        "no trim while a graph with temporaries lives"
    );
    let mut ey = s.alloc_zeros::<f32>(n)?;
    for replay in 0..5 {
        let x = random_vec(&mut rng, n);
        let gy = s.clone_dtoh(b.replay(&x)?.y)?;
        with_temp(&rt, &s.clone_htod(&x)?, &mut ey, 96)?;
        assert_eq!(gy, s.clone_dtoh(&ey)?, "replay {replay}: graph B vs eager");
        let now = rt.graph_memory()?.reserved;
        assert!(
            now >= need,
            "replay {replay}: the pool holds {now} bytes, B needs {need}"
        );
    }
    drop(b);
    rt.synchronize()?;
    let after = rt.graph_memory()?.reserved;
    assert!(
        after < need,
        "the last graph with temporaries gave the pool back: {after} bytes left"
    );
    Ok(())
}

// ---- Random draws in the steps of an unrolled loop ----

/// One step of the noisy halving loop of `noisy_plain` and `noisy_unrolled`: a draw into
/// `noise`, the guarded halving of `y` (counted in `iters`) with a little of the noise added,
/// and the condition set for the next test.
fn noisy_step(
    rt: &Runtime,
    g: &Generator,
    go: &Condition,
    (halve, add): (&CudaFunction, &CudaFunction),
    y: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
) -> Result<(), GraphError> {
    let n = y.len() as i32;
    let arg = go.kernel_arg(rt);
    g.uniform(rt, &mut *noise, 0.0, 1.0)?;
    // SAFETY: both kernels read and write `n` floats of `y` (and `noise`, one word of
    // `iters`), all of which hold `n`, and read `go`.
    unsafe {
        rt.stream()
            .launch_builder(halve)
            .arg(&mut *y)
            .arg(&n)
            .arg(&mut *iters)
            .arg(&arg)
            .launch(grid(n as usize))?;
        rt.stream()
            .launch_builder(add)
            .arg(&mut *y)
            .arg(&*noise)
            .arg(&n)
            .arg(&arg)
            .launch(grid(n as usize))?;
    }
    go.set_from(rt, &*y, Compare::Gt, 1.0)
}

/// Halves `y` while `y[0] > 1`; each step draws `noise` from `g` and adds a little of it to
/// `y`; after the loop, one more draw into `after` (which shows where the generator is).
#[cuda_graph(warmup = 2)]
fn noisy_plain(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] g: &Generator,
    y: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    after: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let (halve, add) = (
        rt.function(K, "halve_count_guarded")?,
        rt.function(K, "add_noise_guarded")?,
    );
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while(&go, Some(1000), |rt| {
        noisy_step(rt, g, &go, (&halve, &add), y, noise, iters)
    })?;
    g.uniform(rt, after, 0.0, 1.0)
}

/// `noisy_plain` with `unroll` steps per iteration of the loop node.
#[allow(clippy::too_many_arguments)]
#[cuda_graph(warmup = 2)]
fn noisy_unrolled(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] g: &Generator,
    y: &mut CudaSlice<f32>,
    noise: &mut CudaSlice<f32>,
    after: &mut CudaSlice<f32>,
    iters: &mut CudaSlice<u32>,
    #[constant] unroll: u32,
) -> Result<(), GraphError> {
    let s = rt.stream();
    let (halve, add) = (
        rt.function(K, "halve_count_guarded")?,
        rt.function(K, "add_noise_guarded")?,
    );
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while_unrolled(&go, Some(1000), unroll, |rt| {
        noisy_step(rt, g, &go, (&halve, &add), y, noise, iters)
    })?;
    g.uniform(rt, after, 0.0, 1.0)
}

#[gpu_test]
fn random_draws_in_unrolled_steps_match_graph_while(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("random_draws_in_unrolled_steps_match_graph_while");
    let n = 1000;
    let s = rt.stream().clone();
    let input = |rng: &mut rand::rngs::SmallRng| {
        let mut x = random_vec(rng, n);
        // 1 to ~17 iterations (at least one, so that every run writes `noise`).
        x[0] = rng.random_range(0.5f32..11.5).exp();
        x
    };
    for unroll in [3u32, 4, 8] {
        let (gp, gu, ge) = (rt.generator(5)?, rt.generator(5)?, rt.generator(5)?);
        let mut plain = NoisyPlainGraph::capture(&rt, &input(&mut rng), &gp, n, n, n, 1)?;
        let mut unrolled =
            NoisyUnrolledGraph::capture(&rt, &input(&mut rng), &gu, n, n, n, 1, unroll)?;
        let (mut ey, mut en, mut ea, mut ei) = (
            s.alloc_zeros::<f32>(n)?,
            s.alloc_zeros::<f32>(n)?,
            s.alloc_zeros::<f32>(n)?,
            s.alloc_zeros::<u32>(1)?,
        );
        let mut trips = Vec::new();
        for replay in 0..6 {
            let x = input(&mut rng);
            let p = plain.replay(&x)?;
            let (py, pa, pi) = (
                s.clone_dtoh(p.y)?,
                s.clone_dtoh(p.after)?,
                s.clone_dtoh(p.iters)?[0],
            );
            let u = unrolled.replay(&x)?;
            let (uy, ua, ui) = (
                s.clone_dtoh(u.y)?,
                s.clone_dtoh(u.after)?,
                s.clone_dtoh(u.iters)?[0],
            );
            noisy_unrolled(
                &rt,
                &s.clone_htod(&x)?,
                &ge,
                &mut ey,
                &mut en,
                &mut ea,
                &mut ei,
                unroll,
            )?;
            let at = format!("unroll {unroll}, replay {replay}, {pi} iterations");
            assert_eq!(ui, pi, "{at}: iterations");
            assert_eq!(uy, py, "{at}: y, unrolled vs plain, bitwise");
            assert_eq!(ua, pa, "{at}: the draw after the loop, unrolled vs plain");
            assert_eq!(s.clone_dtoh(&ey)?, py, "{at}: eager vs plain graph");
            assert_eq!(s.clone_dtoh(&ea)?, pa, "{at}: eager's draw after the loop");
            assert_eq!(
                gu.seed_and_offset(&rt)?,
                gp.seed_and_offset(&rt)?,
                "{at}: generator offsets"
            );
            assert_eq!(gp.seed_and_offset(&rt)?, ge.seed_and_offset(&rt)?, "{at}");
            trips.push(pi);
        }
        assert!(
            trips.iter().any(|t| t % unroll != 0),
            "unroll {unroll}: a trip count not a multiple of it: {trips:?}"
        );
    }
    Ok(())
}

// ---- A body that spins on a query ----

/// The user's own wrapper around an event: the macro cannot see that `done` is a query.
struct Fence(CudaEvent);

impl Fence {
    fn done(&self) -> bool {
        self.0.is_complete()
    }
}

thread_local! {
    static FENCE: std::cell::RefCell<Option<Fence>> = const { std::cell::RefCell::new(None) };
}

/// Spins until the thread's fence is done, for at most 5 s, or until the library has logged
/// an error that names `graph` (then it gives up at once): returns how long it spun, and
/// whether the fence was done.
fn spin_on_fence(graph: &str) -> (Duration, bool) {
    let started = Instant::now();
    FENCE.with(|f| {
        let f = f.borrow();
        let fence = f.as_ref().expect("the test set the fence");
        loop {
            if fence.done() {
                return (started.elapsed(), true);
            }
            if started.elapsed() > Duration::from_secs(5)
                || logged_errors().iter().any(|e| e.contains(graph))
            {
                return (started.elapsed(), false);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// `y = x`, after waiting for a fence (spinning on its query).
#[cuda_graph(warmup = 1, check_determinism = false)]
fn waits_on_a_fence(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let (spun, done) = spin_on_fence("waits_on_a_fence");
    if !done {
        return Err(GraphError::User(
            format!("gave up on the fence after {spun:?}").into(),
        ));
    }
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[gpu_test]
fn a_spin_on_a_query_in_the_body_is_reported_within_a_second(
    rt: Runtime,
) -> Result<(), GraphError> {
    let n = 256;
    let s = rt.stream().clone();
    let event = rt.context().new_event(None)?;
    event.record(&s)?;
    s.synchronize()?;
    FENCE.with(|f| *f.borrow_mut() = Some(Fence(event)));
    let started = Instant::now();
    let err = WaitsOnAFenceGraph::capture(&rt, &vec![1.0f32; n], n).unwrap_err();
    let took = started.elapsed();
    let reports: Vec<String> = logged_errors()
        .into_iter()
        .filter(|e| e.contains("graph_runtime::watchdog") && e.contains("waits_on_a_fence"))
        .collect();
    assert_eq!(reports.len(), 1, "one report: {reports:?} ({err})");
    assert!(
        reports[0].contains("invalidated") && reports[0].contains("query"),
        "{}",
        reports[0]
    );
    // The watchdog looks after 1 s, every 100 ms; the body saw the report and returned.
    assert!(
        took < Duration::from_millis(2500),
        "the report came {took:?} after the capture began"
    );
    assert!(err.to_string().contains("gave up"), "{err}");
    // The runtime is usable: the same body, with the fence done, captures outside any spin.
    let mut graph = WithTempGraph::capture(&rt, &vec![1.0f32; n], n, 1)?;
    assert_eq!(
        s.clone_dtoh(graph.replay(&vec![2.0f32; n])?.y)?,
        vec![3.0f32; n]
    );
    FENCE.with(|f| f.borrow_mut().take());
    Ok(())
}

// ---- A nearly full device ----

/// Allocates nothing eagerly, but `bytes` of temporaries while captured.
#[cuda_graph(warmup = 1)]
fn big_when_captured(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[constant] bytes: usize,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let s = rt.stream();
    if is_capturing() {
        let mut t = s.alloc_zeros::<u8>(bytes)?;
        s.memset_zeros(&mut t)?;
    }
    s.memcpy_dtod(x, y)?;
    Ok(())
}

#[gpu_test]
fn a_nearly_full_device_refuses_what_cannot_be_mapped_and_gives_it_back(
    rt: Runtime,
) -> Result<(), GraphError> {
    let s = rt.stream().clone();
    let x = s.clone_htod(&[1.0f32; 256])?;
    // Settle the runtime's own allocations first.
    drop(BigWhenCapturedGraph::capture(&rt, &x, MIB, 256)?);
    rt.synchronize()?;
    rt.trim_graph_memory()?;
    let (free0, _) = rt.mem_info()?;
    // Fill the device to within 1 GiB.
    let filler = s.alloc_zeros::<u8>(free0.saturating_sub(1 << 30))?;
    rt.synchronize()?;
    let (free, _) = rt.mem_info()?;
    // Temporaries just under the free memory: they pass a check against the bare sum, but
    // the driver maps in 32 MiB granules and needs room beside them.
    for below in [16 * MIB, 4 * MIB] {
        let err = BigWhenCapturedGraph::capture(&rt, &x, free - below, 256).unwrap_err();
        assert!(err.is_out_of_memory(), "{below} below free: {err:?}");
        rt.synchronize()?;
        let (now, _) = rt.mem_info()?;
        assert!(
            now + 2 * MIB >= free,
            "free memory is back after the refusal: {now} of {free} bytes"
        );
    }
    // Graphs that fit still capture and replay right.
    let mut g = BigWhenCapturedGraph::capture(&rt, &x, 256 * MIB, 256)?;
    for v in [2.0f32, 3.0] {
        assert_eq!(s.clone_dtoh(g.replay(&vec![v; 256])?.y)?, vec![v; 256]);
    }
    drop(g);
    drop(filler);
    rt.synchronize()?;
    Ok(())
}

// ---- cuBLAS under the determinism check ----

/// A plain MLP of three GEMMs (out 512, 512, 64 from 512 inputs, batch 8, both operands
/// untransposed) and one NVRTC kernel, captured twice and compared in every build.
#[cuda_graph(warmup = 2, check_determinism = true)]
fn mlp3(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w1: &CudaSlice<f32>,
    #[state] w2: &CudaSlice<f32>,
    #[state] w3: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let batch = x.len() / 512;
    let s = rt.stream();
    let mut h1 = s.alloc_zeros::<f32>(batch * 512)?;
    let mut h2 = s.alloc_zeros::<f32>(batch * 512)?;
    matmul(rt, x, w1, &mut h1, MatMul::nn(batch, 512, 512))?;
    tanh_inplace(rt, &mut h1)?;
    matmul(rt, &h1, w2, &mut h2, MatMul::nn(batch, 512, 512))?;
    matmul(rt, &h2, w3, y, MatMul::nn(batch, 64, 512))?;
    Ok(())
}

#[gpu_test]
fn cublas_gemms_pass_the_determinism_check_and_match_eager(rt: Runtime) -> Result<(), GraphError> {
    let mut rng = fresh_rng("cublas_gemms_pass_the_determinism_check_and_match_eager");
    let s = rt.stream().clone();
    let batch = 8;
    let w = |rng: &mut rand::rngs::SmallRng, len: usize| -> Result<CudaSlice<f32>, GraphError> {
        let v: Vec<f32> = random_vec(rng, len).iter().map(|v| v * 0.05).collect();
        Ok(s.clone_htod(&v)?)
    };
    let (w1, w2, w3) = (
        w(&mut rng, 512 * 512)?,
        w(&mut rng, 512 * 512)?,
        w(&mut rng, 512 * 64)?,
    );
    let mut graph = Mlp3Graph::capture(
        &rt,
        &random_vec(&mut rng, batch * 512),
        &w1,
        &w2,
        &w3,
        batch * 64,
    )?;
    let mut ey = s.alloc_zeros::<f32>(batch * 64)?;
    for replay in 0..4 {
        let x = random_vec(&mut rng, batch * 512);
        let gy = s.clone_dtoh(graph.replay(&x)?.y)?;
        mlp3(&rt, &s.clone_htod(&x)?, &w1, &w2, &w3, &mut ey)?;
        assert_eq!(
            gy,
            s.clone_dtoh(&ey)?,
            "replay {replay}: graph vs eager, bitwise"
        );
    }
    Ok(())
}

// ---- Memory the graph addresses but does not hold, freed under it ----

/// A workspace of another part of the program, the way a framework keeps one: behind a
/// `Mutex`, so that it can grow through a shared borrow.
struct Workspace(std::sync::Mutex<CudaSlice<f32>>);

/// A layer that reads the workspace but leaves it out of its state (`skip`: the macro refuses
/// that for a `CudaSlice` field, not for a type it cannot see into).
#[derive(DeviceState)]
struct HiddenScratch {
    w: CudaSlice<f32>,
    #[device_state(skip)]
    scratch: Workspace,
}

/// `scratch = 2x + 0.5`, `y = scratch`, `y += w`.
#[cuda_graph(warmup = 2)]
fn through_hidden_scratch(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] m: &HiddenScratch,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let mut scratch = m.scratch.0.lock().unwrap_or_else(|p| p.into_inner());
    affine(rt, x, 2.0, 0.5, &mut scratch)?;
    affine(rt, &scratch, 1.0, 0.0, y)?;
    add_inplace(rt, y, &m.w)
}

#[gpu_test]
fn memory_freed_under_a_graph_that_does_not_hold_it_refuses_the_replay(
    rt: Runtime,
) -> Result<(), GraphError> {
    let mut rng = fresh_rng("memory_freed_under_a_graph_that_does_not_hold_it_refuses_the_replay");
    let n = 4096;
    let s = rt.stream().clone();
    let model = HiddenScratch {
        w: s.clone_htod(&random_vec(&mut rng, n))?,
        scratch: Workspace(std::sync::Mutex::new(s.alloc_zeros::<f32>(n)?)),
    };
    let mut graph = ThroughHiddenScratchGraph::capture(&rt, &random_vec(&mut rng, n), &model, n)?;
    // The scratch and the output buffer are outside the state and the inputs.
    assert!(graph.info().foreign_buffers >= 1, "{graph}");
    let mut ey = s.alloc_zeros::<f32>(n)?;
    for replay in 0..4 {
        let x = random_vec(&mut rng, n);
        let gy = s.clone_dtoh(graph.replay(&x)?.y)?;
        through_hidden_scratch(&rt, &s.clone_htod(&x)?, &model, &mut ey)?;
        assert_eq!(gy, s.clone_dtoh(&ey)?, "replay {replay}: graph vs eager");
    }
    // The workspace is allocated again and the captured buffer freed; new buffers may take
    // its place. (The new one may even land at the old address: its buffer ID still differs.)
    *model.scratch.0.lock().unwrap() = s.alloc_zeros::<f32>(n)?;
    let bystanders = (0..8)
        .map(|_| s.alloc_zeros::<f32>(n))
        .collect::<Result<Vec<_>, _>>()?;
    for attempt in 0..2 {
        let err = graph.replay(&random_vec(&mut rng, n)).unwrap_err();
        assert!(
            matches!(
                &err,
                GraphError::ForeignMemoryMoved {
                    graph: "through_hidden_scratch",
                    ..
                }
            ),
            "attempt {attempt}: {err:?}"
        );
        assert!(err.to_string().contains("nothing was launched"), "{err}");
    }
    // Nothing was launched: the buffers allocated since are untouched.
    for b in &bystanders {
        assert!(s.clone_dtoh(b)?.iter().all(|&v| v == 0.0));
    }
    // The runtime goes on: a new capture reads the new scratch and replays like eager.
    let mut graph = ThroughHiddenScratchGraph::capture(&rt, &random_vec(&mut rng, n), &model, n)?;
    for replay in 0..3 {
        let x = random_vec(&mut rng, n);
        let gy = s.clone_dtoh(graph.replay(&x)?.y)?;
        through_hidden_scratch(&rt, &s.clone_htod(&x)?, &model, &mut ey)?;
        assert_eq!(gy, s.clone_dtoh(&ey)?, "new graph, replay {replay}");
    }
    Ok(())
}

// ---- The torture test: seeded random programs built from the pieces above ----

/// One captured graph of a torture program, with the eager twin it is compared against.
trait Piece {
    /// Replays the graph on fresh inputs and compares every output with the eager twin's,
    /// bitwise.
    fn replay_and_check(&mut self, rt: &Runtime, rng: &mut SmallRng) -> Result<(), String>;
}

/// A failure in words; out of memory (typed) is marked, so that a program on a nearly full
/// device can count it instead of failing.
fn err(e: GraphError) -> String {
    if e.is_out_of_memory() {
        format!("{OOM}{e}")
    } else {
        e.to_string()
    }
}

const OOM: &str = "out of memory: ";

/// Whether a failure is out of memory, typed by the runtime or reported by the driver.
fn is_oom(e: &str) -> bool {
    e.starts_with(OOM) || e.contains("CUDA_ERROR_OUT_OF_MEMORY")
}

fn same<T: PartialEq + std::fmt::Debug>(what: &str, a: Vec<T>, b: Vec<T>) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("{what}: the graph differs from eager"))
    }
}

/// `with_temp`: a temporary of `mib` MiB.
struct TempPiece<'a> {
    g: WithTempGraph<'a>,
    n: usize,
    mib: usize,
    ey: CudaSlice<f32>,
}

impl Piece for TempPiece<'_> {
    fn replay_and_check(&mut self, rt: &Runtime, rng: &mut SmallRng) -> Result<(), String> {
        let x = random_vec(rng, self.n);
        let gy = rt
            .stream()
            .clone_dtoh(self.g.replay(&x).map_err(err)?.y)
            .map_err(|e| e.to_string())?;
        let xd = rt.stream().clone_htod(&x).map_err(|e| e.to_string())?;
        with_temp(rt, &xd, &mut self.ey, self.mib).map_err(err)?;
        same(
            "with_temp",
            gy,
            rt.stream()
                .clone_dtoh(&self.ey)
                .map_err(|e| e.to_string())?,
        )
    }
}

/// `biased`: an eager island between two segments, on `#[derive(DeviceState)]` state.
struct IslandPiece<'a> {
    g: BiasedGraph<'a>,
    eager: Bias,
    n: usize,
    ey: CudaSlice<f32>,
}

impl Piece for IslandPiece<'_> {
    fn replay_and_check(&mut self, rt: &Runtime, rng: &mut SmallRng) -> Result<(), String> {
        let x = random_vec(rng, self.n);
        let gy = rt
            .stream()
            .clone_dtoh(self.g.replay(&x).map_err(err)?.y)
            .map_err(|e| e.to_string())?;
        let xd = rt.stream().clone_htod(&x).map_err(|e| e.to_string())?;
        biased(rt, &xd, &mut self.eager, &mut false, &mut self.ey).map_err(err)?;
        same(
            "biased",
            gy,
            rt.stream()
                .clone_dtoh(&self.ey)
                .map_err(|e| e.to_string())?,
        )
    }
}

/// `noisy_unrolled`: an unrolled on-device loop drawing random numbers from its generator.
struct LoopPiece<'a> {
    g: NoisyUnrolledGraph<'a>,
    twin: Generator,
    unroll: u32,
    n: usize,
    eager: [CudaSlice<f32>; 3],
    iters: CudaSlice<u32>,
}

impl Piece for LoopPiece<'_> {
    fn replay_and_check(&mut self, rt: &Runtime, rng: &mut SmallRng) -> Result<(), String> {
        let mut x = random_vec(rng, self.n);
        x[0] = rng.random_range(0.5f32..9.0).exp();
        let s = rt.stream();
        let out = self.g.replay(&x).map_err(err)?;
        let (gy, ga, gi) = (
            s.clone_dtoh(out.y).map_err(|e| e.to_string())?,
            s.clone_dtoh(out.after).map_err(|e| e.to_string())?,
            s.clone_dtoh(out.iters).map_err(|e| e.to_string())?,
        );
        let xd = s.clone_htod(&x).map_err(|e| e.to_string())?;
        let [ey, en, ea] = &mut self.eager;
        noisy_unrolled(
            rt,
            &xd,
            &self.twin,
            ey,
            en,
            ea,
            &mut self.iters,
            self.unroll,
        )
        .map_err(err)?;
        let s = rt.stream();
        same(
            "noisy_unrolled y",
            gy,
            s.clone_dtoh(ey).map_err(|e| e.to_string())?,
        )?;
        same(
            "noisy_unrolled after",
            ga,
            s.clone_dtoh(ea).map_err(|e| e.to_string())?,
        )?;
        same(
            "noisy_unrolled iters",
            gi,
            s.clone_dtoh(&self.iters).map_err(|e| e.to_string())?,
        )
    }
}

/// `mlp3`: three cuBLAS GEMMs and a kernel, checked for determinism at capture.
struct MlpPiece<'a> {
    g: Mlp3Graph<'a>,
    w: &'a [CudaSlice<f32>; 3],
    batch: usize,
    ey: CudaSlice<f32>,
}

impl Piece for MlpPiece<'_> {
    fn replay_and_check(&mut self, rt: &Runtime, rng: &mut SmallRng) -> Result<(), String> {
        let x = random_vec(rng, self.batch * 512);
        let gy = rt
            .stream()
            .clone_dtoh(self.g.replay(&x).map_err(err)?.y)
            .map_err(|e| e.to_string())?;
        let xd = rt.stream().clone_htod(&x).map_err(|e| e.to_string())?;
        let [w1, w2, w3] = self.w;
        mlp3(rt, &xd, w1, w2, w3, &mut self.ey).map_err(err)?;
        same(
            "mlp3",
            gy,
            rt.stream()
                .clone_dtoh(&self.ey)
                .map_err(|e| e.to_string())?,
        )
    }
}

/// What one thread of a program owns for its pieces to borrow: two biases, two generators
/// (each with an eager twin of the same seed, made when a piece takes it) and MLP weights.
struct Arena {
    biases: Vec<Bias>,
    generators: Vec<Generator>,
    weights: [CudaSlice<f32>; 3],
}

impl Arena {
    fn new(rt: &Runtime, rng: &mut SmallRng, n: usize) -> Result<Self, GraphError> {
        let s = rt.stream();
        let mut w = |len: usize| -> Result<CudaSlice<f32>, GraphError> {
            let v: Vec<f32> = random_vec(rng, len).iter().map(|v| v * 0.05).collect();
            Ok(rt.stream().clone_htod(&v)?)
        };
        let weights = [w(512 * 512)?, w(512 * 512)?, w(512 * 64)?];
        let biases = (0..2)
            .map(|_| {
                Ok(Bias {
                    b: s.clone_htod(&random_vec(rng, n))?,
                })
            })
            .collect::<Result<Vec<_>, GraphError>>()?;
        let generators = (0..2)
            .map(|k| rt.generator(100 + k))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arena {
            biases,
            generators,
            weights,
        })
    }
}

/// Counts of a torture run (`typed_oom`: captures and eager twins that ran out of memory).
#[derive(Default, Debug)]
struct Tally {
    captures: usize,
    replays: usize,
    typed_oom: usize,
    drops: usize,
}

/// Captures a random piece, borrowing from the arena's parts not taken yet.
fn capture_piece<'a>(
    rt: &Runtime,
    rng: &mut SmallRng,
    n: usize,
    biases: &mut std::slice::IterMut<'a, Bias>,
    generators: &mut std::slice::Iter<'a, Generator>,
    weights: &'a [CudaSlice<f32>; 3],
) -> Result<Box<dyn Piece + 'a>, GraphError> {
    let s = rt.stream();
    match rng.random_range(0..4) {
        1 => {
            if let Some(m) = biases.next() {
                let eager = Bias {
                    b: s.clone_htod(&s.clone_dtoh(&m.b)?)?,
                };
                let g = BiasedGraph::capture(rt, &random_vec(rng, n), m, false, n)?;
                return Ok(Box::new(IslandPiece {
                    g,
                    eager,
                    n,
                    ey: rt.stream().alloc_zeros(n)?,
                }));
            }
        }
        2 => {
            if let Some(gen) = generators.next() {
                let (seed, offset) = gen.seed_and_offset(rt)?;
                let twin = rt.generator(seed)?;
                assert_eq!(offset, 0, "a generator is taken once, before any draw");
                let unroll = rng.random_range(2..=8);
                let g =
                    NoisyUnrolledGraph::capture(rt, &random_vec(rng, n), gen, n, n, n, 1, unroll)?;
                let s = rt.stream();
                return Ok(Box::new(LoopPiece {
                    g,
                    twin,
                    unroll,
                    n,
                    eager: [s.alloc_zeros(n)?, s.alloc_zeros(n)?, s.alloc_zeros(n)?],
                    iters: s.alloc_zeros(1)?,
                }));
            }
        }
        3 => {
            let batch = rng.random_range(1..=16);
            let [w1, w2, w3] = weights;
            let g = Mlp3Graph::capture(rt, &random_vec(rng, batch * 512), w1, w2, w3, batch * 64)?;
            return Ok(Box::new(MlpPiece {
                g,
                w: weights,
                batch,
                ey: rt.stream().alloc_zeros(batch * 64)?,
            }));
        }
        _ => {}
    }
    let mib = rng.random_range(0..=48);
    let g = WithTempGraph::capture(rt, &random_vec(rng, n), n, mib)?;
    Ok(Box::new(TempPiece {
        g,
        n,
        mib,
        ey: rt.stream().alloc_zeros(n)?,
    }))
}

/// The parts of an arena not taken by a piece yet, and the arena's weights.
struct Parts<'a> {
    biases: std::slice::IterMut<'a, Bias>,
    generators: std::slice::Iter<'a, Generator>,
    weights: &'a [CudaSlice<f32>; 3],
}

/// Captures a random piece into `pieces`; out of memory is counted, not an error.
fn capture_into<'a>(
    rt: &Runtime,
    rng: &mut SmallRng,
    n: usize,
    parts: &mut Parts<'a>,
    pieces: &mut Vec<Box<dyn Piece + 'a>>,
    tally: &mut Tally,
) -> Result<(), String> {
    match capture_piece(
        rt,
        rng,
        n,
        &mut parts.biases,
        &mut parts.generators,
        parts.weights,
    ) {
        Ok(p) => {
            tally.captures += 1;
            pieces.push(p);
            Ok(())
        }
        Err(e) if e.is_out_of_memory() => {
            tally.typed_oom += 1;
            Ok(())
        }
        Err(e) => Err(format!("capture: {e}")),
    }
}

/// One thread of a program: an arena, 2 to 4 pieces, `steps` replays of random pieces with
/// captures and drops in between, the rest dropped in random order. Out of memory at a
/// capture is counted (the device may be nearly full); any other error fails the program.
fn torture_thread(rt: &Runtime, seed: u64, steps: usize) -> Result<Tally, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let n = rng.random_range(64..4096);
    let mut arena = Arena::new(rt, &mut rng, n).map_err(err)?;
    let mut parts = Parts {
        biases: arena.biases.iter_mut(),
        generators: arena.generators.iter(),
        weights: &arena.weights,
    };
    let mut pieces: Vec<Box<dyn Piece + '_>> = Vec::new();
    for _ in 0..rng.random_range(2..=4) {
        capture_into(rt, &mut rng, n, &mut parts, &mut pieces, &mut tally)?;
    }
    for step in 0..steps {
        match rng.random_range(0..20) {
            0 if !pieces.is_empty() => {
                let k = rng.random_range(0..pieces.len());
                drop(pieces.swap_remove(k));
                tally.drops += 1;
            }
            1 => capture_into(rt, &mut rng, n, &mut parts, &mut pieces, &mut tally)?,
            _ if !pieces.is_empty() => {
                let k = rng.random_range(0..pieces.len());
                match pieces[k].replay_and_check(rt, &mut rng) {
                    Ok(()) => tally.replays += 1,
                    // A nearly full device: the eager twin's temporaries may not fit. Typed,
                    // and the runtime goes on.
                    Err(e) if is_oom(&e) => tally.typed_oom += 1,
                    Err(e) => return Err(format!("step {step}, piece {k}: {e}")),
                }
            }
            _ => {}
        }
    }
    while !pieces.is_empty() {
        let k = rng.random_range(0..pieces.len());
        drop(pieces.swap_remove(k));
        tally.drops += 1;
    }
    Ok(tally)
}

/// Seeded random programs of the pieces above: one to four threads, each with a runtime of
/// its own or all sharing one, graphs captured, replayed against eager and dropped in random
/// order, a fifth of the programs on a device filled to within 40 to 256 MiB (where out of
/// memory, typed, is counted and the program goes on). At the end
/// the device's free memory is back where it was after the first programs (within 16 MiB:
/// kernels loaded by later programs into the shared runtime stay loaded).
/// `CUDA_GRAPH_TORTURE_PROGRAMS` (default 40) and `CUDA_GRAPH_TORTURE_SEED` (default: the
/// clock) steer it; the seed is printed first and named in every failure.
#[gpu_test]
fn torture_random_programs_equal_eager(rt: Runtime) -> Result<(), GraphError> {
    let seed: u64 = std::env::var("CUDA_GRAPH_TORTURE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fresh_rng("torture").random());
    let programs: usize = std::env::var("CUDA_GRAPH_TORTURE_PROGRAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    eprintln!("torture: seed {seed} (CUDA_GRAPH_TORTURE_SEED={seed} repeats this run), {programs} programs");
    let mut rng = SmallRng::seed_from_u64(seed);
    // First programs settle what the process and the shared runtime keep (compiled and
    // loaded kernels, cuBLAS's state).
    for k in 0..4u64 {
        torture_thread(&rt, seed ^ (0x5eed + k), 30)
            .map_err(|e| GraphError::User(format!("seed {seed}, warm-up {k}: {e}").into()))?;
    }
    rt.synchronize()?;
    rt.trim_graph_memory()?;
    let (free_before, _) = rt.mem_info()?;
    let started = Instant::now();
    let mut total = Tally::default();
    for program in 0..programs {
        let threads = rng.random_range(1..=4usize);
        let shared = rng.random_bool(0.5);
        let fill = threads == 1 && rng.random_range(0..5) == 0;
        let seeds: Vec<u64> = (0..threads).map(|_| rng.random()).collect();
        let steps = rng.random_range(10..60);
        let at = |e: String| {
            format!("seed {seed}, program {program} ({threads} threads, shared {shared}, filled {fill}): {e}")
        };
        let results: Vec<Result<Tally, String>> = if threads == 1 {
            let own = Runtime::new(0)?;
            let filler = if fill {
                let (free, _) = own.mem_info()?;
                let leave = rng.random_range(40..256) << 20;
                Some(own.stream().alloc_zeros::<u8>(free.saturating_sub(leave))?)
            } else {
                None
            };
            let r = torture_thread(&own, seeds[0], steps);
            drop(filler);
            vec![r]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = seeds
                    .iter()
                    .map(|&t| {
                        let shared_rt = &rt;
                        scope.spawn(move || {
                            if shared {
                                torture_thread(shared_rt, t, steps)
                            } else {
                                let own = Runtime::new(0).map_err(err)?;
                                torture_thread(&own, t, steps)
                            }
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("a thread panicked".to_owned()))
                    })
                    .collect()
            })
        };
        for r in results {
            let t = r.map_err(|e| GraphError::User(at(e).into()))?;
            total.captures += t.captures;
            total.replays += t.replays;
            total.typed_oom += t.typed_oom;
            total.drops += t.drops;
        }
    }
    rt.synchronize()?;
    rt.trim_graph_memory()?;
    let (free_after, _) = rt.mem_info()?;
    eprintln!(
        "torture: seed {seed}: {programs} programs, {} captures, {} replays equal to eager, {} typed out-of-memory captures, {} drops in {:.1} s; free memory {} MiB before, {} MiB after",
        total.captures,
        total.replays,
        total.typed_oom,
        total.drops,
        started.elapsed().as_secs_f64(),
        free_before >> 20,
        free_after >> 20
    );
    assert!(
        free_after + 16 * MIB >= free_before,
        "seed {seed}: free memory {} MiB after the programs, {} MiB before",
        free_after >> 20,
        free_before >> 20
    );
    assert!(
        total.replays > 0 && total.captures > 0,
        "seed {seed}: {total:?}"
    );
    Ok(())
}

// ---- cuBLAS from threads that share a runtime ----
fn threads_weights(rt: &Runtime, seed: u64) -> Result<[CudaSlice<f32>; 3], GraphError> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut w = |len: usize| -> Result<CudaSlice<f32>, GraphError> {
        let v: Vec<f32> = random_vec(&mut rng, len).iter().map(|v| v * 0.05).collect();
        Ok(rt.stream().clone_htod(&v)?)
    };
    Ok([w(512 * 512)?, w(512 * 512)?, w(512 * 64)?])
}

/// Thread `t`'s MLP, run eagerly 31 times (and replayed 30 times as a graph with `graph`)
/// on one input: how many runs after the first differ from it, eager and graph.
fn mlp_runs_on_one_input(rt: &Runtime, t: u64, graph: bool) -> Result<(usize, usize), GraphError> {
    let [w1, w2, w3] = threads_weights(rt, t)?;
    let batch = 1 + (t as usize % 8);
    let x = random_vec(&mut SmallRng::seed_from_u64(t + 77), batch * 512);
    let xd = rt.stream().clone_htod(&x)?;
    let mut ey = rt.stream().alloc_zeros::<f32>(batch * 64)?;
    mlp3(rt, &xd, &w1, &w2, &w3, &mut ey)?;
    let first = rt.stream().clone_dtoh(&ey)?;
    let (mut eager_bad, mut graph_bad) = (0, 0);
    let mut g = if graph {
        Some(Mlp3Graph::capture(rt, &x, &w1, &w2, &w3, batch * 64)?)
    } else {
        None
    };
    for _ in 0..30 {
        mlp3(rt, &xd, &w1, &w2, &w3, &mut ey)?;
        if rt.stream().clone_dtoh(&ey)? != first {
            eager_bad += 1;
        }
        if let Some(g) = g.as_mut() {
            if rt.stream().clone_dtoh(g.replay(&x)?.y)? != first {
                graph_bad += 1;
            }
        }
    }
    Ok((eager_bad, graph_bad))
}

/// Four threads run cuBLAS MLPs (eagerly, then also as graphs) on one shared runtime and
/// each on its own: every run on one input gives the first run's bits. (cuBLAS allows one
/// host thread at a time per handle, and a handle made on another handle's workspace
/// corrupted that handle's running GEMM: `Runtime::blas` gives each thread its own handle
/// and workspace.)
#[gpu_test]
fn cublas_from_threads_sharing_a_runtime_is_deterministic(rt: Runtime) -> Result<(), GraphError> {
    for (shared, graph) in [(true, false), (false, false), (true, true), (false, true)] {
        let r: Vec<Result<(usize, usize), String>> = std::thread::scope(|scope| {
            let hs: Vec<_> = (0..4u64)
                .map(|t| {
                    let rt = &rt;
                    scope.spawn(move || {
                        if shared {
                            mlp_runs_on_one_input(rt, t, graph).map_err(|e| e.to_string())
                        } else {
                            let own = Runtime::new(0).map_err(|e| e.to_string())?;
                            mlp_runs_on_one_input(&own, t, graph).map_err(|e| e.to_string())
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            r.iter().all(|r| r == &Ok((0, 0))),
            "shared runtime {shared}, graphs {graph}: (eager, graph) runs unlike the first, per thread: {r:?}"
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
