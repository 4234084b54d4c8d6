#!/usr/bin/env python3
"""PyTorch reference for examples/03-rng-fill.rs: fill 256 MiB of f32 with torch.rand and
torch.randn (in place, `out=`), GPU time per fill with CUDA events, median of 7 x 20.
Prints one JSON object per line: {"op": "rand", "ms": ...}."""
import json
import statistics

import torch

N = (256 << 20) // 4
ITERS, REPEATS = 20, 7


def gpu_ms(fn):
    per = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERS):
            fn()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / ITERS)
    return statistics.median(per)


buf = torch.empty(N, device="cuda", dtype=torch.float32)
torch.rand(N, device="cuda", out=buf)
torch.randn(N, device="cuda", out=buf)
torch.cuda.synchronize()
print(json.dumps({"op": "rand", "ms": gpu_ms(lambda: torch.rand(N, device="cuda", out=buf))}))
print(json.dumps({"op": "randn", "ms": gpu_ms(lambda: torch.randn(N, device="cuda", out=buf))}))
