//! Memory: graphs give their memory back when dropped, replays allocate nothing, graphs of
//! one runtime share the physical memory of their temporaries, and out of memory during a
//! capture is a typed error after which the runtime still works.

use std::sync::atomic::{AtomicUsize, Ordering};

use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};
use workloads::kernels::ELEMENTWISE;
use workloads::testing::{fresh_rng, gpu_test, random_vec};

const MIB: usize = 1 << 20;

/// `y = x + 1` through a temporary of `temp_mib` MiB (a graph allocation node).
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
    let f = rt.function(ELEMENTWISE, "add_scalar")?;
    let nn = n as i32;
    // SAFETY: writes the first `n` floats of `tmp`, which holds at least `n`; reads `n` of `x`.
    unsafe {
        rt.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut tmp)
            .arg(&1.0f32)
            .arg(&nn)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    rt.stream().memcpy_dtod(&tmp.slice(0..n), y)?;
    Ok(())
}

fn settle(rt: &Runtime) -> Result<usize, GraphError> {
    rt.synchronize()?;
    rt.trim_graph_memory()?;
    rt.synchronize()?;
    Ok(rt.mem_info()?.0)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / MIB as f64
}

#[gpu_test]
fn memory_report_counts_temporaries_and_static_buffers(rt: Runtime) -> Result<(), GraphError> {
    let x = vec![1.0f32; 1000];
    let graph = WithTempGraph::capture(&rt, &x, 1000, 8)?;
    let info = graph.info();
    assert_eq!(
        info.static_bytes,
        2 * 1000 * 4,
        "input and output buffers: {info:?}"
    );
    assert!(info.temp_bytes >= 8 * MIB, "the 8 MiB temporary: {info:?}");
    assert_eq!((info.kinds.allocs, info.kinds.frees), (1, 1), "{info:?}");
    assert_eq!(
        info.exec_bytes, None,
        "the executable's memory is measured only when asked: {info:?}"
    );
    let pool = rt.graph_memory()?;
    assert!(
        pool.used >= 8 * MIB,
        "the uploaded graph maps its temporary: {pool:?}"
    );
    drop(graph);
    let after = rt.graph_memory()?;
    assert!(
        after.reserved < 8 * MIB,
        "dropping the graph trims its memory: {after:?}"
    );
    Ok(())
}

#[gpu_test]
fn a_hundred_graphs_give_their_memory_back(rt: Runtime) -> Result<(), GraphError> {
    let test = "a_hundred_graphs_give_their_memory_back";
    let mut rng = fresh_rng(test);
    let n = 4096;
    // Load the kernels (module memory) before the baseline.
    drop(WithTempGraph::capture(&rt, &vec![0.0f32; n], n, 4)?);
    let before = settle(&rt)?;
    for i in 0..100 {
        let host = random_vec(&mut rng, n);
        let mut graph = WithTempGraph::capture(&rt, &host, n, 4 + i % 5)?;
        let y = rt.stream().clone_dtoh(graph.replay(&host)?.y)?;
        assert!(y.iter().zip(&host).all(|(a, b)| *a == b + 1.0), "graph {i}");
    }
    let after = settle(&rt)?;
    let lost = before.saturating_sub(after);
    eprintln!(
        "{test}: free before {:.1} MiB, after {:.1} MiB",
        mib(before),
        mib(after)
    );
    assert!(lost <= MIB, "100 captures lost {:.2} MiB", mib(lost));
    Ok(())
}

#[gpu_test]
fn replays_do_not_grow_memory(rt: Runtime) -> Result<(), GraphError> {
    let test = "replays_do_not_grow_memory";
    let n = 1024;
    let src = rt.stream().clone_htod(&vec![2.0f32; n])?;
    let mut graph = WithTempGraph::capture(&rt, &src, n, 2)?;
    graph.replay(&src)?;
    let (free0, pool0) = (settle(&rt)?, rt.graph_memory()?.used);
    for _ in 0..100_000 {
        graph.replay(&src)?;
    }
    let (free1, pool1) = (settle(&rt)?, rt.graph_memory()?.used);
    eprintln!(
        "{test}: free {:.1} → {:.1} MiB, graph pool {} → {} bytes",
        mib(free0),
        mib(free1),
        pool0,
        pool1
    );
    assert!(
        free0.saturating_sub(free1) <= MIB,
        "10^5 replays grew device memory"
    );
    assert_eq!(pool0, pool1, "10^5 replays grew the graph pool");
    assert_eq!(rt.stream().clone_dtoh(graph.outputs().y)?, vec![3.0f32; n]);
    Ok(())
}

