//! "Replays allocate nothing" (crate docs, Memory; README): a counting global allocator
//! around `replay` with a device input, `replay` with host data, and `launch`, after the first
//! replay of each kind, and around a bucket family's replays of every bucket. A graph that verifies a replay runs its body eagerly and may allocate,
//! so the graph here says `verify = "never"`.
//!
//! GPU test (`#[gpu_test]`): without a usable GPU it counts as ignored and says why; with
//! `CUDA_GRAPH_REQUIRE_GPU=1` it fails instead.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use graph_runtime::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use graph_runtime::{cuda_graph, GraphError, Runtime};
use workloads::check::first_mismatch;
use workloads::kernels::ELEMENTWISE;
use workloads::testing::{cpu_test, fresh_rng, gpu_test, random_vec};

/// Counts the allocations a thread makes while its `COUNTING` is on (other threads, such as
/// the test harness's, are not counted).
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

impl Counting {
    fn note(&self) {
        // `try_with`: a thread being torn down may still free and allocate.
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only
// two constant-initialised thread-locals and allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: forwarded from the caller, who keeps `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note();
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note();
        // SAFETY: forwarded from the caller: `ptr` came from this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations this thread makes while `f` runs.
fn allocations_in(f: impl FnOnce() -> Result<(), GraphError>) -> Result<usize, GraphError> {
    let before = ALLOCATIONS.with(Cell::get);
    COUNTING.with(|c| c.set(true));
    let result = f();
    COUNTING.with(|c| c.set(false));
    result?;
    Ok(ALLOCATIONS.with(Cell::get) - before)
}

/// `y = w * x`.
#[cuda_graph(warmup = 2, verify = "never")]
fn scale(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let n = x.len() as i32;
    let f = rt.function(ELEMENTWISE, "mul")?;
    let mut b = rt.stream().launch_builder(&f);
    b.arg(w).arg(x).arg(y).arg(&n);
    // SAFETY: `mul` reads `n` floats of `w` and `x` and writes `n` of `y`, all of length `n`.
    unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }?;
    Ok(())
}

/// The counter is not blind: one `Vec` is one allocation.
#[cpu_test]
fn the_counter_sees_an_allocation() {
    let counted = allocations_in(|| {
        drop(std::hint::black_box(vec![0u8; 64]));
        Ok(())
    })
    .expect("no error");
    assert_eq!(counted, 1);
}

#[gpu_test]
fn replays_and_launches_allocate_nothing(rt: Runtime) -> Result<(), GraphError> {
    let (mut rng, n) = (fresh_rng("replays_and_launches_allocate_nothing"), 4096);
    let s = rt.stream();
    let w = s.clone_htod(&random_vec(&mut rng, n))?;
    let host = random_vec(&mut rng, n);
    let device = s.clone_htod(&random_vec(&mut rng, n))?;
    let mut graph = ScaleGraph::capture(&rt, &host, &w, n)?;
    // The first replay of each kind may set up what the later ones reuse.
    graph.replay(&device)?;
    graph.replay(host.as_slice())?;
    graph.launch()?;

    let on_device = allocations_in(|| {
        for _ in 0..100 {
            graph.replay(&device)?;
        }
        Ok(())
    })?;
    let from_host = allocations_in(|| {
        for _ in 0..100 {
            graph.replay(host.as_slice())?;
        }
        Ok(())
    })?;
    let launches = allocations_in(|| {
        for _ in 0..100 {
            graph.launch()?;
        }
        Ok(())
    })?;
    assert_eq!(
        (on_device, from_host, launches),
        (0, 0, 0),
        "allocations in 100 replays with a device input, 100 with host data, 100 launches"
    );

    // The replays did their work: the last one computed w * host.
    let mut eager = s.alloc_zeros::<f32>(n)?;
    let host_dev = s.clone_htod(&host)?;
    scale(&rt, &host_dev, &w, &mut eager)?;
    let ours = s.clone_dtoh(graph.outputs().y)?;
    let diff = first_mismatch(&s.clone_dtoh(&eager)?, &ours);
    assert!(diff.is_none(), "replay differs from eager: {diff:?}");
    Ok(())
}

/// `y = w * x` over the bucket's rows: one graph per batch of 1, 2 or 4 rows.
#[cuda_graph(warmup = 2, verify = "never", buckets(batch = [1, 2, 4]))]
fn scale_rows(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<(), GraphError> {
    let _ = batch;
    scale(rt, x, w, y)
}

/// A bucket family's replays take the same path as a single graph's: after each bucket's
/// first replay, none allocates, whichever bucket a batch picks and however many padding rows
/// it zero-fills.
#[gpu_test]
fn bucket_family_replays_allocate_nothing(rt: Runtime) -> Result<(), GraphError> {
    let (mut rng, row) = (fresh_rng("bucket_family_replays_allocate_nothing"), 64);
    let s = rt.stream();
    let w = s.clone_htod(&random_vec(&mut rng, 4 * row))?;
    let batches = (1..=4)
        .map(|rows| s.clone_htod(&random_vec(&mut rng, rows * row)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut family = ScaleRowsBuckets::capture(&rt, row, &w, row)?;
    for x in &batches {
        family.replay(x)?;
    }
    let counted = allocations_in(|| {
        for _ in 0..25 {
            for x in &batches {
                family.replay(x)?;
            }
        }
        Ok(())
    })?;
    assert_eq!(
        counted, 0,
        "allocations in 100 replays of batches of 1 to 4 rows"
    );

    // The last replay (4 rows) computed w * x.
    let x = &batches[3];
    let mut eager = s.alloc_zeros::<f32>(4 * row)?;
    scale(&rt, x, &w, &mut eager)?;
    let ours = s.clone_dtoh(&family.outputs().y)?;
    let diff = first_mismatch(&s.clone_dtoh(&eager)?, &ours);
    assert!(diff.is_none(), "replay differs from eager: {diff:?}");
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
