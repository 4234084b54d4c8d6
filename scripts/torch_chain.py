#!/usr/bin/env python3
"""PyTorch reference for examples/02-chain.rs: the same chain of N tiny kernels.

For each N given on the command line (default 10 100 1000 10000) prints one JSON record,
the same workload, description and shape as the Rust example's record of that chain:
    {"bench": "chain", "side": "torch", "workload": "chain/N", "what": ..., "shape": {...},
     "eager_us": <whole chain>, "graph_us": <one replay>, "replay_host_us": ..., "capture_ms": ...}
measured like the Rust example: median of 7, each measurement about 20 ms of back-to-back
calls then one sync, a replay being `static_x.copy_(src)` + `graph.replay()`.
"""
import json
import statistics
import sys
import time

try:
    import torch
except ImportError as e:  # the report treats this as "PyTorch not installed", not a failure
    print(f"skipped: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(0)

from torch_models import wall_us  # same directory: one timing loop for both scripts

ELEMS = 256
REPEATS = 7


def chain(x, n):
    y = x + 1.0
    for _ in range(n - 1):
        y.add_(1.0)
    return y


def host_per_call(fn, burst):
    per = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(burst):
            fn()
        per.append((time.perf_counter() - t) * 1e6 / burst)
        torch.cuda.synchronize()
    return statistics.median(per)


def main():
    ns = [int(a) for a in sys.argv[1:]] or [10, 100, 1000, 10000]
    src = torch.arange(ELEMS, device="cuda", dtype=torch.float32)
    for n in ns:
        iters = max(3, min(2000, 20_000 // n))  # about 20 ms of replays per measurement
        eager = wall_us(lambda: chain(src, n), max(2, (iters + 3) // 4))

        static_x = src.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                chain(static_x, n)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        t = time.perf_counter()
        with torch.cuda.graph(g):
            static_y = chain(static_x, n)
        torch.cuda.synchronize()
        capture_ms = (time.perf_counter() - t) * 1e3

        def replay():
            static_x.copy_(src)
            g.replay()

        replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, src + n), "torch graph replay is wrong"
        graph = wall_us(replay, iters)
        host = host_per_call(replay, burst=max(4, min(16, 40_000 // n)))
        record = {"bench": "chain", "side": "torch", "workload": f"chain/{n}",
                  "what": f"chain of {n} tiny kernels", "shape": {"kernels_n": n},
                  "eager_us": eager, "graph_us": graph, "replay_host_us": host,
                  "capture_ms": capture_ms}
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
