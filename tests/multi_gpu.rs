//! Collectives on two GPUs (feature `nccl`): captured on both ranks and replayed like the
//! eager calls; the multi-GPU failure modes as typed errors on every rank, never a hang.
//!
//! Every test is a `#[gpu_test(gpus = 2)]` given a `CommGroup` of two ranks, and runs one
//! thread per GPU through `CommGroup::run`; the harness runs them one at a time. Without a
//! CUDA driver they count as ignored (failed with `CUDA_GRAPH_REQUIRE_GPU=1`); on a machine
//! with one GPU as ignored, saying they need two (also with `CUDA_GRAPH_REQUIRE_GPU=1`: the
//! one-GPU machine runs the same suite). With two GPUs and no loadable libnccl they count as
//! ignored, and with `CUDA_GRAPH_REQUIRE_GPU=1` fail with the typed error, which says how to
//! make libnccl loadable (`scripts/with-nccl.sh`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use graph_runtime::cudarc::driver::CudaSlice;
use graph_runtime::nccl::{CollectiveError, CommGroup, Communicator, ReduceOp};
use graph_runtime::{cuda_graph, is_capturing, GraphError, Runtime};
use workloads::testing::gpu_test;

const N: usize = 1024;

/// Rank `rank`'s input: exact small integers, so sums and maxima are exact in f32.
fn input(rank: usize, shift: usize) -> Vec<f32> {
    (0..N)
        .map(|i| ((i * 7 + rank * 13 + shift) % 64) as f32)
        .collect()
}

// --- all four collectives, eager and captured ------------------------------------------

#[allow(clippy::too_many_arguments)] // one output per collective
#[cuda_graph(warmup = 2)]
fn four_collectives(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    sum: &mut CudaSlice<f32>,
    gathered: &mut CudaSlice<f32>,
    scattered: &mut CudaSlice<f32>,
    from_root: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, sum, ReduceOp::Sum)?;
    comm.all_gather(x, gathered)?;
    comm.reduce_scatter(x, scattered, ReduceOp::Max)?;
    rt.stream().memcpy_dtod(x, from_root)?;
    comm.broadcast(from_root, 1)?;
    Ok(())
}

/// The four outputs a rank should see when rank `r` holds `inputs[r]`.
fn expected(rank: usize, inputs: &[Vec<f32>]) -> [Vec<f32>; 4] {
    let sum = (0..N).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
    let gathered = inputs.concat();
    let half = N / inputs.len();
    let scattered = (rank * half..(rank + 1) * half)
        .map(|i| inputs.iter().map(|x| x[i]).fold(f32::MIN, f32::max))
        .collect();
    [sum, gathered, scattered, inputs[1].clone()]
}

#[gpu_test(gpus = 2)]
fn collectives_captured_on_both_ranks_replay_like_eager_calls(
    group: CommGroup,
) -> Result<(), GraphError> {
    group.run(&[0, 1], |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let x = s.clone_htod(&input(rank, 0))?;
        let mut outs = (
            s.alloc_zeros::<f32>(N)?,
            s.alloc_zeros::<f32>(2 * N)?,
            s.alloc_zeros::<f32>(N / 2)?,
            s.alloc_zeros::<f32>(N)?,
        );
        four_collectives(
            rt,
            &x,
            comm,
            &mut outs.0,
            &mut outs.1,
            &mut outs.2,
            &mut outs.3,
        )?;
        let eager = [
            s.clone_dtoh(&outs.0)?,
            s.clone_dtoh(&outs.1)?,
            s.clone_dtoh(&outs.2)?,
            s.clone_dtoh(&outs.3)?,
        ];
        let both: Vec<Vec<f32>> = (0..2).map(|r| input(r, 0)).collect();
        assert_eq!(
            eager,
            expected(rank, &both),
            "rank {rank}: eager collectives"
        );

        let mut graph =
            comm.capture(|| FourCollectivesGraph::capture(rt, &x, comm, N, 2 * N, N / 2, N))?;
        assert!(
            graph.info().nodes() >= 4,
            "rank {rank}: {}",
            graph.info().nodes()
        );
        // The same input: bitwise what the eager calls gave.
        let out = graph.replay(&x)?;
        let same = [
            s.clone_dtoh(out.sum)?,
            s.clone_dtoh(out.gathered)?,
            s.clone_dtoh(out.scattered)?,
            s.clone_dtoh(out.from_root)?,
        ];
        assert_eq!(same, eager, "rank {rank}: replay vs eager");
        // New inputs on both ranks, several replays.
        for shift in 1..4 {
            let host = input(rank, shift);
            let out = graph.replay(&host)?;
            let got = [
                s.clone_dtoh(out.sum)?,
                s.clone_dtoh(out.gathered)?,
                s.clone_dtoh(out.scattered)?,
                s.clone_dtoh(out.from_root)?,
            ];
            let all: Vec<Vec<f32>> = (0..2).map(|r| input(r, shift)).collect();
            assert_eq!(got, expected(rank, &all), "rank {rank}: replay {shift}");
        }
        Ok(())
    })?;
    Ok(())
}

