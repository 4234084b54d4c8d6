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
use graph_runtime::half::bf16;
use graph_runtime::nccl::{
    CollectiveError, CommGroup, Communicator, ReduceOp, SymmetricBuffer, MIN_NCCL_SYMMETRIC,
};
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

// --- symmetric buffers --------------------------------------------------------------------

/// Copies the input into a symmetric buffer, all-reduces it into another and copies the sum
/// out: how a body feeds NCCL's symmetric kernels from ordinary inputs.
#[cuda_graph(warmup = 2)]
fn symmetric_sum(
    rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    #[state(no_restore)] send: &mut SymmetricBuffer<f32>,
    #[state(no_restore)] recv: &mut SymmetricBuffer<f32>,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    rt.stream().memcpy_dtod(x, send)?;
    comm.all_reduce(send, recv, ReduceOp::Sum)?;
    rt.stream().memcpy_dtod(recv, y)?;
    Ok(())
}

/// Whether this NCCL has symmetric windows (the tests below say so and pass when not).
fn has_symmetric(group: &CommGroup) -> bool {
    let ok = group.nccl_version() >= MIN_NCCL_SYMMETRIC;
    if !ok {
        eprintln!(
            "NCCL {} has no symmetric windows (needs {MIN_NCCL_SYMMETRIC}); nothing to check",
            group.nccl_version()
        );
    }
    ok
}

#[gpu_test(gpus = 2)]
fn symmetric_buffers_reduce_in_a_graph_like_eager_calls(
    group: CommGroup,
) -> Result<(), GraphError> {
    if !has_symmetric(&group) {
        return Ok(());
    }
    group.run(&[0, 1], |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let mut send = comm.symmetric_buffer::<f32>(N)?;
        let mut recv = comm.symmetric_buffer::<f32>(N)?;
        // Eagerly, a symmetric buffer is an ordinary buffer to the collectives.
        let x = s.clone_htod(&input(rank, 0))?;
        let mut y = s.alloc_zeros::<f32>(N)?;
        symmetric_sum(rt, &x, comm, &mut send, &mut recv, &mut y)?;
        let want = |shift| expected(rank, &[input(0, shift), input(1, shift)])[0].clone();
        assert_eq!(s.clone_dtoh(&y)?, want(0), "rank {rank}: eager");

        let mut graph =
            comm.capture(|| SymmetricSumGraph::capture(rt, &x, comm, &mut send, &mut recv, N))?;
        // New inputs before every replay: the graph reads them, sums them over the ranks.
        for shift in [3, 11, 5, 0] {
            let x = s.clone_htod(&input(rank, shift))?;
            let got = s.clone_dtoh(graph.replay(&x)?.y)?;
            assert_eq!(
                got,
                want(shift),
                "rank {rank}: replay with inputs shifted by {shift}"
            );
        }
        Ok(())
    })?;
    Ok(())
}

#[gpu_test(gpus = 2)]
fn symmetric_buffers_of_different_sizes_are_refused_on_every_rank(
    group: CommGroup,
) -> Result<(), GraphError> {
    if !has_symmetric(&group) {
        return Ok(());
    }
    group.set_timeout(Duration::from_secs(10));
    let started = Instant::now();
    let errors = group.run(&[0, 1], |comm| {
        let len = N * (comm.rank() + 1);
        let refused = comm.symmetric_buffer::<f32>(len).err();
        // The group still works: the same size on both ranks, used eagerly.
        let mut both = comm.symmetric_buffer::<f32>(N)?;
        comm.all_reduce_in_place(&mut both, ReduceOp::Sum)?;
        comm.runtime().stream().synchronize()?;
        comm.barrier()?;
        Ok(refused)
    })?;
    assert!(started.elapsed() < Duration::from_secs(60));
    for (rank, e) in errors.iter().enumerate() {
        let CollectiveError::Mismatch { first, second, .. } = collective(e) else {
            panic!("rank {rank}: expected a mismatch, got {e:?}");
        };
        assert_eq!(first.1, format!("asks for {} bytes", 4 * N), "rank {rank}");
        assert_eq!(second.1, format!("asks for {} bytes", 8 * N), "rank {rank}");
    }
    Ok(())
}

/// A helper that asks for a symmetric buffer: in a body the macro refuses the call (rule
/// `collective-setup-in-body`), so a helper is where the runtime's own refusal is the net.
fn symmetric_in_helper(comm: &Communicator) -> Result<SymmetricBuffer<f32>, GraphError> {
    comm.symmetric_buffer::<f32>(N)
}

