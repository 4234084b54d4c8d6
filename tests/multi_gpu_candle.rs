//! Collectives on candle tensors on two GPUs (features `nccl` and `candle`):
//! `Communicator::all_reduce_tensor` and `all_gather_tensor` eagerly and replayed in a graph
//! of candle code, against the host's sums, with new inputs between replays; tensors they
//! cannot take are refused with an error that says why, and the ranks stay usable.
//!
//! A tensor-parallel attention step (each rank's heads in its `StaticKvCache`, its slice of
//! the output projection held as `ModelState`, the partial outputs summed over the ranks)
//! replays like eager calls of it, position after position.
//!
//! Each test makes its own group and one thread per GPU with a candle device and
//! `Runtime::from_candle` (a candle model's set-up), rather than `CommGroup::run`.

use graph_runtime::candle::candle_core::{self as candle, DType, Device, Module, Tensor};
use graph_runtime::candle::{candle_nn, ModelState, StaticKvCache};
use graph_runtime::half::bf16;
use graph_runtime::nccl::{CommGroup, Communicator, ReduceOp};
use graph_runtime::{cuda_graph, BoxError, GraphError, Runtime};
use workloads::testing::{gpu_test, random_vec, seeded_rng};

/// Runs `f(rank, device, communicator)` on one thread per rank of a new group of two.
fn on_two_ranks<R: Send>(
    f: impl Fn(usize, &Device, &Communicator) -> Result<R, BoxError> + Sync,
) -> Result<Vec<R>, BoxError> {
    let group = CommGroup::new(2)?;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (group, f) = (&group, &f);
                s.spawn(move || -> Result<R, BoxError> {
                    let dev = Device::new_cuda(rank)?;
                    let rt = Runtime::from_candle(&dev)?;
                    let comm = group.join(&rt, rank)?;
                    f(rank, &dev, &comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    })
}

/// The partial sums of a tensor-parallel layer: the sum over the ranks, then every rank's
/// sum gathered (shape `(2 · rows, cols)`), and a `bf16` sum beside it.
#[cuda_graph(warmup = 2, verify = "never")]
fn reduce_then_gather(
    dev: &Device,
    x: &Tensor,
    h: &Tensor,
    #[state] comm: &Communicator,
) -> candle::Result<Tensor> {
    let _ = dev;
    let sum = comm.all_reduce_tensor(x, ReduceOp::Sum)?;
    let sum_bf16 = comm
        .all_reduce_tensor(h, ReduceOp::Sum)?
        .to_dtype(DType::F32)?;
    let both = Tensor::cat(&[&sum, &sum_bf16], 1)?;
    comm.all_gather_tensor(&both)
}

const ROWS: usize = 3;
const COLS: usize = 4096;

/// Rank `rank`'s inputs of replay `k`: `f32` and `bf16`, `(ROWS, COLS)` each.
fn inputs(k: u64, rank: usize) -> (Vec<f32>, Vec<bf16>) {
    let mut rng = seeded_rng(4242 + 17 * k + rank as u64);
    let x = random_vec(&mut rng, ROWS * COLS);
    let h = random_vec(&mut rng, ROWS * COLS)
        .into_iter()
        .map(|v| bf16::from_f32(v * 8.0))
        .collect();
    (x, h)
}

/// What every rank must get for replay `k`: `[sum_f32 | sum_bf16]` per row, twice.
fn expected(k: u64) -> Vec<f32> {
    let ((x0, h0), (x1, h1)) = (inputs(k, 0), inputs(k, 1));
    let mut rows = Vec::new();
    for r in 0..ROWS {
        let span = r * COLS..(r + 1) * COLS;
        rows.extend(span.clone().map(|i| x0[i] + x1[i]));
        rows.extend(span.map(|i| bf16::from_f32(h0[i].to_f32() + h1[i].to_f32()).to_f32()));
    }
    [rows.clone(), rows].concat()
}

fn tensors(dev: &Device, k: u64, rank: usize) -> candle::Result<(Tensor, Tensor)> {
    let (x, h) = inputs(k, rank);
    Ok((
        Tensor::from_vec(x, (ROWS, COLS), dev)?,
        Tensor::from_vec(h, (ROWS, COLS), dev)?,
    ))
}

#[gpu_test(gpus = 2)]
fn tensor_collectives_replay_like_eager_calls(_group: CommGroup) -> Result<(), GraphError> {
    let outs = on_two_ranks(|rank, dev, comm| {
        let rt = comm.runtime();
        let (x, h) = tensors(dev, 0, rank)?;
        let mut outs = vec![reduce_then_gather(dev, &x, &h, comm)?];
        let mut graph = comm.capture(|| ReduceThenGatherGraph::capture(rt, &x, &h, comm))?;
        for k in 1..=3 {
            let (x, h) = tensors(dev, k, rank)?;
            outs.push(graph.replay(&x, &h)?.result.copy()?);
        }
        // Eager again after the replays: the same communicator, in order.
        let (x, h) = tensors(dev, 4, rank)?;
        outs.push(reduce_then_gather(dev, &x, &h, comm)?);
        outs.iter()
            .map(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
            .collect::<Result<Vec<_>, BoxError>>()
    })
    .map_err(GraphError::User)?;
    for (k, (a, b)) in outs[0].iter().zip(&outs[1]).enumerate() {
        let want = expected(k as u64);
        assert_eq!(a.len(), 2 * ROWS * 2 * COLS, "the gathered shape");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(a),
            bits(&want),
            "call {k}: rank 0 is not the rounded sum"
        );
        assert_eq!(bits(a), bits(b), "call {k}: the ranks differ");
    }
    Ok(())
}

#[gpu_test(gpus = 2)]
fn tensors_the_collectives_cannot_take_are_refused_and_the_ranks_go_on(
    _group: CommGroup,
) -> Result<(), GraphError> {
    let outs = on_two_ranks(|rank, dev, comm| {
        let x = Tensor::from_vec(vec![rank as f32 + 1.0; 12], (3, 4), dev)?;
        let mut said = Vec::new();
        // A transposed view: not contiguous.
        let e = comm.all_reduce_tensor(&x.t()?, ReduceOp::Sum).unwrap_err();
        said.push(e.to_string());
        // A tensor on the CPU.
        let cpu = Tensor::zeros((3, 4), DType::F32, &Device::Cpu)?;
        let e = comm.all_gather_tensor(&cpu).unwrap_err();
        said.push(e.to_string());
        // Then a collective that works, on both ranks.
        let sum = comm.all_reduce_tensor(&x.contiguous()?, ReduceOp::Max)?;
        Ok((said, sum.flatten_all()?.to_vec1::<f32>()?))
    })
    .map_err(GraphError::User)?;
    for (said, sum) in outs {
        assert!(
            said[0].contains("not contiguous") && said[0].contains(".contiguous()"),
            "{}",
            said[0]
        );
        assert!(said[1].contains("on the CPU"), "{}", said[1]);
        assert_eq!(sum, vec![2.0; 12]);
    }
    Ok(())
}

/// One tensor-parallel attention step on a rank: its heads of `q`, `k`, `v` written into its
/// cache at `pos` and attended over the cache (the mask row of `pos`), then its columns of
/// the output projection, summed over the ranks.
#[allow(clippy::too_many_arguments)] // the step's inputs, then one state per role
#[cuda_graph(warmup = 2, verify = "never")]
fn tp_attention(
    dev: &Device,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pos: &Tensor,
    #[state] proj: &ModelState<candle_nn::Linear>,
    #[state] cache: &mut StaticKvCache,
    #[state] comm: &Communicator,
) -> candle::Result<Tensor> {
    let _ = dev;
    let at = cache.at(pos, 1)?;
    let (ck, cv) = cache.write(0, &at, k, v)?;
    let scale = 1.0 / (q.dim(3)? as f64).sqrt();
    let att = (q.matmul(&ck.t()?)? * scale)?.broadcast_add(at.mask())?;
    let att = candle_nn::ops::softmax_last_dim(&att)?;
    let (batch, heads, _, hd) = q.dims4()?;
    let o = att
        .matmul(&cv)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((batch, heads * hd))?;
    let partial = proj.model().forward(&o)?;
    comm.all_reduce_tensor(&partial, ReduceOp::Sum)
}

/// Pairs: modelstate × nccl, nccl × kvcache.
/// A tensor-parallel attention step on two ranks: each rank's `StaticKvCache` (`&mut` state)
/// and its slice of the output projection (`ModelState<Linear>`, its weight listed), the
/// partial outputs summed in the graph. Over 8 positions with new queries, keys and values
/// each, every replay equals the eager call that follows it on the same rank (its own cache),
/// bitwise, and both ranks hold the same sum.
#[gpu_test(gpus = 2)]
fn a_tensor_parallel_attention_step_with_model_state_and_a_static_cache_replays_like_eager(
    _group: CommGroup,
) -> Result<(), GraphError> {
    const STEPS: u32 = 8;
    let outs = on_two_ranks(|rank, dev, comm| {
        let rt = comm.runtime();
        let mut rng = seeded_rng(0x7a11 + rank as u64);
        let (batch, heads, max_len, hd, out) = (2, 2, 16, 16, 24);
        let mut random = |shape: (usize, usize, usize, usize)| {
            let n = shape.0 * shape.1 * shape.2 * shape.3;
            Tensor::from_vec(random_vec(&mut rng, n), shape, dev)
        };
        let w = random((1, 1, out, heads * hd))?.reshape((out, heads * hd))?;
        let proj = ModelState::new(candle_nn::Linear::new(w.clone(), None), [w]);
        let dims = (batch, heads, max_len, hd);
        let mut eager_cache = StaticKvCache::new(1, dims, DType::F32, dev)?;
        let pos = |p: u32| Tensor::from_vec(vec![p], 1, dev);
        let mut steps = Vec::new();
        for p in 0..=STEPS {
            let token = (batch, heads, 1, hd);
            steps.push((random(token)?, random(token)?, random(token)?, pos(p)?));
        }
        let (q0, k0, v0, p0) = &steps[0];
        let cache = StaticKvCache::new(1, dims, DType::F32, dev)?;
        let mut graph =
            comm.capture(|| TpAttentionGraph::capture(rt, q0, k0, v0, p0, &proj, cache, comm))?;
        let mut seen = Vec::new();
        for (q, k, v, p) in &steps[..STEPS as usize] {
            let ours = graph
                .replay(q, k, v, p)?
                .result
                .flatten_all()?
                .to_vec1::<f32>()?;
            let eager = tp_attention(dev, q, k, v, p, &proj, &mut eager_cache, comm)?;
            seen.push((ours, eager.flatten_all()?.to_vec1::<f32>()?));
        }
        Ok(seen)
    })
    .map_err(GraphError::User)?;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (rank, seen) in outs.iter().enumerate() {
        for (p, (ours, eager)) in seen.iter().enumerate() {
            assert_eq!(
                bits(ours),
                bits(eager),
                "rank {rank}, position {p}: graph vs eager"
            );
            assert_eq!(
                bits(ours),
                bits(&outs[0][p].0),
                "position {p}: the ranks' sums differ"
            );
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    workloads::testing::run_tests()
}
