#!/usr/bin/env python3
"""PyTorch reference for examples/11-data-parallel-train.rs: the same data-parallel training
step with DistributedDataParallel on 2 GPUs, eager and captured whole with torch.cuda.graph.

Model and step as in the Rust example: MLP 64-256-256-16 (GELU tanh), MSE, gradients
all-reduced by DDP (averaged), clip_grad_norm_(1.0), AdamW(lr 1e-3, betas (0.9, 0.999),
eps 1e-8, weight decay 0.01, capturable), each rank on its half of mini-batch `step % 8`
chosen on the device by a step counter, so one graph serves every step.

Started with torch.multiprocessing (one process per GPU, NCCL backend); no torchrun needed.
The DDP wrapper is built, warmed up (11 steps, as DDP needs) and captured on one side
stream: built on the default stream, its gradient hooks would make the capture fail with
CUDA error 906 (see shared/seeds/capture-failures.txt, "DistributedDataParallel").

Prints, from rank 0, one benchmark record per batch size (bench_report::record::Record, the
format of the Rust example's `--json` lines): bench "ddp_train", side "torch", workload
"ddp_train/<batch>", shape {world, batch, global_batch, dims, steps}, eager_us, graph_us,
check and agree (the 200-step loss curves of eager and graph bitwise equal), eager_gpu_us,
graph_gpu_us, loss_first, loss_last. Times: median of 7 runs of --iters back-to-back steps
then one synchronize, in microseconds per step, the slower rank; GPU times from CUDA events.

The environment is passed through unchanged (NCCL_NVLS_ENABLE=0 stays as set).

Usage: python3 scripts/torch_ddp.py [--batches 8,32,128] [--iters 200] [--world 2]
"""
import argparse
import json
import os
import sys

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    print(f"skipped: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(0)

import torch_models as tm  # noqa: E402 (after the check that PyTorch is there)

DIMS = [64, 256, 256, 16]
BATCHES = 8
STEPS = 200
WARMUP = 11


def mlp():
    """The model on the host (each rank loads it onto its GPU)."""
    return tm.make_mlp(DIMS, device="cpu")


def timed(fn, iters, stream):
    """Median host wall time per call (us), the ranks aligned before each run."""
    return tm.per_call_us(fn, iters, align=dist.barrier, stream=stream)


def gpu_timed(fn, iters, stream):
    """Median GPU time per call (us) from CUDA events around the calls."""
    return tm.per_call_us(fn, iters, gpu=True, align=dist.barrier, stream=stream)


class Trainer:
    """One rank's model (DDP), optimizer, data set and step counter, built on `stream`."""

    def __init__(self, rank, world, batch, dev, stream, init_state, xs, ts):
        self.dev, self.stream = dev, stream
        with torch.cuda.stream(stream):
            model = mlp().to(dev)
            model.load_state_dict(init_state)
            self.net = DDP(model, device_ids=[dev.index])
            self.opt = torch.optim.AdamW(
                self.net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                weight_decay=0.01, capturable=True, foreach=True)
            self.xs, self.ts = xs, ts
            self.step = torch.zeros((), dtype=torch.int64, device=dev)
            self.losses = torch.zeros(STEPS, device=dev)
            self.rows = torch.arange(batch, device=dev) + rank * batch
            self.global_rows = world * batch

    def body(self):
        """One step; the gradients must be None before it (they are written, not added)."""
        k = torch.remainder(self.step, BATCHES)
        idx = self.rows + k * self.global_rows
        x = self.xs.index_select(0, idx)
        t = self.ts.index_select(0, idx)
        loss = F.mse_loss(self.net(x), t)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0, foreach=True)
        self.opt.step()
        self.losses.index_copy_(0, self.step.clamp(max=STEPS - 1).view(1), loss.detach().view(1))
        self.step.add_(1)

    def eager_step(self):
        self.opt.zero_grad(set_to_none=True)
        self.body()

    def run(self, steps):
        """`steps` eager steps on the trainer's stream, then a synchronize."""
        with torch.cuda.stream(self.stream):
            for _ in range(steps):
                self.eager_step()
        torch.cuda.synchronize()

    def reset(self, init_state):
        with torch.cuda.stream(self.stream):
            with torch.no_grad():
                self.net.module.load_state_dict(init_state)
            for group in self.opt.param_groups:
                for p in group["params"]:
                    st = self.opt.state.get(p)
                    if st:
                        st["exp_avg"].zero_()
                        st["exp_avg_sq"].zero_()
                        st["step"].zero_()
            self.step.zero_()
            self.losses.zero_()