/// Asks for a symmetric buffer while being captured (through a helper the macro does not
/// see): set-up that cannot be recorded.
#[cuda_graph(warmup = 1)]
fn registers_inside(
    _rt: &Runtime,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    let mut inside = symmetric_in_helper(comm)?;
    comm.all_reduce(&inside.as_view(), &mut *y, ReduceOp::Sum)?;
    comm.all_reduce_in_place(&mut inside, ReduceOp::Sum)
}

#[gpu_test(gpus = 2)]
fn a_symmetric_buffer_asked_for_inside_a_capture_is_refused(
    group: CommGroup,
) -> Result<(), GraphError> {
    if !has_symmetric(&group) {
        return Ok(());
    }
    let errors = group.run(&[0, 1], |comm| {
        let rt = comm.runtime();
        Ok(comm
            .capture(|| RegistersInsideGraph::capture(rt, comm, N))
            .err())
    })?;
    for e in &errors {
        assert!(
            matches!(
                collective(e),
                CollectiveError::SetupInCapture {
                    op: "Communicator::symmetric_buffer",
                    graph: "registers_inside"
                }
            ),
            "{e:?}"
        );
    }
    Ok(())
}

// --- the one-shot all-reduce ---------------------------------------------------------------

/// `y = Σ x` over the ranks, and the same in place in `z`.
#[cuda_graph(warmup = 2)]
fn sum_both_ways(
    _rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<f32>,
    #[state(no_restore)] z: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, y, ReduceOp::Sum)?;
    comm.all_reduce_in_place(z, ReduceOp::Sum)
}

/// Every rank's random inputs for one replay, from one seed: rank r's are `all[r]`.
fn random_inputs(seed: u64, world: usize, n: usize) -> Vec<Vec<f32>> {
    let mut rng = workloads::testing::seeded_rng(seed);
    (0..world)
        .map(|_| workloads::testing::random_vec(&mut rng, n))
        .collect()
}

/// Runs `sum_both_ways` eagerly and as a graph replayed with new random inputs, on a group
/// whose one-shot limit is `limit`; returns each rank's outputs (eager y, then each replay's
/// y and z).
fn sums_with_limit(limit: usize, n: usize, seed: u64) -> Result<Vec<Vec<Vec<f32>>>, GraphError> {
    let group = CommGroup::new(2)?;
    group.set_one_shot_limit(limit);
    group.run(&[0, 1], |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let mut outs = Vec::new();
        let first = random_inputs(seed, 2, n);
        let x = s.clone_htod(&first[rank])?;
        let mut y = s.alloc_zeros::<f32>(n)?;
        let mut z = s.clone_htod(&first[rank])?;
        sum_both_ways(rt, &x, comm, &mut y, &mut z)?;
        outs.push(s.clone_dtoh(&y)?);
        outs.push(s.clone_dtoh(&z)?);
        let mut graph = comm.capture(|| SumBothWaysGraph::capture(rt, &x, comm, n, &mut z))?;
        for replay in 1..=4u64 {
            let fresh = random_inputs(seed + replay, 2, n);
            let x = s.clone_htod(&fresh[rank])?;
            s.memcpy_htod(&fresh[rank], &mut graph.state_mut().z)?;
            let y = s.clone_dtoh(graph.replay(&x)?.y)?;
            outs.push(y);
            outs.push(s.clone_dtoh(&graph.state_mut().z)?);
        }
        Ok(outs)
    })
}

#[gpu_test(gpus = 2)]
fn the_one_shot_all_reduce_equals_nccls_bitwise(_group: CommGroup) -> Result<(), GraphError> {
    // Sizes around the kernel's grid and the limit: one element, a ragged size, the whole
    // default limit, and one element more (NCCL's again).
    let limit = graph_runtime::nccl::DEFAULT_ONE_SHOT_LIMIT;
    for n in [1, 1000, 12_345, limit / 4, limit / 4 + 1] {
        let seed = 7000 + n as u64;
        let one_shot = sums_with_limit(limit, n, seed)?;
        let nccl = sums_with_limit(0, n, seed)?;
        // With two ranks a sum is a + b in either order: both paths give the same bits.
        assert_eq!(one_shot[0], one_shot[1], "n = {n}: the ranks differ");
        for (i, (a, b)) in one_shot[0].iter().zip(&nccl[0]).enumerate() {
            assert!(
                workloads::check::first_mismatch(a, b).is_none(),
                "n = {n}, output {i}: one-shot and NCCL differ"
            );
        }
        // And against the host.
        let inputs = random_inputs(seed, 2, n);
        let want: Vec<f32> = (0..n).map(|i| inputs[0][i] + inputs[1][i]).collect();
        assert!(
            workloads::check::first_mismatch(&one_shot[0][0], &want).is_none(),
            "n = {n}"
        );
    }
    Ok(())
}

