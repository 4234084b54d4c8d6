//! Memory: graphs give their memory back when dropped, replays allocate nothing, graphs of
//! one runtime share the physical memory of their temporaries, and out of memory during a
//! capture is a typed error after which the runtime still works.

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

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
