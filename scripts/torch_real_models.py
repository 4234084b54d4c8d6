#!/usr/bin/env python3
"""PyTorch reference for the real-models tier (examples/17-candle-bert.rs, 18-candle-resnet.rs,
19-candle-llama-window.rs): the same models and shapes in PyTorch eager and with
torch.cuda.graph, random init, f32 (TF32 off, as in the Rust examples), measured the way the
Rust examples measure them.

Workloads (the Rust examples' shapes):
  bert          transformers' BertModel, MiniLM-sized (hidden 384, 6 layers, 12 heads,
                intermediate 1536, vocab 30522, 512 positions, no pooler), sequence 128,
                batch 1 and 8 (--batches); input ids and token types, no attention mask
  resnet18      torchvision's resnet18 (1000 classes), batch 1, 224x224
  llama_window  transformers' LlamaForCausalLM with SmolLM2-135M's config (hidden 576,
                30 layers, 9 heads, 3 KV heads, MLP 1536, vocab 49152, rope theta 100000,
                tied embeddings), one forward over a 128-token window at batch 1 without a
                KV cache (use_cache=False), the last token's logits

Per workload: the first eager call timed alone (kernel loading, cuBLAS/cuDNN set-up), the
capture (side-stream warmup, capture) timed with the free memory it took (cudaMemGetInfo),
eager and graph (static_x.copy_(x) + replay) agreement on --inputs new inputs, then eager and
graph µs per call: median of 7 measurements of back-to-back calls followed by one synchronize
(scripts/torch_models.py's clock). Attention: transformers' default (sdpa) unless --attn says
otherwise; when a capture with it fails (a host read inside transformers' mask code, say) the
workload is captured again with attn_implementation="eager" and the record says which ran
("attn").

Prints one JSON object per line, the records the report (examples/08-report.rs) reads, with
the same `bench` ("real_models"), `workload` and `shape` as the Rust examples' records, and one
`{"env": [[what, value], ...]}` line. A missing torch, transformers or torchvision skips what
needs it, with the reason on stderr, and exits 0.

Usage: python3 scripts/torch_real_models.py [--only bert,resnet18,llama_window]
       [--batches 1,8] [--seq 128] [--window 128] [--layers 30] [--inputs 6] [--attn sdpa]
"""
import argparse
import inspect
import json
import sys
import time

try:
    import torch
except ImportError as e:  # the report treats this as "PyTorch not installed", not a failure
    print(f"skipped: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(0)

import torch_models as tm

BENCH = "real_models"
BERT = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
            intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2,
            hidden_act="gelu", layer_norm_eps=1e-12)
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
               num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
               max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
               eos_token_id=2, hidden_act="silu")


def emit(workload, what, shape, **fields):
    record = {"bench": BENCH, "side": "torch", "workload": workload, "what": what, "shape": shape}
    print(json.dumps({**record, **fields}), flush=True)


def skip(what, why):
    print(f"skipped {what}: {why}", file=sys.stderr)


def build(cls, cfg, attn, **kwargs):
    """`cls` from `cfg` with random init on the GPU in eval mode, asking for `attn` as the
    attention implementation (the model class's default when that cannot be asked for)."""
    try:
        model = cls._from_config(cfg, attn_implementation=attn, **kwargs)
    except Exception as e:  # an older or newer transformers without the keyword
        print(f"{cls.__name__}: attn_implementation={attn!r} not taken ({e}); the default", file=sys.stderr)
        model = cls(cfg, **kwargs)
    return model.cuda().eval()


def attn_of(model):
    return str(getattr(model.config, "_attn_implementation", "default"))


def bench(workload, what, shape, make_input, forward, inputs, extra=None):
    """Measures `forward` (a function of the input tensors, returning one tensor) eager and as
    a CUDA graph; emits the record. Returns False when the capture failed."""
    extra = dict(extra or {})
    with torch.no_grad():
        x0 = make_input()
        torch.cuda.synchronize()
        t = time.perf_counter()
        forward(*x0)
        torch.cuda.synchronize()
        first_eager_us = (time.perf_counter() - t) * 1e6

        static = [x.clone() for x in x0]
        free_before = torch.cuda.mem_get_info()[0]
        t = time.perf_counter()
        try:
            tm.warm_on_side_stream(lambda: forward(*static))
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = forward(*static)
            torch.cuda.synchronize()
        except Exception as e:
            print(f"{what}: the capture failed: {type(e).__name__}: {e}", file=sys.stderr)
            torch.cuda.synchronize()
            return False
        capture_ms = (time.perf_counter() - t) * 1e3
        capture_mem = free_before - torch.cuda.mem_get_info()[0]

        def replay(xs):
            for s, x in zip(static, xs):
                s.copy_(x)
            g.replay()
            return static_out

        bitwise, max_abs, max_out = True, 0.0, 0.0
        for _ in range(inputs):
            xs = make_input()
            eager = forward(*xs).clone()
            ours = replay(xs)
            torch.cuda.synchronize()
            bitwise &= bool(torch.equal(eager, ours))
            max_abs = max(max_abs, (eager - ours).abs().max().item())
            max_out = max(max_out, eager.abs().max().item())

        xs = make_input()
        iters = tm.iters_for(tm.wall_us(lambda: forward(*xs), 3), 300_000.0, 10, 1000)
        eager_us = tm.wall_us(lambda: forward(*xs), iters)
        graph_us = tm.wall_us(lambda: replay(xs), iters)
        launch_us = tm.wall_us(g.replay, iters)
    emit(workload, what, shape, eager_us=eager_us, graph_us=graph_us, graph_launch_us=launch_us,
         first_eager_us=first_eager_us, capture_ms=capture_ms, capture_mem_bytes=capture_mem,
         max_abs_diff=max_abs, max_abs_out=max_out,
         check=f"output eager vs graph, {inputs} new inputs (bitwise: {bitwise})",
         agree=bitwise or max_abs <= 1e-5 * max(1.0, max_out), **extra)
    return True


