#!/usr/bin/env python3
"""PyTorch reference for examples/04-07: the same workloads in PyTorch eager and with
torch.cuda.graph, measured the way the Rust examples measure them.

Workloads (shapes and layer counts as in the Rust examples):
  mlp     16 x (Linear 512->512 + GELU(tanh)), one graph per batch size
          (default 1 2 4 8 16 32 64 256 1024 4096); graph = static_x.copy_(x) + replay
  decode  8 pre-norm blocks, width 512, 8 heads, SwiGLU 1536, vocab 4096, 256 greedy
          tokens at batch 1; token and position live in device tensors, so one captured
          step serves every token; attention runs over the whole static cache with a mask
  train   MLP 64-256-256-16 (GELU tanh), batch 32, MSE, clip_grad_norm_(1.0), AdamW,
          mini-batch chosen by a device step counter; the whole step captured

Prints one JSON object per line, the records the report (examples/08-report.rs) reads:
`{"bench": ..., "side": "torch", "workload": ..., "what": ..., "shape": {...}, "eager_us": ...,
"graph_us": ..., ...}`, the `workload`, `what` and `shape` of each the same as the Rust
example's record of that workload (bench-report's record module), and one
`{"env": [[what, value], ...]}` line. Timings: median of 7 measurements of back-to-back
calls followed by one synchronize, in microseconds per call (per token, per step).

Usage: python3 scripts/torch_models.py [--batches 1,2,4] [--only mlp,decode,train]
"""
import argparse
import contextlib
import copy
import json
import math
import os
import socket
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the report treats this as "PyTorch not installed", not a failure
    print(f"skipped: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(0)

REPEATS = 7
BATCHES = [1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096]
MLP_LAYERS, MLP_DIM = 16, 512
DEC = dict(dim=512, heads=8, layers=8, ffn=1536, vocab=4096, max_seq=256, theta=10000.0, eps=1e-5)
BOS = 1
TRAIN_DIMS = [64, 256, 256, 16]
TRAIN_BATCH, TRAIN_BATCHES, TRAIN_STEPS = 32, 8, 200


def free_port():
    """A TCP port free on the loopback, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process_group(rank, world, port):
    """Rank `rank` of a `world`-process NCCL group on GPU `rank`, met at the loopback's
    `port`: yields the rank's device and destroys the group on the way out."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    try:
        yield dev
    finally:
        dist.destroy_process_group()


def emit(bench, workload, what, shape, **fields):
    record = {"bench": bench, "side": "torch", "workload": workload, "what": what, "shape": shape}
    print(json.dumps({**record, **fields}), flush=True)


def per_call_us(fn, iters, gpu=False, align=None, stream=None):
    """Median over REPEATS of the time per call (us) of `iters` back-to-back calls of `fn`: the
    host wall time from an idle GPU until it is idle again, or (`gpu`) the time between CUDA
    events recorded around the calls. `align` runs before each batch once the GPU is idle (a
    barrier between ranks); the calls go to `stream` (None: the current stream)."""
    per = []
    for _ in range(REPEATS):
        if align is not None:
            torch.cuda.synchronize()
            align()
            torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            if gpu:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    fn()
                end.record()
                end.synchronize()
                per.append(start.elapsed_time(end) * 1e3 / iters)
            else:
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(iters):
                    fn()
                torch.cuda.synchronize()
                per.append((time.perf_counter() - t) * 1e6 / iters)
    return statistics.median(per)


def wall_us(fn, iters):
    return per_call_us(fn, iters)


def gpu_us(fn, iters):
    return per_call_us(fn, iters, gpu=True)


def iters_for(estimate_us, budget_us=50_000.0, lo=5, hi=2000):
    if not estimate_us > 0:
        return hi
    return max(lo, min(hi, int(budget_us // estimate_us)))


def warm_on_side_stream(fn, n=3):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(n):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


# --------------------------------------------------------------------------------------
# MLP inference


def mlp_bench(batches):
    torch.manual_seed(4)
    layers = []
    for _ in range(MLP_LAYERS):
        layers += [torch.nn.Linear(MLP_DIM, MLP_DIM), torch.nn.GELU(approximate="tanh")]
    model = torch.nn.Sequential(*layers).cuda().eval()
    with torch.no_grad():
        for b in batches:
            x = torch.randn(b, MLP_DIM, device="cuda")
            eager_out = model(x)
            static_x = x.clone()
            warm_on_side_stream(lambda: model(static_x))
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_y = model(static_x)

            def replay():
                static_x.copy_(x)
                g.replay()

            replay()
            torch.cuda.synchronize()
            agree = bool(torch.equal(static_y, eager_out))
            iters = iters_for(wall_us(lambda: model(x), 3))
            eager = wall_us(lambda: model(x), iters)
            graph = wall_us(replay, iters)
            launch = wall_us(g.replay, iters)
            eager_gpu = gpu_us(lambda: model(x), iters)
            graph_gpu = gpu_us(replay, iters)
            emit("mlp", f"mlp/{b}", f"MLP {MLP_LAYERS}×(Linear {MLP_DIM}→{MLP_DIM}+GELU), batch {b}",
                 dict(batch=b, layers=MLP_LAYERS, dim=MLP_DIM), eager_us=eager, graph_us=graph,
                 graph_launch_us=launch, eager_gpu_us=eager_gpu, graph_gpu_us=graph_gpu,
                 check="output bitwise, eager vs graph", agree=agree)


def mlp_probe(b):
    """What sets PyTorch's MLP time at batch `b`: the model's graph against the same 16 layers
    as one cuBLASLt call each with the bias + GELU epilogue (04-mlp-inference's `--lt-gelu-epilogue`),
    and as addmm + GELU; the GPU time of each graph and the kernels PyTorch runs (profiler).
    Printed on stderr, so that stdout keeps only records."""
    torch.manual_seed(4)
    lin = [torch.nn.Linear(MLP_DIM, MLP_DIM).cuda() for _ in range(MLP_LAYERS)]
    ws = [l.weight.detach() for l in lin]
    bs = [l.bias.detach() for l in lin]
    x = torch.randn(b, MLP_DIM, device="cuda")

    def model():
        h = x
        for l in lin:
            h = torch.nn.functional.gelu(l(h), approximate="tanh")
        return h

    def lt_epilogue():
        h = x
        for w, bias in zip(ws, bs):
            h = torch._addmm_activation(bias, h, w.t(), use_gelu=True)
        return h

    def addmm_gelu():
        h = x
        for w, bias in zip(ws, bs):
            h = torch.nn.functional.gelu(torch.addmm(bias, h, w.t()), approximate="tanh")
        return h

    def mm_then_bias_gelu():
        h = x
        for w, bias in zip(ws, bs):
            h = torch.nn.functional.gelu(torch.mm(h, w.t()) + bias, approximate="tanh")
        return h

    out = {}
    with torch.no_grad():
        for name, fn in [("Linear+GELU (the model)", model), ("_addmm_activation(use_gelu) = cuBLASLt GELU_BIAS", lt_epilogue),
                         ("addmm + gelu", addmm_gelu), ("mm, then bias + gelu", mm_then_bias_gelu)]:
            warm_on_side_stream(fn)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            it = iters_for(gpu_us(g.replay, 3))
            out[name] = gpu_us(g.replay, it)
        print(f"\nMLP probe, batch {b}, {MLP_LAYERS} layers, GPU µs per graph replay (events):", file=sys.stderr)
        for name, v in out.items():
            print(f"  {name}: {v:.1f} µs", file=sys.stderr)
        try:
            from torch.profiler import profile, ProfilerActivity
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    model()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8), file=sys.stderr)
        except Exception as e:  # the profiler is optional
            print(f"  (profiler not available: {e})", file=sys.stderr)


# --------------------------------------------------------------------------------------
# Decode step


class Decoder:
    def __init__(self, seed=5):
        gen = torch.Generator().manual_seed(seed)
        d, f, v, n = DEC["dim"], DEC["ffn"], DEC["vocab"], DEC["layers"]

        def uni(shape, bound):
            return ((torch.rand(shape, generator=gen) * 2 - 1) * bound).cuda()

        def near_one(shape):
            return (0.9 + 0.2 * torch.rand(shape, generator=gen)).cuda()

        self.embed = uni((v, d), 1.0)
        self.attn_norm = near_one((n, d))
        self.wqkv = uni((n, 3 * d, d), 1 / math.sqrt(d))
        self.wo = uni((n, d, d), 1 / math.sqrt(d))
        self.ffn_norm = near_one((n, d))
        self.w13 = uni((n, 2 * f, d), 1 / math.sqrt(d))
        self.w2 = uni((n, d, f), 1 / math.sqrt(f))
        self.final_norm = near_one((d,))
        self.lm_head = uni((v, d), 1 / math.sqrt(d))
        hd = d // DEC["heads"]
        j = torch.arange(hd // 2, dtype=torch.float32)
        freq = DEC["theta"] ** (-2.0 * j / hd)
        angles = torch.arange(DEC["max_seq"], dtype=torch.float32)[:, None] * freq[None, :]
        self.cos, self.sin = angles.cos().cuda(), angles.sin().cuda()
        self.positions = torch.arange(DEC["max_seq"], device="cuda")
        # State: token, position, output, cache.
        self.token = torch.full((1,), BOS, dtype=torch.long, device="cuda")
        self.pos = torch.zeros(1, dtype=torch.long, device="cuda")
        self.tokens = torch.zeros(DEC["max_seq"], dtype=torch.long, device="cuda")
        self.k = torch.zeros(n, DEC["max_seq"], d, device="cuda")
        self.v = torch.zeros(n, DEC["max_seq"], d, device="cuda")

    def restart(self):
        self.token.fill_(BOS)
        self.pos.zero_()
        self.tokens.zero_()
        self.k.zero_()
        self.v.zero_()

    def capture_step(self):
        """One step captured as a CUDA graph. Starts over before the warmup steps and again
        before capturing, so that every step stays inside the cache whatever ran before."""
        self.restart()
        warm_on_side_stream(self.step)
        self.restart()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.step()
        return g

    def time_generation(self, generate):
        """Restarts, then runs `generate()` (which returns how many tokens it made) between two
        synchronizes: (us per token, tokens)."""
        self.restart()
        torch.cuda.synchronize()
        t = time.perf_counter()
        count = generate()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e6 / count, count

    @staticmethod
    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + DEC["eps"]) * w

    def rope(self, x, cos, sin):
        h = DEC["heads"]
        xy = x.view(h, -1, 2)
        x0, x1 = xy[..., 0], xy[..., 1]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).view(1, -1)

    def step(self):
        d, h, f = DEC["dim"], DEC["heads"], DEC["ffn"]
        hd = d // h
        cos = self.cos.index_select(0, self.pos)  # [1, hd/2], broadcast over heads
        sin = self.sin.index_select(0, self.pos)
        masked = self.positions > self.pos  # positions past the current one
        x = self.embed.index_select(0, self.token)  # [1, d]
        for l in range(DEC["layers"]):
            xn = self.rmsnorm(x, self.attn_norm[l])
            q, k, v = F.linear(xn, self.wqkv[l]).split(d, -1)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            self.k[l].index_copy_(0, self.pos, k)
            self.v[l].index_copy_(0, self.pos, v)
            keys = self.k[l].view(-1, h, hd)
            values = self.v[l].view(-1, h, hd)
            scores = torch.einsum("hd,thd->ht", q.view(h, hd), keys) / math.sqrt(hd)
            p = scores.masked_fill(masked[None, :], float("-inf")).softmax(-1)
            attn = torch.einsum("ht,thd->hd", p, values).reshape(1, d)
            x = x + F.linear(attn, self.wo[l])
            xn = self.rmsnorm(x, self.ffn_norm[l])
            g, u = F.linear(xn, self.w13[l]).split(f, -1)
            x = x + F.linear(F.silu(g) * u, self.w2[l])
        logits = F.linear(self.rmsnorm(x, self.final_norm), self.lm_head)
        nxt = logits.argmax(-1)
        self.tokens.index_copy_(0, self.pos, nxt)
        self.token.copy_(nxt)
        self.pos.add_(1)


def calls(fn, n):
    """A generation of `n` calls of `fn`, returning `n`."""
    def generate():
        for _ in range(n):
            fn()
        return n
    return generate


def decode_bench(runs=5):
    tokens = DEC["max_seq"]
    dec = Decoder()
    with torch.no_grad():
        eager_times, eager_seqs = [], []
        for _ in range(runs):
            eager_times.append(dec.time_generation(calls(dec.step, tokens))[0])
            eager_seqs.append(dec.tokens.clone())
        # The eager runs left the position at the end of the cache: capture_step starts over.
        g = dec.capture_step()
        graph_times, graph_seqs = [], []
        for _ in range(runs):
            graph_times.append(dec.time_generation(calls(g.replay, tokens))[0])
            graph_seqs.append(dec.tokens.clone())
    ref = eager_seqs[0]
    agree = all(torch.equal(s, ref) for s in eager_seqs + graph_seqs)
    eager, graph = statistics.median(eager_times), statistics.median(graph_times)
    what = f"decode step, {DEC['layers']} layers, dim {DEC['dim']}, vocab {DEC['vocab']} ({tokens} tokens)"
    shape = dict(tokens=tokens, layers=DEC["layers"], dim=DEC["dim"], heads=DEC["heads"],
                 ffn=DEC["ffn"], vocab=DEC["vocab"])
    emit("decode", "decode", what, shape, eager_us=eager, graph_us=graph,
         eager_tok_s=1e6 / eager, graph_tok_s=1e6 / graph,
         check="256 greedy tokens, eager vs graph", agree=agree)


# --------------------------------------------------------------------------------------
# Training step


def make_mlp(dims, device="cuda"):
    """Linear layers of widths `dims` with GELU (tanh) between them, on `device`."""
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.GELU(approximate="tanh"))
    return torch.nn.Sequential(*layers).to(device)