def run_batch(rank, world, batch, iters, dev):
    gen = torch.Generator().manual_seed(11)
    torch.manual_seed(0)
    init_state = {k: v.to(dev) for k, v in mlp().state_dict().items()}
    teacher = mlp()
    with torch.no_grad():
        for p in teacher.parameters():
            p.mul_(4.0)
        rows = BATCHES * world * batch
        xs_cpu = torch.rand(rows, DIMS[0], generator=gen) * 2 - 1
        ts_cpu = teacher(xs_cpu)
    xs, ts = xs_cpu.to(dev), ts_cpu.to(dev)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))

    # Eager: 200 steps, the loss curve.
    eager = Trainer(rank, world, batch, dev, stream, init_state, xs, ts)
    eager.run(STEPS)
    eager_losses = eager.losses.clone()

    # Graph: warm up on the side stream, capture on it, restart, 200 replays.
    graphed = Trainer(rank, world, batch, dev, stream, init_state, xs, ts)
    graphed.run(WARMUP)
    graph = torch.cuda.CUDAGraph()
    graphed.opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph, stream=stream):
        graphed.body()
    torch.cuda.synchronize()
    graphed.reset(init_state)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for _ in range(STEPS):
            graph.replay()
    torch.cuda.synchronize()
    graph_losses = graphed.losses.clone()

    # The loss averaged over the ranks, as the Rust example reports it.
    for curve in (eager_losses, graph_losses):
        dist.all_reduce(curve, op=dist.ReduceOp.AVG)
    agree = bool(torch.equal(eager_losses, graph_losses))

    times = torch.tensor([
        timed(eager.eager_step, iters, stream),
        timed(graph.replay, iters, stream),
        gpu_timed(eager.eager_step, iters, stream),
        gpu_timed(graph.replay, iters, stream),
    ], device=dev, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    eager_us, graph_us, eager_gpu_us, graph_gpu_us = times.tolist()
    dims = "-".join(map(str, DIMS))
    return {
        "bench": "ddp_train",
        "side": "torch",
        "workload": f"ddp_train/{batch}",
        "what": f"data-parallel train step MLP {dims}, batch {batch} per rank, {world} GPUs (PyTorch DDP)",
        "shape": {
            "world": world,
            "batch": batch,
            "global_batch": world * batch,
            "dims": dims,
            "steps": STEPS,
        },
        "eager_us": eager_us,
        "graph_us": graph_us,
        "check": f"{STEPS}-step loss curves bitwise, eager vs torch.cuda.graph",
        "agree": agree,
        "eager_gpu_us": eager_gpu_us,
        "graph_gpu_us": graph_gpu_us,
        "loss_first": float(eager_losses[0]),
        "loss_last": float(eager_losses[STEPS - 1]),
    }


def worker(rank, world, batches, iters, port):
    with tm.process_group(rank, world, port) as dev:
        for batch in batches:
            row = run_batch(rank, world, batch, iters, dev)
            if rank == 0:
                print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="8,32,128", help="batch sizes per rank, comma-separated")
    ap.add_argument("--iters", type=int, default=200, help="steps per timing run")
    ap.add_argument("--world", type=int, default=2, help="processes (GPUs)")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",") if b.strip()]
    if not torch.cuda.is_available() or torch.cuda.device_count() < a.world:
        print(f"skipped: needs {a.world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        print("note: NCCL_NVLS_ENABLE is not 0 here; the GPU machine keeps it at 0", file=sys.stderr)
    mp.spawn(worker, args=(a.world, batches, a.iters, tm.free_port()), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
