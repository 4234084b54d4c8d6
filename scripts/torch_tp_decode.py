#!/usr/bin/env python3
"""PyTorch reference for tensor-parallel decoding: greedy decoding at batch 1 of a Llama-style
model with random weights, split Megatron-style over W GPUs (one process per GPU, NCCL
backend), eager and with the whole step captured once by torch.cuda.graph.

Configs (bf16 weights and activations; fp32 only for the logits, from the lm_head onwards):
  llama-1b  Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64,
            intermediate 8192, vocab 128256, tied embeddings (lm_head = embedding matrix)
  llama-8b  Llama-3.1-8B's shape: hidden 4096, 32 layers, 32 heads, 8 KV heads, head_dim 128,
            intermediate 14336, vocab 128256, untied lm_head
both with rope_theta 500000 (plain RoPE, rotate-half, no llama3 scaling) and RMSNorm eps 1e-5.

Per rank r of W: q, k and v column-parallel by heads (heads/W query heads, kv_heads/W KV
heads), fused into one [(heads/W + 2 kv_heads/W) head_dim, hidden] weight; o_proj
row-parallel, then dist.all_reduce (sum) of the [1, hidden] result and the residual add;
gate and up column-parallel (intermediate/W each), fused into one [2 intermediate/W, hidden]
weight (gate rows first), SiLU(gate) * up; down_proj row-parallel, then all_reduce and the
residual add. RMSNorm (F.rms_norm: bf16 in and out, weight ones) before attention, before the
MLP and at the end. The embedding is replicated; the lm_head is vocab-parallel (rank r holds
rows [r V/W, (r+1) V/W)): its bf16 logits slice is cast to fp32 and all_gather_into_tensor'd
into a [W, V/W] fp32 buffer, and every rank takes the argmax (the first maximum) of the full
logits as the next token. With W = 1 the step issues no collective.

Attention: a static bf16 KV cache per layer, [1, kv_local, tokens, head_dim]; RoPE on q and k
at the position (cos/sin tables of [tokens, head_dim] computed in fp32 and stored in bf16,
picked by the position tensor); k and v written at the position with index_copy_; then
F.scaled_dot_product_attention over the whole cache with an additive bf16 mask (-inf past the
position) built on the device from the position tensor. GQA by reshape: the query heads are
viewed as [1, kv_local, groups, head_dim], each KV head's `groups` query heads as rows of its
query (query head j reads KV head j // groups), so no K/V is repeated and enable_gqa is not
needed; the default scale 1/sqrt(head_dim). (torch 2.11 on an H200 runs it as cuDNN's flash kernel.)

Weights: normal(0, 0.02) bf16 made on the GPU. torch.manual_seed(1234) on every rank before
the replicated embedding (so it is the same everywhere), then torch.manual_seed(1234 + 1 + r)
before rank r's shards, so the ranks' shards differ as slices of one matrix would.

Decoding: --tokens (128) greedy tokens from token id 1 at position 0. The token and the
position live in device tensors: the step reads both, writes the next token into the token
tensor itself, records it at the position, and advances the position in place (pos += 1 inside
the step, so also inside the graph); nothing waits for the host in the loop. Eager: the step
called once per token. Graph: after 3 warmup steps on a side stream, the step captured once;
one replay per token. Before every generation the KV caches, the token and the position are
reset in place (outside the graph).

Times: the host wall time of a whole generation (synchronize before and after, the ranks
aligned by dist.barrier before each), per token in microseconds; the median of --runs
generations after one untimed one; the slower rank's. Checks: the untimed generations' tokens,
graph = eager (on the host), every rank's tokens equal (all_gather), the last logits finite.

Prints, from rank 0, one benchmark record per config and world size
(bench_report::record::Record): bench "tp_decode", side "torch", workload
"tp_decode/<config>/<W>gpu", shape {config, world, layers, hidden, heads, kv_heads,
intermediate, vocab, tokens, dtype}, eager_us, graph_us, check, agree, eager_tok_s,
graph_tok_s, first_tokens (the first 8 generated ids), torch, nccl, gpu. Progress goes to
stderr; stdout has the records alone. World sizes above the GPU count are skipped (stderr).

The environment is passed through unchanged (NCCL_NVLS_ENABLE=0 stays as set).

Usage: python3 scripts/torch_tp_decode.py [--config llama-1b|llama-8b|all] [--worlds 1,2,4]
       [--tokens 128] [--runs 3] [--layers N]
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
except ImportError as e:
    print(f"skipped: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(0)

import torch_models as tm  # noqa: E402 (after the check that PyTorch is there)

COMMON = dict(heads=32, kv_heads=8, vocab=128256, theta=500000.0, eps=1e-5)
CONFIGS = {
    "llama-1b": dict(COMMON, hidden=2048, layers=16, head_dim=64, intermediate=8192, tied=True),
    "llama-8b": dict(COMMON, hidden=4096, layers=32, head_dim=128, intermediate=14336, tied=False),
}
BOS = 1
SEED = 1234
STD = 0.02
WARMUP = 3
CHECK = "graph tokens = eager tokens; ranks equal; logits finite"


def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


class TPDecoder:
    """One rank's shards of the model, its KV cache and the decoding state, on `dev`."""

    def __init__(self, cfg, rank, world, max_len, dev):
        bf = torch.bfloat16
        self.world, self.hidden, self.eps = world, cfg["hidden"], cfg["eps"]
        self.nq, self.nkv = cfg["heads"] // world, cfg["kv_heads"] // world
        self.hd = hd = cfg["head_dim"]
        inter, vshard, hidden = cfg["intermediate"] // world, cfg["vocab"] // world, cfg["hidden"]

        def normal(*shape):
            return torch.empty(shape, dtype=bf, device=dev).normal_(0.0, STD)

        def ones():
            return torch.ones(hidden, dtype=bf, device=dev)

        torch.manual_seed(SEED)  # the same on every rank: the replicated embedding
        self.embed = normal(cfg["vocab"], hidden)
        torch.manual_seed(SEED + 1 + rank)  # this rank's shards
        self.layers = [dict(
            attn_norm=ones(),
            qkv=normal((self.nq + 2 * self.nkv) * hd, hidden),
            o=normal(hidden, self.nq * hd),
            mlp_norm=ones(),
            gate_up=normal(2 * inter, hidden),
            down=normal(hidden, inter),
        ) for _ in range(cfg["layers"])]
        self.final_norm = ones()
        if cfg["tied"]:
            self.lm_head = self.embed[rank * vshard:(rank + 1) * vshard]
        else:
            self.lm_head = normal(vshard, hidden)

        inv_freq = 1.0 / cfg["theta"] ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
        angles = torch.arange(max_len, device=dev, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), -1)  # [max_len, hd], the rotate-half layout
        self.cos, self.sin = angles.cos().to(bf), angles.sin().to(bf)
        self.positions = torch.arange(max_len, device=dev)
        self.open_mask = torch.zeros(max_len, dtype=bf, device=dev)

        # State: the token, the position, the generated ids, the caches, the gathered logits.
        self.token = torch.full((1,), BOS, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(1, dtype=torch.int64, device=dev)
        self.out = torch.zeros(max_len, dtype=torch.int64, device=dev)
        self.cache = torch.zeros(cfg["layers"], 2, 1, self.nkv, max_len, hd, dtype=bf, device=dev)
        self.gathered = torch.empty(world, vshard, dtype=torch.float32, device=dev) if world > 1 else None
        self.last_logits = None  # the last step's full fp32 logits (set by the step)

    def reset(self):
        """Back to the start, in place (the graph holds these tensors' addresses)."""
        self.cache.zero_()
        self.token.fill_(BOS)
        self.pos.zero_()
        self.out.zero_()

    def reduce(self, t):
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def step(self):
        pos, nq, nkv, hd, shape = self.pos, self.nq, self.nkv, self.hd, (self.hidden,)
        cos = self.cos.index_select(0, pos)  # [1, hd], broadcast over the heads
        sin = self.sin.index_select(0, pos)
        mask = self.open_mask.masked_fill(self.positions > pos, float("-inf")).view(1, 1, 1, -1)
        x = self.embed.index_select(0, self.token)  # [1, hidden]
        for l, w in enumerate(self.layers):
            h = F.rms_norm(x, shape, w["attn_norm"], self.eps)
            qkv = F.linear(h, w["qkv"])[0]
            qk = qkv[:(nq + nkv) * hd].view(nq + nkv, hd)
            qk = qk * cos + rotate_half(qk) * sin
            q = qk[:nq].view(1, nkv, nq // nkv, hd)
            k = qk[nq:].view(1, nkv, 1, hd)
            v = qkv[(nq + nkv) * hd:].view(1, nkv, 1, hd)
            kc, vc = self.cache[l, 0], self.cache[l, 1]
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)  # [1, nkv, groups, hd]
            x = x + self.reduce(F.linear(a.reshape(1, nq * hd), w["o"]))
            h = F.rms_norm(x, shape, w["mlp_norm"], self.eps)
            gate, up = F.linear(h, w["gate_up"]).chunk(2, -1)
            x = x + self.reduce(F.linear(F.silu(gate) * up, w["down"]))
        h = F.rms_norm(x, shape, self.final_norm, self.eps)
        logits = F.linear(h, self.lm_head).float()  # [1, V/W]
        if self.world > 1:
            dist.all_gather_into_tensor(self.gathered, logits)
            logits = self.gathered
        self.last_logits = logits
        nxt = logits.view(-1).argmax().view(1)
        self.out.index_copy_(0, pos, nxt)
        self.token.copy_(nxt)
        pos.add_(1)


def per_token_us(call, reset, tokens, runs):
    """Median over `runs` generations of `tokens` calls of the host wall time per token (us),
    each generation reset first and started with the GPU idle and the ranks aligned."""
    times = []
    for _ in range(runs):
        reset()
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(tokens):
            call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e6 / tokens)
    return statistics.median(times)


def nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)


def run_config(rank, world, name, tokens, runs, layers, dev):
    cfg = dict(CONFIGS[name], **({"layers": layers} if layers else {}))
    workload = f"tp_decode/{name}/{world}gpu"

    def say(msg):
        if rank == 0:
            print(f"{workload}: {msg}", file=sys.stderr, flush=True)

    first = torch.ones(1, device=dev)
    dist.all_reduce(first)  # NCCL's first collective, long before any capture
    torch.cuda.synchronize()
    model = TPDecoder(cfg, rank, world, tokens, dev)
    torch.cuda.synchronize()
    say(f"{torch.cuda.memory_allocated(dev) / 2**30:.2f} GiB of weights and cache per rank")

    def generate(call):
        for _ in range(tokens):
            call()
        torch.cuda.synchronize()

    def same_on_all_ranks(t):
        every = torch.empty(world, t.numel(), dtype=t.dtype, device=dev)
        dist.all_gather_into_tensor(every, t)
        return bool((every == every[0]).all())

    # Eager: one untimed generation (its tokens are the reference), then the timed ones.
    model.reset()
    generate(model.step)
    eager_ids = model.out.tolist()
    finite = bool(torch.isfinite(model.last_logits).all())
    ranks_equal = same_on_all_ranks(model.out)
    eager_us = per_token_us(model.step, model.reset, tokens, runs)
    say(f"eager {eager_us:.1f} µs/token")

    # Graph: warm up on a side stream, start over, capture the step once, one replay a token.
    model.reset()
    tm.warm_on_side_stream(model.step, min(WARMUP, tokens))
    model.reset()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.step()
    graph_logits = model.last_logits  # the graph's output, rewritten by every replay
    model.reset()
    generate(graph.replay)
    graph_ids = model.out.tolist()
    finite = finite and bool(torch.isfinite(graph_logits).all())
    ranks_equal = ranks_equal and same_on_all_ranks(model.out)
    graph_us = per_token_us(graph.replay, model.reset, tokens, runs)
    say(f"graph {graph_us:.1f} µs/token")

    same = graph_ids == eager_ids
    if not same:
        at = next(i for i, (a, b) in enumerate(zip(eager_ids, graph_ids)) if a != b)
        print(f"{workload}: rank {rank}: graph tokens differ from eager from index {at}", file=sys.stderr)
    flags = torch.tensor([same, ranks_equal, finite], dtype=torch.int32, device=dev)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    times = torch.tensor([eager_us, graph_us], dtype=torch.float64, device=dev)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slower rank's
    eager_us, graph_us = times.tolist()
    same, ranks_equal, finite = (bool(f) for f in flags.tolist())
    if not (same and ranks_equal and finite):
        say(f"check failed: graph = eager {same}, ranks equal {ranks_equal}, logits finite {finite}")
    del graph
    return {
        "bench": "tp_decode",
        "side": "torch",
        "workload": workload,
        "what": "PyTorch TP decode, torch.cuda.graph whole step",
        "shape": {
            "config": name,
            "world": world,
            "layers": cfg["layers"],
            "hidden": cfg["hidden"],
            "heads": cfg["heads"],
            "kv_heads": cfg["kv_heads"],
            "intermediate": cfg["intermediate"],
            "vocab": cfg["vocab"],
            "tokens": tokens,
            "dtype": "bf16",
        },
        "eager_us": eager_us,
        "graph_us": graph_us,
        "check": CHECK,
        "agree": same and ranks_equal and finite,
        "eager_tok_s": 1e6 / eager_us,
        "graph_tok_s": 1e6 / graph_us,
        "first_tokens": eager_ids[:8],
        "torch": torch.__version__,
        "nccl": nccl_version(),
        "gpu": torch.cuda.get_device_name(dev),
    }


