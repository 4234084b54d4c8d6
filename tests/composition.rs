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
//!   kernels' host-address arguments do not fail the check.
//!
//! GPU tests (`#[gpu_test]`): without a usable GPU they count as ignored and say why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` they fail instead.

use std::time::{Duration, Instant};

use graph_runtime::cudarc::driver::{CudaEvent, CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{
    cuda_graph, is_capturing, Compare, DeviceState, Generator, GraphError, Runtime, When,
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
    let n = x.len() as i32;
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while(&go, Some(1000), |rt| {
        let arg = go.kernel_arg(rt);
        g.uniform(rt, &mut *noise, 0.0, 1.0)?;
        // SAFETY: both kernels read and write `n` floats of `y` (and `noise`, one word of
        // `iters`), all of which hold `n`, and read `go`.
        unsafe {
            rt.stream()
                .launch_builder(&halve)
                .arg(&mut *y)
                .arg(&n)
                .arg(&mut *iters)
                .arg(&arg)
                .launch(grid(n as usize))?;
            rt.stream()
                .launch_builder(&add)
                .arg(&mut *y)
                .arg(&*noise)
                .arg(&n)
                .arg(&arg)
                .launch(grid(n as usize))?;
        }
        go.set_from(rt, &*y, Compare::Gt, 1.0)
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
    let n = x.len() as i32;
    s.memcpy_dtod(x, &mut *y)?;
    s.memset_zeros(&mut *iters)?;
    let go = rt.condition(false)?;
    go.set_from(rt, &*y, Compare::Gt, 1.0)?;
    rt.graph_while_unrolled(&go, Some(1000), unroll, |rt| {
        let arg = go.kernel_arg(rt);
        g.uniform(rt, &mut *noise, 0.0, 1.0)?;
        // SAFETY: as in `noisy_plain`.
        unsafe {
            rt.stream()
                .launch_builder(&halve)
                .arg(&mut *y)
                .arg(&n)
                .arg(&mut *iters)
                .arg(&arg)
                .launch(grid(n as usize))?;
            rt.stream()
                .launch_builder(&add)
                .arg(&mut *y)
                .arg(&*noise)
                .arg(&n)
                .arg(&arg)
                .launch(grid(n as usize))?;
        }
        go.set_from(rt, &*y, Compare::Gt, 1.0)
    })?;
    g.uniform(rt, after, 0.0, 1.0)
}

#[gpu_test]
fn random_draws_in_unrolled_steps_match_graph_while(rt: Runtime) -> Result<(), GraphError> {
    use rand::Rng;
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

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