class TrainStep:
    def __init__(self, model, xs, ts, capturable):
        self.model = model
        self.xs, self.ts = xs, ts
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                     weight_decay=0.01, capturable=capturable, foreach=True)
        self.step_t = torch.zeros(1, dtype=torch.long, device="cuda")
        self.losses = torch.zeros(TRAIN_STEPS, device="cuda")

    def __call__(self):
        idx = torch.remainder(self.step_t, TRAIN_BATCHES)
        x = self.xs.index_select(0, idx).squeeze(0)
        t = self.ts.index_select(0, idx).squeeze(0)
        loss = F.mse_loss(self.model(x), t)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
        self.opt.step()
        self.losses.index_copy_(0, torch.remainder(self.step_t, TRAIN_STEPS), loss.detach().view(1))
        self.step_t.add_(1)


def train_bench():
    torch.manual_seed(6)
    model = make_mlp(TRAIN_DIMS)
    teacher = make_mlp(TRAIN_DIMS)
    with torch.no_grad():
        for p in teacher.parameters():
            p.mul_(4.0)
        xs = torch.rand(TRAIN_BATCHES, TRAIN_BATCH, TRAIN_DIMS[0], device="cuda") * 2 - 1
        ts = teacher(xs)
    eager_model, graph_model = copy.deepcopy(model), copy.deepcopy(model)

    eager = TrainStep(eager_model, xs, ts, capturable=False)

    def eager_step():
        eager.opt.zero_grad(set_to_none=True)
        eager()

    for _ in range(TRAIN_STEPS):
        eager_step()
    eager_losses = eager.losses.clone()

    graphed = TrainStep(graph_model, xs, ts, capturable=True)
    initial = [p.detach().clone() for p in graph_model.parameters()]

    def warm():
        graphed.opt.zero_grad(set_to_none=True)
        graphed()

    warm_on_side_stream(warm)
    g = torch.cuda.CUDAGraph()
    graphed.opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        graphed()
    # The warmup trained three steps: start again from the same weights and a fresh
    # optimizer state (in place: the graph holds their addresses).
    with torch.no_grad():
        for p, p0 in zip(graph_model.parameters(), initial):
            p.copy_(p0)
        for state in graphed.opt.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value.zero_()
    graphed.step_t.zero_()
    graphed.losses.zero_()
    for _ in range(TRAIN_STEPS):
        g.replay()
    graph_losses = graphed.losses.clone()
    torch.cuda.synchronize()
    rel = ((graph_losses - eager_losses).abs() / eager_losses.abs().clamp_min(1e-12)).max().item()

    eager_us = wall_us(eager_step, 200)
    graph_us = wall_us(g.replay, 200)
    eager_gpu = gpu_us(eager_step, 200)
    graph_gpu = gpu_us(g.replay, 200)
    dims = "-".join(map(str, TRAIN_DIMS))
    emit("train", "train", f"train step MLP {dims}, batch {TRAIN_BATCH}",
         dict(batch=TRAIN_BATCH, dims=dims, steps=TRAIN_STEPS), eager_us=eager_us, graph_us=graph_us, eager_gpu_us=eager_gpu, graph_gpu_us=graph_gpu,
         loss_first=eager_losses[0].item(), loss_last=eager_losses[-1].item(),
         eager_vs_graph_max_rel_diff=rel,
         check="loss curves eager vs graph (relative, not bitwise: different AdamW paths)",
         agree=rel < 1e-3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--only", default="mlp,decode,train")
    ap.add_argument("--probe-mlp", type=int, default=0,
                    help="only the MLP probe at this batch (stderr): which GEMM path sets the time")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: PyTorch sees no CUDA device", file=sys.stderr)
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # plain FP32 GEMMs, as in the Rust examples
    env = [["PyTorch", torch.__version__], ["PyTorch CUDA", str(torch.version.cuda)],
           ["PyTorch device", torch.cuda.get_device_name(0)]]
    print(json.dumps({"env": env}), flush=True)
    if args.probe_mlp:
        mlp_probe(args.probe_mlp)
        return
    only = set(args.only.split(","))
    if "mlp" in only:
        mlp_bench([int(b) for b in args.batches.split(",") if b.strip()])
    if "decode" in only:
        decode_bench()
    if "train" in only:
        train_bench()


if __name__ == "__main__":
    main()