def worker(rank, world, name, tokens, runs, layers, port):
    with tm.process_group(rank, world, port) as dev:
        with torch.inference_mode():
            row = run_config(rank, world, name, tokens, runs, layers, dev)
        if rank == 0:
            print(json.dumps(row), flush=True)


def unsplittable(cfg, world):
    """Why `cfg` does not split over `world` ranks, or None."""
    for key in ("heads", "kv_heads", "intermediate", "vocab"):
        if cfg[key] % world:
            return f"{key} {cfg[key]} is not a multiple of {world}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="all", choices=[*CONFIGS, "all"])
    ap.add_argument("--worlds", default="1,2,4", help="world sizes (GPUs), comma-separated")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per generation (the cache length)")
    ap.add_argument("--runs", type=int, default=3, help="timed generations per mode (median)")
    ap.add_argument("--layers", type=int, default=0, help="override the layer count (quick runs)")
    a = ap.parse_args()
    if a.tokens < 1 or a.runs < 1 or a.layers < 0:
        ap.error("--tokens and --runs must be at least 1, --layers at least 0")
    names = list(CONFIGS) if a.config == "all" else [a.config]
    worlds = [int(w) for w in a.worlds.split(",") if w.strip()]
    if not torch.cuda.is_available():
        print("skipped: PyTorch sees no CUDA device", file=sys.stderr)
        return
    gpus = torch.cuda.device_count()
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        print("note: NCCL_NVLS_ENABLE is not 0 here; the GPU machine keeps it at 0", file=sys.stderr)
    failed = []
    for name in names:
        for world in worlds:
            workload = f"tp_decode/{name}/{world}gpu"
            if world < 1:
                why = "a world needs at least 1 GPU"
            elif world > gpus:
                why = f"needs {world} GPUs, found {gpus}"
            else:
                why = unsplittable(CONFIGS[name], world)
            if why:
                print(f"skipped {workload}: {why}", file=sys.stderr)
                continue
            try:
                mp.spawn(worker, args=(world, name, a.tokens, a.runs, a.layers, tm.free_port()),
                         nprocs=world, join=True)
            except Exception as e:  # the other workloads still run; the exit status says it
                print(f"failed {workload}: {e}", file=sys.stderr)
                failed.append(workload)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