/// `y = Σ x` over the ranks in `bf16` (tensor-parallel decoders' partial sums).
#[cuda_graph(warmup = 2)]
fn sum_bf16(
    _rt: &Runtime,
    x: &CudaSlice<bf16>,
    #[state] comm: &Communicator,
    y: &mut CudaSlice<bf16>,
) -> Result<(), GraphError> {
    comm.all_reduce(x, y, ReduceOp::Sum)
}

/// `sum_bf16` eagerly, then as a graph replayed with new random inputs, on a group whose
/// one-shot limit is `limit`: each rank's outputs (eager, then each replay), as bits.
fn bf16_sums_with_limit(
    limit: usize,
    n: usize,
    seed: u64,
) -> Result<Vec<Vec<Vec<u16>>>, GraphError> {
    let group = CommGroup::new(2)?;
    group.set_one_shot_limit(limit);
    let bits = |v: Vec<bf16>| v.into_iter().map(bf16::to_bits).collect::<Vec<u16>>();
    group.run(&[0, 1], |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let mut outs = Vec::new();
        let x = s.clone_htod(&bf16_inputs(seed, n)[rank])?;
        let mut y = s.alloc_zeros::<bf16>(n)?;
        sum_bf16(rt, &x, comm, &mut y)?;
        outs.push(bits(s.clone_dtoh(&y)?));
        let mut graph = comm.capture(|| SumBf16Graph::capture(rt, &x, comm, n))?;
        for replay in 1..=3u64 {
            let x = s.clone_htod(&bf16_inputs(seed + replay, n)[rank])?;
            outs.push(bits(s.clone_dtoh(graph.replay(&x)?.y)?));
        }
        Ok(outs)
    })
}

/// Two ranks' random `bf16` inputs, of mixed magnitudes (so that sums round).
fn bf16_inputs(seed: u64, n: usize) -> Vec<Vec<bf16>> {
    random_inputs(seed, 2, n)
        .into_iter()
        .enumerate()
        .map(|(r, v)| {
            let v = v.into_iter().enumerate();
            v.map(|(i, x)| bf16::from_f32(x * [1.0, 37.0, 1e-3][(i + r) % 3]))
                .collect()
        })
        .collect()
}

#[gpu_test(gpus = 2)]
fn the_one_shot_bf16_sum_equals_nccls_bitwise(_group: CommGroup) -> Result<(), GraphError> {
    let limit = graph_runtime::nccl::DEFAULT_ONE_SHOT_LIMIT;
    // One element, a ragged size, a Llama-8B hidden state, the whole limit, two more (NCCL).
    for n in [1, 999, 4096, limit / 2, limit / 2 + 2] {
        let seed = 9000 + n as u64;
        let one_shot = bf16_sums_with_limit(limit, n, seed)?;
        assert_eq!(one_shot[0], one_shot[1], "n = {n}: the ranks differ");
        // Two bf16 values sum exactly in f32 or round far from a bf16 tie: one rounding,
        // the same bits as NCCL's bf16 sum. (NCCL 2.28's LL kernel reads an odd count of bf16
        // in 4-byte words, 2 bytes past the end of the buffer, which compute-sanitizer
        // reports: odd counts are checked against the exact sum only.)
        if n % 2 == 0 {
            let nccl = bf16_sums_with_limit(0, n, seed)?;
            assert_eq!(one_shot[0], nccl[0], "n = {n}: one-shot and NCCL differ");
        }
        for (k, got) in one_shot[0].iter().enumerate() {
            let inputs = bf16_inputs(seed + k as u64, n);
            let want: Vec<u16> = (0..n)
                .map(|i| bf16::from_f32(inputs[0][i].to_f32() + inputs[1][i].to_f32()).to_bits())
                .collect();
            assert_eq!(got, &want, "n = {n}, output {k}: not the rounded sum");
        }
    }
    Ok(())
}