def with_attn_fallback(name, attn, run):
    """`run(attn)`, and again with the eager attention when its capture failed."""
    if run(attn) or attn == "eager":
        return
    print(f"{name}: capturing again with attn_implementation='eager'", file=sys.stderr)
    if not run("eager"):
        skip(name, "the capture failed with both attention implementations (see above)")


def bert_bench(batches, seq, inputs, attn):
    try:
        from transformers import BertConfig, BertModel
    except ImportError as e:
        return skip("bert", f"transformers is not installed ({e})")
    cfg = BertConfig(**BERT)
    for b in batches:
        def run(attn, b=b):
            torch.manual_seed(17)
            model = build(BertModel, cfg, attn, add_pooling_layer=False)

            def make_input():
                ids = torch.randint(0, BERT["vocab_size"], (b, seq), device="cuda")
                types = torch.randint(0, 2, (b, seq), device="cuda")
                return ids, types

            def forward(ids, types):
                return model(input_ids=ids, token_type_ids=types).last_hidden_state

            return bench(f"bert/{b}", f"BERT MiniLM-sized (6 layers, hidden 384), batch {b}, sequence {seq}",
                         dict(batch=b, seq=seq, layers=BERT["num_hidden_layers"], hidden=BERT["hidden_size"]),
                         make_input, forward, inputs, dict(attn=attn_of(model)))

        with_attn_fallback(f"bert/{b}", attn, run)


def resnet_bench(batch, size, inputs):
    try:
        import torchvision
    except ImportError as e:
        return skip("resnet18", f"torchvision is not installed ({e})")
    torch.manual_seed(18)
    model = torchvision.models.resnet18(weights=None, num_classes=1000).cuda().eval()

    def make_input():
        return (torch.randn(batch, 3, size, size, device="cuda"),)

    if not bench(f"resnet18/{batch}", f"ResNet-18, batch {batch}, {size}×{size}", dict(batch=batch, size=size),
                 make_input, model, inputs):
        skip("resnet18", "the capture failed (see above)")


def llama_bench(window, layers, inputs, attn):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        return skip("llama_window", f"transformers is not installed ({e})")
    cfg = LlamaConfig(num_hidden_layers=layers, **SMOLLM2)

    def run(attn):
        torch.manual_seed(19)
        model = build(LlamaForCausalLM, cfg, attn)

        def make_input():
            return (torch.randint(0, SMOLLM2["vocab_size"], (1, window), device="cuda"),)

        # Only the last token's logits, as candle-transformers' Llama computes them (a
        # transformers without `logits_to_keep` computes all and the last row is taken).
        keep = dict(logits_to_keep=1) if "logits_to_keep" in inspect.signature(model.forward).parameters else {}

        def forward(ids):
            return model(input_ids=ids, use_cache=False, **keep).logits[:, -1, :]

        return bench(f"llama_window/{window}",
                     f"Llama SmolLM2-135M-shaped ({layers} layers), {window}-token window, batch 1",
                     dict(batch=1, window=window, layers=layers, hidden=SMOLLM2["hidden_size"]),
                     make_input, forward, inputs, dict(attn=attn_of(model)))

    with_attn_fallback(f"llama_window/{window}", attn, run)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="bert,resnet18,llama_window")
    ap.add_argument("--batches", default="1,8", help="BERT's batch sizes")
    ap.add_argument("--seq", type=int, default=128, help="BERT's sequence length")
    ap.add_argument("--window", type=int, default=128, help="the Llama's window")
    ap.add_argument("--layers", type=int, default=30, help="the Llama's layers")
    ap.add_argument("--inputs", type=int, default=6, help="new inputs compared, eager vs graph")
    ap.add_argument("--attn", default="sdpa", help="attention implementation of the transformers models")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: PyTorch sees no CUDA device", file=sys.stderr)
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # plain FP32, as in the Rust examples
    torch.backends.cudnn.allow_tf32 = False
    env = [["PyTorch", torch.__version__], ["PyTorch CUDA", str(torch.version.cuda)],
           ["PyTorch device", torch.cuda.get_device_name(0)]]
    for module in ("transformers", "torchvision"):
        try:
            env.append([module, __import__(module).__version__])
        except ImportError:
            pass
    print(json.dumps({"env": env}), flush=True)
    only = set(args.only.split(","))
    if "bert" in only:
        bert_bench([int(b) for b in args.batches.split(",") if b.strip()], args.seq, args.inputs, args.attn)
    if "resnet18" in only:
        resnet_bench(1, 224, args.inputs)
    if "llama_window" in only:
        llama_bench(args.window, args.layers, args.inputs, args.attn)


if __name__ == "__main__":
    main()