// --- mixing graph and eager collectives --------------------------------------------------

#[cuda_graph(warmup = 1)]
fn summed(
    _rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, y, ReduceOp::Sum)
}

#[gpu_test(gpus = 2)]
fn eager_collectives_between_replays_keep_their_order(group: CommGroup) -> Result<(), GraphError> {
    group.run(&[0, 1], |comm| {
        let s = comm.runtime().stream();
        let rank = comm.rank();
        let x = s.clone_htod(&vec![rank as f32 + 1.0; N])?;
        let mut graph = comm.capture(|| SummedGraph::capture(comm.runtime(), &x, comm, N))?;
        let mut eager = s.clone_htod(&vec![10.0 * (rank as f32 + 1.0); N])?;
        for round in 0..5 {
            graph.launch()?;
            comm.all_reduce_in_place(&mut eager, ReduceOp::Sum)?;
            let y = s.clone_dtoh(graph.outputs().y)?;
            assert!(
                y.iter().all(|&v| v == 3.0),
                "rank {rank} round {round}: {}",
                y[0]
            );
        }
        let e = s.clone_dtoh(&eager)?;
        assert!(e.iter().all(|&v| v == 30.0 * 16.0), "rank {rank}: {}", e[0]);
        Ok(())
    })?;
    Ok(())
}

// --- the failure modes -------------------------------------------------------------------

/// One all-reduce, plus a second one while capturing when `extra`, and an error while
/// capturing when `fail`: rank-dependent bodies that would hang without the checks.
#[cuda_graph(warmup = 2)]
fn planted(
    _rt: &Runtime,
    #[state] comm: &Communicator,
    #[state] buf: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    #[constant] count: usize,
    #[constant] extra: bool,
    #[constant] fail: bool,
) -> Result<(), GraphError> {
    comm.all_reduce(
        &buf.slice(..count),
        &mut y.slice_mut(..count),
        ReduceOp::Sum,
    )?;
    if extra && is_capturing() {
        comm.all_reduce_in_place(y, ReduceOp::Max)?;
    }
    if fail && is_capturing() {
        return Err(GraphError::User("a planted failure on this rank".into()));
    }
    Ok(())
}

/// What each rank's `comm.capture` of `planted` returned: `None` when it succeeded. Runs
/// the group's ranks (a group runs once: its ranks join it once).
fn capture_planted(
    group: &CommGroup,
    plant: impl Fn(usize) -> (usize, bool, bool, bool) + Sync,
) -> Result<Vec<Option<GraphError>>, GraphError> {
    group.run(&[0, 1], |comm| {
        let (count, extra, fail, skip) = plant(comm.rank());
        if skip {
            return Ok(None);
        }
        let rt = comm.runtime();
        let buf = rt.stream().clone_htod(&vec![1.0f32; N])?;
        let captured =
            comm.capture(|| PlantedGraph::capture(rt, comm, &buf, N, count, extra, fail));
        Ok(captured.err())
    })
}

fn collective(e: &Option<GraphError>) -> &CollectiveError {
    e.as_ref()
        .and_then(GraphError::collective)
        .unwrap_or_else(|| panic!("expected a collective error, got {e:?}"))
}