#[gpu_test(gpus = 2)]
fn a_one_shot_all_reduce_whose_peer_never_comes_gives_up_instead_of_hanging(
    group: CommGroup,
) -> Result<(), GraphError> {
    group.set_timeout(Duration::from_secs(2));
    let started = Instant::now();
    let outs = group.run(&[0, 1], |comm| {
        let s = comm.runtime().stream();
        let mut y = s.clone_htod(&vec![1.0f32; N])?;
        if comm.rank() == 0 {
            // Rank 1 never makes this call: NCCL would wait on the GPU forever.
            comm.all_reduce_in_place(&mut y, ReduceOp::Sum)?;
        }
        Ok(s.clone_dtoh(&y)?)
    })?;
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(
        outs[0].iter().all(|v| v.is_nan()),
        "rank 0 gave up: its output is NaN"
    );
    assert!(outs[1].iter().all(|&v| v == 1.0));
    let logged = workloads::testing::logged_errors();
    assert!(
        logged
            .iter()
            .any(|l| l.contains("gave up waiting for the other ranks")),
        "{logged:?}"
    );
    Ok(())
}

// --- a torture run ------------------------------------------------------------------------

/// An all-gather and a sum too large for the one-shot kernel (NCCL's): the other kind of
/// graph the torture run serves.
#[cuda_graph(warmup = 1)]
fn gather_and_big_sum(
    _rt: &Runtime,
    x: &CudaSlice<f32>,
    #[state] comm: &Communicator,
    gathered: &mut CudaSlice<f32>,
    #[state(no_restore)] big: &mut CudaSlice<f32>,
) -> Result<(), GraphError> {
    comm.all_gather(x, gathered)?;
    comm.all_reduce_in_place(big, ReduceOp::Sum)
}

/// Small integers for rank `rank` from `seed`: sums over ranks are exact in any order.
fn ints(seed: u64, rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((seed as usize).wrapping_mul(31) + i * 7 + rank * 13) % 61)
        .map(|v| v as f32)
        .collect()
}

fn int_sum(seed: u64, world: usize, n: usize) -> Vec<f32> {
    let mut sum = vec![0.0f32; n];
    for r in 0..world {
        for (s, v) in sum.iter_mut().zip(ints(seed, r, n)) {
            *s += v;
        }
    }
    sum
}

/// What one rank did in the torture run.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    replays: usize,
    eager: usize,
    captures: usize,
    drops: usize,
    checks: usize,
}

/// Sizes of the sum graphs: one-shot (small), at the one-shot limit, and NCCL's (above).
const TORTURE_SIZES: [usize; 4] = [256, 4096, 65_536, 70_000];
/// Elements of the large in-place sum of `gather_and_big_sum` (NCCL's).
const BIG: usize = 1 << 18;