/// Free device memory after a synchronize, without trimming the graph memory pool: what
/// the graphs hold, mapped or cached, counts as used.
fn free_untrimmed(rt: &Runtime) -> Result<usize, GraphError> {
    rt.synchronize()?;
    Ok(rt.mem_info()?.0)
}

#[gpu_test]
fn graphs_of_one_runtime_share_their_temporaries(rt: Runtime) -> Result<(), GraphError> {
    let test = "graphs_of_one_runtime_share_their_temporaries";
    let n = 256;
    let x = vec![1.0f32; n];
    let sizes = [32usize, 16, 8, 4, 2, 1]; // MiB of temporaries, largest first
    drop(WithTempGraph::capture(&rt, &x, n, 1)?);

    settle(&rt)?;
    rt.reset_graph_memory_high()?;
    let base = free_untrimmed(&rt)?;
    let mut largest = WithTempGraph::capture(&rt, &x, n, sizes[0])?;
    largest.replay(&x)?;
    let alone = base.saturating_sub(free_untrimmed(&rt)?);
    let alone_high = rt.graph_memory()?.reserved_high;
    drop(largest);

    settle(&rt)?;
    rt.reset_graph_memory_high()?;
    let base = free_untrimmed(&rt)?;
    let mut family = Vec::new();
    for &m in &sizes {
        family.push(WithTempGraph::capture(&rt, &x, n, m)?);
    }
    for g in &mut family {
        g.replay(&x)?;
    }
    let together = base.saturating_sub(free_untrimmed(&rt)?);
    let together_high = rt.graph_memory()?.reserved_high;
    eprintln!(
        "{test}: device memory: largest alone {:.1} MiB, six graphs {:.1} MiB (their temporaries add up to {} MiB); \
         pool high-water: alone {:.1} MiB, six graphs {:.1} MiB",
        mib(alone),
        mib(together),
        sizes.iter().sum::<usize>(),
        mib(alone_high),
        mib(together_high)
    );
    assert!(
        alone >= sizes[0] * MIB,
        "the largest graph alone holds its {} MiB: {:.1} MiB",
        sizes[0],
        mib(alone)
    );
    assert!(
        together as f64 <= 1.2 * alone as f64,
        "six graphs took {:.1} MiB, the largest alone {:.1} MiB",
        mib(together),
        mib(alone)
    );
    assert!(
        together_high as f64 <= 1.2 * alone_high as f64,
        "pool high-water {together_high} vs {alone_high}"
    );
    for g in &mut family {
        assert_eq!(rt.stream().clone_dtoh(g.replay(&x)?.y)?, vec![2.0f32; n]);
    }
    Ok(())
}

#[cuda_graph(warmup = 1)]
fn huge_temp(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] bytes: usize,
) -> Result<(), GraphError> {
    let tmp = rt.stream().alloc_zeros::<u8>(bytes)?;
    drop(tmp);
    rt.stream().memcpy_dtod(x, y)?;
    Ok(())
}

