#!/usr/bin/env python3
"""PyTorch reference for examples/24-allreduce-floor.rs: torch.distributed's all_reduce (NCCL
backend, one process per GPU) of f32 messages from 4 KiB to 16 MiB, eagerly and captured in a
torch.cuda.CUDAGraph, timed the way the Rust example times its own.

Figures per size: the GPU time of one operation from CUDA events recorded around each of
--iters back-to-back operations (p50, p99), and the host wall time per operation of such a
loop (median of 7 loops), the ranks aligned by a barrier before each loop; the slower rank's
figures. The graph holds one dist.all_reduce, captured after eager warmup calls on a side
stream (as torch.cuda.graph requires). The all-reduce runs in place on small integers, so
the sums stay exact; every rank checks the first result against the exact sum.

Prints, from rank 0, one benchmark record per size (bench_report::record::Record): bench
"allreduce", side "torch", workload "allreduce/<world>/<bytes>", shape {world, bytes},
eager_us and graph_us (p50), eager_p50_us, eager_p99_us, eager_loop_us, graph_p50_us,
graph_p99_us, graph_loop_us, nccl (PyTorch's NCCL version), check and agree.

The environment is passed through unchanged (NCCL_NVLS_ENABLE=0 stays as set).

Usage: python3 scripts/torch_allreduce.py [--world 2] [--kib 4,16,64] [--iters 2000]
"""
import argparse
import json
import os
import sys

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:
    print(f"skipped: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(0)

import torch_models as tm  # noqa: E402 (after the check that PyTorch is there)


def inputs(n, rank, dev):
    i = torch.arange(n, device=dev, dtype=torch.int64)
    return ((i * 7 + rank * 13) % 61).to(torch.float32)


def exact_sum(n, world, dev):
    return sum(inputs(n, r, dev) for r in range(world))


def percentile(v, p):
    v = sorted(v)
    k = max(1, min(len(v), -(-int(p * len(v)) // 100)))
    return v[k - 1]


HELD_CALLS = 200
HOLD_NS_PER_CALL = 40_000


def per_op(fn, iters):
    """GPU time (us) of each of `iters` calls, the GPU running them back to back: the time
    between events recorded before the first call and after each call; in batches of
    HELD_CALLS, the stream is held by torch.cuda._sleep while the host queues the batch (as
    workloads::timing::per_call_gpu_us does)."""
    cycles = 2.0e9  # per second: about the H200's SM clock; a slower clock holds longer
    out = []
    while len(out) < iters:
        calls = min(HELD_CALLS, iters - len(out))
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        torch.cuda._sleep(int(cycles * HOLD_NS_PER_CALL * calls / 1e9))
        ev[0].record()
        for e in ev[1:]:
            fn()
            e.record()
        torch.cuda.synchronize()
        out += [a.elapsed_time(b) * 1e3 for a, b in zip(ev, ev[1:])]
    return out


def loop_us(fn, iters):
    """Host wall time per call of a loop of `iters` calls (median of REPEATS), ranks aligned."""
    return tm.per_call_us(fn, iters, align=dist.barrier)


def measure(fn, iters):
    for _ in range(20):
        fn()
    samples = per_op(fn, iters)
    return [percentile(samples, 50), percentile(samples, 99), loop_us(fn, iters)]


def slower(a, b):
    return [max(x, y) for x, y in zip(a, b)]


def run_size(rank, world, kib, iters, dev):
    n = kib * 1024 // 4
    want = exact_sum(n, world, dev)
    # Correctness: one in-place all-reduce of this rank's input.
    y = inputs(n, rank, dev)
    dist.all_reduce(y)
    exact = bool(torch.equal(y, want))
    # Timing works on zeros: in place, the values stay what they are.
    buf = torch.zeros(n, device=dev)
    eager = measure(lambda: dist.all_reduce(buf), iters)

    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(buf)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        dist.all_reduce(buf)
    graphed = measure(g.replay, iters)
    # The graph's result, on fresh inputs copied in.
    buf.copy_(inputs(n, rank, dev))
    g.replay()
    torch.cuda.synchronize()
    exact = exact and bool(torch.equal(buf, want))

    mine = torch.tensor(eager + graphed + [0.0 if exact else 1.0], dtype=torch.float64, device=dev)
    all_ranks = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(all_ranks, mine)
    figures = [t.tolist() for t in all_ranks]
    e = figures[0][:3]
    gr = figures[0][3:6]
    for f in figures[1:]:
        e = slower(e, f[:3])
        gr = slower(gr, f[3:6])
    exact_all = all(f[6] == 0.0 for f in figures)
    del g
    return {
        "bench": "allreduce",
        "side": "torch",
        "workload": f"allreduce/{world}/{kib * 1024}",
        "what": f"all-reduce of {kib * 1024} bytes (f32, sum) on {world} GPUs",
        "shape": {"world": world, "bytes": kib * 1024},
        "eager_us": e[0],
        "graph_us": gr[0],
        "check": "every rank's result equals the exact sum",
        "agree": exact_all,
        "eager_p50_us": e[0],
        "eager_p99_us": e[1],
        "eager_loop_us": e[2],
        "graph_p50_us": gr[0],
        "graph_p99_us": gr[1],
        "graph_loop_us": gr[2],
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
    }


def worker(rank, world, kibs, iters, port):
    with tm.process_group(rank, world, port) as dev:
        for kib in kibs:
            row = run_size(rank, world, kib, iters, dev)
            if rank == 0:
                print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="processes (GPUs)")
    ap.add_argument("--kib", default="4,16,64,256,1024,4096,16384", help="sizes in KiB, comma-separated")
    ap.add_argument("--iters", type=int, default=2000, help="operations per loop")
    a = ap.parse_args()
    kibs = [int(k) for k in a.kib.split(",") if k.strip()]
    if not torch.cuda.is_available() or torch.cuda.device_count() < a.world:
        print(f"skipped: needs {a.world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        print("note: NCCL_NVLS_ENABLE is not 0 here; the GPU machine keeps it at 0", file=sys.stderr)
    mp.spawn(worker, args=(a.world, kibs, a.iters, tm.free_port()), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