#[gpu_test(gpus = 2)]
fn torture_replays_eager_collectives_captures_and_drops_never_hang(
    group: CommGroup,
) -> Result<(), GraphError> {
    use rand::{Rng, SeedableRng};
    let ops: usize = std::env::var("CUDA_GRAPH_MULTI_TORTURE_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let seed: u64 = std::env::var("CUDA_GRAPH_MULTI_TORTURE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    group.set_timeout(Duration::from_secs(30));
    let second = CommGroup::new(2)?;
    second.set_timeout(Duration::from_secs(30));
    let started = Instant::now();
    let tallies = group.run(&[0, 1], |comm| {
        let rt = comm.runtime();
        let s = rt.stream();
        let rank = comm.rank();
        let comm2 = second.join(rt, rank)?;
        // Both ranks draw the same decisions from the same seed.
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut t = Tally::default();
        let mut sums: Vec<(usize, bool, SummedGraph<'_>)> = Vec::new();
        let x0 = s.clone_htod(&ints(0, rank, BIG))?;
        let mut big = s.clone_htod(&ints(1, rank, BIG))?;
        let mut gather = None;
        let check = |what: &str, got: Vec<f32>, want: &[f32], t: &mut Tally| {
            assert!(
                workloads::check::first_mismatch(&got, want).is_none(),
                "rank {rank}: {what} differs from the exact result"
            );
            t.checks += 1;
        };
        for op in 0..ops {
            let input_seed = op as u64 + 100;
            match rng.random_range(0..10) {
                // Serve: replay a live sum graph with new inputs.
                0..=3 if !sums.is_empty() => {
                    let i = rng.random_range(0..sums.len());
                    let (n, _, graph) = &mut sums[i];
                    let x = s.clone_htod(&ints(input_seed, rank, *n))?;
                    let y = s.clone_dtoh(graph.replay(&x)?.y)?;
                    check("a replayed sum", y, &int_sum(input_seed, 2, *n), &mut t);
                    t.replays += 1;
                }
                // Eager collectives between replays, on either communicator.
                4 | 5 => {
                    let n = TORTURE_SIZES[rng.random_range(0..TORTURE_SIZES.len())];
                    let on = if rng.random_bool(0.5) { comm } else { &comm2 };
                    let mut y = s.clone_htod(&ints(input_seed, rank, n))?;
                    on.all_reduce_in_place(&mut y, ReduceOp::Sum)?;
                    check(
                        "an eager sum",
                        s.clone_dtoh(&y)?,
                        &int_sum(input_seed, 2, n),
                        &mut t,
                    );
                    t.eager += 1;
                }
                // A new shape arrives: capture its graph in the middle of serving.
                6 if sums.len() < 5 => {
                    let n = TORTURE_SIZES[rng.random_range(0..TORTURE_SIZES.len())];
                    let on_second = rng.random_bool(0.3);
                    let on = if on_second { &comm2 } else { comm };
                    let x = s.clone_htod(&ints(input_seed, rank, n))?;
                    let graph = on.capture(|| SummedGraph::capture(rt, &x, on, n))?;
                    sums.push((n, on_second, graph));
                    t.captures += 1;
                }
                // Drop a graph, in any order.
                7 if !sums.is_empty() => {
                    let i = rng.random_range(0..sums.len());
                    drop(sums.swap_remove(i));
                    t.drops += 1;
                }
                // The other kind of graph: an all-gather and NCCL's large sum.
                8 => {
                    if gather.is_none() {
                        let mut graph = comm.capture(|| {
                            GatherAndBigSumGraph::capture(rt, &x0, comm, 2 * BIG, &mut big)
                        })?;
                        // Its state starts from known values at every check below.
                        s.memcpy_htod(&ints(1, rank, BIG), &mut graph.state_mut().big)?;
                        gather = Some(graph);
                        t.captures += 1;
                    }
                    let graph = gather.as_mut().expect("captured above");
                    let checked = rng.random_bool(0.1);
                    if checked {
                        s.memcpy_htod(&ints(input_seed, rank, BIG), &mut graph.state_mut().big)?;
                    }
                    let x = s.clone_htod(&ints(input_seed + 1, rank, BIG))?;
                    let gathered = s.clone_dtoh(graph.replay(&x)?.gathered)?;
                    if checked {
                        let want =
                            [ints(input_seed + 1, 0, BIG), ints(input_seed + 1, 1, BIG)].concat();
                        check("a replayed all-gather", gathered, &want, &mut t);
                        let got = s.clone_dtoh(&graph.state_mut().big)?;
                        check(
                            "a replayed large sum",
                            got,
                            &int_sum(input_seed, 2, BIG),
                            &mut t,
                        );
                    }
                    t.replays += 1;
                }
                _ => {}
            }
        }
        // Whatever is left goes in a random order; the communicators after their graphs
        // (the borrows see to that), the second one first or last.
        while !sums.is_empty() {
            let i = rng.random_range(0..sums.len());
            drop(sums.swap_remove(i));
            t.drops += 1;
        }
        drop(gather);
        if rng.random_bool(0.5) {
            drop(comm2);
        } else {
            comm.barrier()?;
            drop(comm2);
        }
        Ok(t)
    })?;
    assert_eq!(tallies[0], tallies[1], "the ranks did different things");
    eprintln!(
        "torture: {ops} operations (seed {seed:#x}) in {:.1} s: {:?}",
        started.elapsed().as_secs_f64(),
        tallies[0]
    );
    Ok(())
}

// --- ranks in separate processes, started like torchrun starts them ------------------------

/// The environment variable that makes this test binary a rank of a multi-process test
/// instead of the test harness: its value is the role.
const CHILD: &str = "CUDA_GRAPH_TEST_CHILD";

/// Starts `world` copies of this binary as the ranks of a job, with torchrun's variables,
/// each in `role`; returns each rank's exit status and output, killing a rank still running
/// after a minute (a hang).
fn launch_ranks(world: usize, role: &str) -> Vec<(bool, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let exe = std::env::current_exe().expect("this test binary");
    let children: Vec<_> = (0..world)
        .map(|rank| {
            std::process::Command::new(&exe)
                .env(CHILD, role)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("a rank process")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    children
        .into_iter()
        .map(|mut child| {
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let hung = child.try_wait().ok().flatten().is_none();
            if hung {
                let _ = child.kill();
            }
            let out = child.wait_with_output().expect("the rank's output");
            let text = format!(
                "{}{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                if hung {
                    "\nHUNG: killed after 60 s"
                } else {
                    ""
                }
            );
            (out.status.success() && !hung, text)
        })
        .collect()
}

/// One rank of a multi-process test, in `role`; prints what it saw on its last line.
fn child_main(role: &str) -> Result<String, GraphError> {
    let launch = graph_runtime::nccl::Launch::from_env()?;
    let group = CommGroup::connect(&launch, Duration::from_secs(8))?;
    let rt = Runtime::new(launch.local_rank)?;
    let comm = group.join(&rt, launch.rank)?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let s = rt.stream();
    let all = |shift| (0..world).map(|r| input(r, shift)).collect::<Vec<_>>();
    let sum = |shift| {
        let [sum, ..] = expected(rank, &all(shift));
        sum
    };
    match role {
        "serve" => {
            // Eagerly, then captured together and replayed with new inputs.
            let x = s.clone_htod(&input(rank, 0))?;
            let mut y = s.alloc_zeros::<f32>(N)?;
            summed(&rt, &x, &comm, &mut y)?;
            assert_eq!(s.clone_dtoh(&y)?, sum(0), "rank {rank}: eager");
            let mut graph = comm.capture(|| SummedGraph::capture(&rt, &x, &comm, N))?;
            for shift in [5, 9, 2] {
                let x = s.clone_htod(&input(rank, shift))?;
                let got = s.clone_dtoh(graph.replay(&x)?.y)?;
                assert_eq!(got, sum(shift), "rank {rank}: replay with shift {shift}");
            }
            drop(graph);
            comm.barrier()?;
            Ok(format!("served: {world} ranks, eager and 3 replays exact"))
        }
        "mismatch" => {
            // The last rank records one more collective while capturing.
            let buf = s.clone_htod(&vec![1.0f32; N])?;
            let extra = rank + 1 == world;
            let Err(e) =
                comm.capture(|| PlantedGraph::capture(&rt, &comm, &buf, N, N, extra, false))
            else {
                panic!("the ranks' captures differ, yet rank {rank}'s succeeded");
            };
            match e.collective() {
                Some(CollectiveError::Mismatch { at, .. }) => Ok(format!("mismatch {at}")),
                _ => Err(e),
            }
        }
        "absent" => {
            // The last rank leaves after joining; the others must not wait forever.
            if rank + 1 == world {
                return Ok("left".to_owned());
            }
            let buf = s.clone_htod(&vec![1.0f32; N])?;
            let Err(e) =
                comm.capture(|| PlantedGraph::capture(&rt, &comm, &buf, N, N, false, false))
            else {
                panic!("a rank never came, yet rank {rank}'s capture succeeded");
            };
            match e.collective() {
                Some(CollectiveError::Timeout { .. } | CollectiveError::PeerFailed { .. }) => {
                    Ok(format!("gave up: {e}"))
                }
                _ => Err(e),
            }
        }
        other => panic!("unknown role {other}"),
    }
}

#[gpu_test(gpus = 2)]
fn ranks_started_as_processes_capture_replay_and_fail_together(
    _group: CommGroup,
) -> Result<(), GraphError> {
    let world = workloads::testing::usable_gpus()?.min(4);
    let started = Instant::now();
    for (role, want) in [
        ("serve", "served:"),
        (
            "mismatch",
            "mismatch in the capture of `planted`, collective #2",
        ),
    ] {
        let ranks = launch_ranks(world, role);
        for (rank, (ok, out)) in ranks.iter().enumerate() {
            let last = out
                .lines()
                .rev()
                .find(|l| l.starts_with("rank "))
                .unwrap_or("");
            assert!(
                *ok && last.contains(want),
                "{role}: rank {rank} of {world} said:\n{out}"
            );
        }
    }
    let ranks = launch_ranks(world, "absent");
    for (rank, (ok, out)) in ranks.iter().enumerate() {
        let want = if rank + 1 == world { "left" } else { "gave up" };
        assert!(
            *ok && out.contains(want),
            "absent: rank {rank} said:\n{out}"
        );
    }
    eprintln!(
        "{world} processes: serve, mismatch and absent in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> ExitCode {
    if let Ok(role) = std::env::var(CHILD) {
        workloads::testing::init_tracing();
        let rank = std::env::var("RANK").unwrap_or_default();
        return match child_main(&role) {
            Ok(said) => {
                println!("rank {rank}: {said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("rank {rank}: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    workloads::testing::run_tests()
}