#[gpu_test]
fn out_of_memory_during_capture_is_typed_and_recoverable(rt: Runtime) -> Result<(), GraphError> {
    let test = "out_of_memory_during_capture_is_typed_and_recoverable";
    let total = rt.mem_info()?.1;
    let x = vec![1.0f32; 64];

    // An output larger than the card.
    let err = WithTempGraph::capture(&rt, &x, total / 4 + 1024, 1).unwrap_err();
    match &err {
        GraphError::OutOfMemory {
            during,
            requested_bytes,
            free_bytes,
        } => {
            assert!(
                during.contains("`y`") && during.contains("with_temp"),
                "{during}"
            );
            assert_eq!(*requested_bytes, Some((total / 4 + 1024) * 4));
            assert!(free_bytes.is_some());
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert!(err.to_string().contains("GiB"), "{err}");

    // A temporary larger than the card, allocated by the body.
    let err = HugeTempGraph::capture(&rt, &x, 64, total + (1 << 30)).unwrap_err();
    match &err {
        GraphError::OutOfMemory { during, .. } => {
            assert!(during.contains("warmup run 1 of `huge_temp`"), "{during}");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    eprintln!("{test}: {err}");

    // The runtime is fine: a normal capture works.
    let mut graph = HugeTempGraph::capture(&rt, &x, 64, 1 << 20)?;
    assert_eq!(
        rt.stream().clone_dtoh(graph.replay(&vec![7.0f32; 64])?.y)?,
        vec![7.0f32; 64]
    );
    Ok(())
}

/// `acc += b`, element by element.
const ACCUMULATE: &str = r#"
extern "C" __global__ void accumulate(float *acc, const float *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += b[i];
}
"#;

/// Free device memory read at the start of the first call of `footprint` (its only warmup
/// run): the static buffers and the state snapshot are allocated, its temporaries not yet.
static FREE_IN_WARMUP: AtomicUsize = AtomicUsize::new(0);
static FOOTPRINT_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Reads free device memory on the first call after `FOOTPRINT_CALLS` is reset (the warmup
/// run of a capture): a host effect on purpose, which the graph does not replay.
fn note_free_memory_once(rt: &Runtime) -> Result<(), GraphError> {
    if FOOTPRINT_CALLS.fetch_add(1, Ordering::SeqCst) == 0 {
        rt.synchronize()?;
        FREE_IN_WARMUP.store(rt.mem_info()?.0, Ordering::SeqCst);
    }
    Ok(())
}

/// `y = x + 1` through a temporary of `temp_mib` MiB, freed before a second one of the same
/// size holds `y + 0` for `acc += …`: two allocations whose lifetimes do not overlap.
#[cuda_graph(warmup = 1)]
fn footprint(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[state] acc: &mut CudaSlice<f32>,
    #[constant] temp_mib: usize,
) -> Result<(), GraphError> {
    note_free_memory_once(rt)?;
    let n = x.len();
    let nn = n as i32;
    let add_scalar = rt.function(ELEMENTWISE, "add_scalar")?;
    let floats = (temp_mib * MIB / 4).max(n);
    let mut first = rt.stream().alloc_zeros::<f32>(floats)?;
    // SAFETY: reads `n` floats of `x`, writes the first `n` of `first` (at least `n` long).
    unsafe {
        rt.stream()
            .launch_builder(&add_scalar)
            .arg(x)
            .arg(&mut first)
            .arg(&1.0f32)
            .arg(&nn)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    rt.stream().memcpy_dtod(&first.slice(0..n), y)?;
    drop(first);
    let mut second = rt.stream().alloc_zeros::<f32>(floats)?;
    // SAFETY: reads `n` floats of `y`, writes the first `n` of `second`.
    unsafe {
        rt.stream()
            .launch_builder(&add_scalar)
            .arg(&*y)
            .arg(&mut second)
            .arg(&0.0f32)
            .arg(&nn)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    let accumulate = rt.function(ACCUMULATE, "accumulate")?;
    // SAFETY: `acc` and `second` hold at least `n` floats.
    unsafe {
        rt.stream()
            .launch_builder(&accumulate)
            .arg(&mut *acc)
            .arg(&second)
            .arg(&nn)
            .launch(LaunchConfig::for_num_elems(n as u32))?;
    }
    Ok(())
}

/// `|measured - reported| <= 5%` of the measurement (device memory comes in pages of
/// 2 MiB; the figures here are tens of MiB).
fn within_5_percent(what: &str, reported: usize, measured: usize) {
    let diff = reported.abs_diff(measured) as f64;
    assert!(
        diff <= 0.05 * measured as f64,
        "{what}: GraphInfo says {:.2} MiB, cuMemGetInfo measured {:.2} MiB",
        mib(reported),
        mib(measured)
    );
}

#[gpu_test]
fn memory_figures_match_the_device(rt: Runtime) -> Result<(), GraphError> {
    let test = "memory_figures_match_the_device";
    let mut rng = fresh_rng(test);
    let s = rt.stream().clone();
    let n = 8 * MIB; // floats: 32 MiB per buffer
    rt.set_measure_executable_memory(true);
    let temp_mib = 96;
    // Load the kernels (module memory) before any baseline.
    {
        let mut tiny = s.alloc_zeros::<f32>(64)?;
        drop(FootprintGraph::capture(
            &rt,
            &vec![0.0f32; 64],
            64,
            &mut tiny,
            1,
        )?);
    }
    let start = random_vec(&mut rng, n);
    let mut acc = s.clone_htod(&start)?;
    let mut acc_eager = s.clone_htod(&start)?;
    // The second graph's state, made before any baseline: the readings around each capture
    // then see only what that capture took.
    let mut acc2 = s.clone_htod(&start)?;
    let x0 = random_vec(&mut rng, n);

    let free0 = settle(&rt)?;
    FOOTPRINT_CALLS.store(0, Ordering::SeqCst);
    let mut first = FootprintGraph::capture(&rt, &x0, n, &mut acc, temp_mib)?;
    let free1 = free_untrimmed(&rt)?;
    let a = first.info().clone();
    let free_warm = FREE_IN_WARMUP.load(Ordering::SeqCst);
    eprintln!("{test}: first graph: {first}");
    eprintln!(
        "{test}: free {:.1} MiB before, {:.1} MiB in the warmup, {:.1} MiB after the capture",
        mib(free0),
        mib(free_warm),
        mib(free1)
    );
    assert_eq!(a.static_bytes, 2 * n * 4, "{a:?}");
    assert_eq!(a.state_snapshot_bytes, n * 4, "{a:?}");
    assert_eq!(a.temp_requested_bytes, 2 * temp_mib * MIB, "{a:?}");
    assert!(
        a.temp_bytes >= temp_mib * MIB && a.temp_bytes <= a.temp_requested_bytes,
        "the high-water mark lies between the larger temporary and their sum: {a:?}"
    );
    // Static buffers and snapshot: what the warmup saw missing.
    within_5_percent(
        "static buffers + state snapshot",
        a.static_bytes + a.state_snapshot_bytes,
        free0.saturating_sub(free_warm),
    );
    // Everything the graph keeps: what the capture took from the device.
    within_5_percent(
        "device_bytes of the first graph",
        a.device_bytes(),
        free0.saturating_sub(free1),
    );
    // On a trimmed pool the first graph maps its own high-water mark anew.
    within_5_percent(
        "temporaries vs what the pool mapped",
        a.temp_bytes,
        a.pool_added_bytes,
    );
    assert!(a.pool_shared_bytes <= a.temp_bytes / 20, "{a:?}");

    // A second graph of the same runtime shares the pool's memory.
    let mut second = FootprintGraph::capture(&rt, &x0, n, &mut acc2, temp_mib)?;
    let free2 = free_untrimmed(&rt)?;
    let b = second.info().clone();
    eprintln!("{test}: second graph: {second}");
    within_5_percent(
        "device_bytes of the second graph",
        b.device_bytes(),
        free1.saturating_sub(free2),
    );
    assert!(
        b.pool_added_bytes <= b.temp_bytes / 20,
        "the second graph reuses the pool: {b:?}"
    );
    within_5_percent("shared temporaries", b.pool_shared_bytes, b.temp_bytes);
    // The pool's part: the two captures differ only in what the first mapped in the pool.
    within_5_percent(
        "pool memory of the first graph",
        a.pool_added_bytes,
        free0
            .saturating_sub(free1)
            .saturating_sub(free1.saturating_sub(free2)),
    );

    // The graphs compute what eager calls do, on fresh inputs, several replays.
    for replay in 0..3 {
        let x = random_vec(&mut rng, n);
        let y = s.clone_dtoh(first.replay(&x)?.y)?;
        let xd = s.clone_htod(&x)?;
        let mut y_eager = s.alloc_zeros::<f32>(n)?;
        footprint(&rt, &xd, &mut y_eager, &mut acc_eager, temp_mib)?;
        assert_eq!(y, s.clone_dtoh(&y_eager)?, "replay {replay}: y");
        assert_eq!(
            s.clone_dtoh(&first.state_mut().acc)?,
            s.clone_dtoh(&acc_eager)?,
            "replay {replay}: the accumulator"
        );
        second.replay(&x)?;
    }

    // Dropping both gives it all back.
    drop(first);
    drop(second);
    let free3 = settle(&rt)?;
    eprintln!("{test}: free after dropping both: {:.1} MiB", mib(free3));
    assert!(
        free0.abs_diff(free3) <= 4 * MIB,
        "dropping the graphs gave back their memory: {:.1} MiB before, {:.1} MiB after",
        mib(free0),
        mib(free3)
    );
    drop(acc);
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
