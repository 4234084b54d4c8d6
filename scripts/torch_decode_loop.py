#!/usr/bin/env python3
"""PyTorch reference for examples/14-decode-loop.rs: greedy decoding until an end token with
one CUDA-graph replay per token and `.item()` on the token to decide whether to stop, the
same shapes as the Rust example.

The model is scripts/torch_models.py's decoder (pre-norm blocks, SwiGLU, token and position
in device tensors so one captured step serves every token), at the example's sizes:
  tiny       1 block,  width 128, 4 heads, ffn 384,  vocab 1024
  small      2 blocks, width 256, 4 heads, ffn 768,  vocab 2048
  example05  8 blocks, width 512, 8 heads, ffn 1536, vocab 4096 (05-decode-step's size)
each generating up to --tokens tokens (256) from BOS. The end token is chosen as in the Rust
example, from a first eager run without stopping: the token whose first appearance comes
last (none when that is under a quarter of the sequence). Weights are PyTorch's own random
ones, so the tokens differ from the Rust example's; the shapes and the work per token match.

Per token, median of --runs generations:
  replay + .item()   g.replay(), then dec.token.item() (a copy and a synchronize) and the stop
                     check: the straight-line-graph way to stop on device data
  replay, no check   g.replay() back to back for the same number of tokens, one synchronize
                     at the end: what the kernels cost when nothing waits for the host

Prints a Markdown table per size and, with --json, one record per size:
`{"bench": "decode_loop", "side": "torch", "workload": "decode_loop/<size>", ...,
"eager_us": <replay + .item()>, "graph_us": <replay, no check>, ...}`.

Usage: python3 scripts/torch_decode_loop.py [--sizes tiny,small,example05] [--tokens 256]
       [--runs 5] [--json]
"""
import argparse
import json
import statistics
import sys

try:
    import torch
except ImportError as e:  # the report treats this as "PyTorch not installed", not a failure
    print(f"skipped: PyTorch is not installed ({e})", file=sys.stderr)
    sys.exit(0)

import torch_models as tm

SIZES = {
    "tiny": dict(layers=1, dim=128, heads=4, ffn=384, vocab=1024),
    "small": dict(layers=2, dim=256, heads=4, ffn=768, vocab=2048),
    "example05": dict(layers=8, dim=512, heads=8, ffn=1536, vocab=4096),
}


def pick_end(full):
    """The token whose first appearance comes last, and the tokens a generation stopping at it
    produces; (-1, len) when that is under a quarter of the sequence."""
    seen, best, last_new = set(), (-1, len(full)), 0
    for i, t in enumerate(full):
        if t not in seen:
            seen.add(t)
            last_new, best = i, (t, i + 1)
    return (-1, len(full)) if last_new + 1 < len(full) // 4 else best


def run_size(name, tokens, runs):
    tm.DEC.update(SIZES[name], max_seq=tokens)
    dec = tm.Decoder(seed=14)
    with torch.no_grad():
        dec.restart()
        for _ in range(tokens):
            dec.step()
        full = dec.tokens.tolist()
        end, expected = pick_end(full)

        g = dec.capture_step()

        def until_end():
            count = 0
            while True:
                g.replay()
                count += 1
                if dec.token.item() == end or count == tokens:
                    return count

        item_times, seqs = [], []
        for _ in range(runs):
            us, count = dec.time_generation(until_end)
            item_times.append(us)
            seqs.append(dec.tokens[:count].tolist())

        plain_times = [dec.time_generation(tm.calls(g.replay, expected))[0] for _ in range(runs)]
    agree = all(s == full[:expected] for s in seqs)
    return dict(end=end, generated=expected, item_us=statistics.median(item_times),
                plain_us=statistics.median(plain_times), agree=agree)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,small,example05")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device for PyTorch", file=sys.stderr)
        return 0
    device = torch.cuda.get_device_name()
    ok = True
    for name in args.sizes.split(","):
        m = run_size(name, args.tokens, args.runs)
        spec = SIZES[name]
        stop = (f"stopped at end token {m['end']}" if m["end"] >= 0
                else "no end token: the length bound stops it")
        print(f"\n### PyTorch {torch.__version__}, {name}: {spec['layers']} blocks, width {spec['dim']}, "
              f"{spec['heads']} heads, ffn {spec['ffn']}, vocab {spec['vocab']} on {device}")
        print(f"{m['generated']} tokens generated of at most {args.tokens} ({stop}), median of "
              f"{args.runs} runs\n")
        print("| per token | µs per token |")
        print("| --- | ---: |")
        print(f"| one replay per token + `.item()` stop check | {m['item_us']:.1f} |")
        print(f"| replays back to back, no stop check | {m['plain_us']:.1f} |")
        print(f"tokens: replay + .item() generated the eager run's tokens: {'yes' if m['agree'] else 'NO'}")
        ok &= m["agree"]
        if args.json:
            shape = dict(tokens=args.tokens, layers=spec["layers"], dim=spec["dim"], heads=spec["heads"],
                         ffn=spec["ffn"], vocab=spec["vocab"])
            what = (f"decode until an end token, {spec['layers']} layers, dim {spec['dim']}, "
                    f"vocab {spec['vocab']} ({m['generated']} tokens)")
            print(json.dumps({"bench": "decode_loop", "side": "torch", "workload": f"decode_loop/{name}",
                              "what": what, "shape": shape, "eager_us": m["item_us"],
                              "graph_us": m["plain_us"], "generated": m["generated"],
                              "check": "tokens of replay + .item() = eager run", "agree": m["agree"]}),
                  flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