#[gpu_test(gpus = 2)]
fn a_planted_capture_mismatch_is_a_typed_error_not_a_hang(
    group: CommGroup,
) -> Result<(), GraphError> {
    let started = Instant::now();
    // Rank 1 records a second all-reduce only while capturing: the warmup runs agree, the
    // captures do not.
    let errors = capture_planted(&group, |rank| (N, rank == 1, false, false))?;
    for (rank, e) in errors.iter().enumerate() {
        let CollectiveError::Mismatch {
            at,
            first,
            second,
            in_capture,
        } = collective(e)
        else {
            panic!("rank {rank}: expected a mismatch, got {e:?}");
        };
        assert!(*in_capture);
        assert_eq!(at, "in the capture of `planted`, collective #2");
        assert!(first.1.starts_with("recorded nothing more"), "{first:?}");
        assert!(
            second
                .1
                .starts_with("recorded all_reduce(max) of 1024 × f32"),
            "{second:?}"
        );
    }
    // Rank 1 reduces fewer elements: found before the warmup issues it. (A rank joins a
    // group once: a new group for the second case.)
    let group = CommGroup::new(2)?;
    let errors = capture_planted(&group, |rank| {
        (if rank == 1 { N / 2 } else { N }, false, false, false)
    })?;
    for e in &errors {
        assert!(
            matches!(
                collective(e),
                CollectiveError::Mismatch {
                    in_capture: false,
                    ..
                }
            ),
            "{e:?}"
        );
    }
    assert!(
        started.elapsed() < group.timeout() / 2,
        "no rank waited for the timeout"
    );
    Ok(())
}

#[gpu_test(gpus = 2)]
fn a_rank_that_fails_its_capture_stops_the_other(group: CommGroup) -> Result<(), GraphError> {
    let errors = capture_planted(&group, |rank| (N, false, rank == 1, false))?;
    assert!(
        errors[1]
            .as_ref()
            .is_some_and(|e| e.to_string().contains("a planted failure")),
        "{:?}",
        errors[1]
    );
    let CollectiveError::PeerFailed { peer, reason, .. } = collective(&errors[0]) else {
        panic!("rank 0: expected PeerFailed, got {:?}", errors[0]);
    };
    assert_eq!(*peer, 1);
    assert!(reason.contains("a planted failure"), "{reason}");
    Ok(())
}

#[gpu_test(gpus = 2)]
fn a_rank_that_never_captures_is_a_timeout(group: CommGroup) -> Result<(), GraphError> {
    group.set_timeout(Duration::from_secs(3));
    let started = Instant::now();
    let errors = capture_planted(&group, |rank| (N, false, false, rank == 1))?;
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(errors[1].is_none());
    let CollectiveError::Timeout { missing, at, .. } = collective(&errors[0]) else {
        panic!("rank 0: expected a timeout, got {:?}", errors[0]);
    };
    assert_eq!(missing, &[1]);
    assert_eq!(at, "before collective #1 of warmup run 1 of `planted`");
    Ok(())
}

#[gpu_test(gpus = 2)]
fn collectives_captured_without_comm_capture_are_refused(
    group: CommGroup,
) -> Result<(), GraphError> {
    let errors = group.run(&[0, 1], |comm| {
        let rt = comm.runtime();
        let buf = rt.stream().clone_htod(&vec![1.0f32; N])?;
        Ok(PlantedGraph::capture(rt, comm, &buf, N, N, false, false).err())
    })?;
    for e in &errors {
        assert!(
            matches!(collective(e), CollectiveError::OutsideCapture { .. }),
            "{e:?}"
        );
        let text = e.as_ref().unwrap().to_string();
        assert!(
            text.contains("comm.capture(|| PlantedGraph::capture(…))"),
            "{text}"
        );
    }
    Ok(())
}

#[gpu_test(gpus = 2)]
fn wrong_lengths_and_roots_are_refused_before_nccl_sees_them(
    group: CommGroup,
) -> Result<(), GraphError> {
    group.run(&[0, 1], |comm| {
        let s = comm.runtime().stream();
        let x = s.alloc_zeros::<f32>(N)?;
        let mut short = s.alloc_zeros::<f32>(N)?;
        let e = comm.all_gather(&x, &mut short).unwrap_err();
        assert!(
            matches!(e.collective(), Some(CollectiveError::Shape { .. })),
            "{e}"
        );
        let e = comm.broadcast(&mut short, 2).unwrap_err();
        assert!(
            matches!(e.collective(), Some(CollectiveError::RankOutOfRange { .. })),
            "{e}"
        );
        // The communicator still works afterwards.
        comm.all_reduce_in_place(&mut short, ReduceOp::Sum)?;
        s.synchronize()?;
        Ok(())
    })?;
    Ok(())
}

fn main() -> ExitCode {
    workloads::testing::run_tests()
}
