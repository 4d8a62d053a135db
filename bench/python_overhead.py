#!/usr/bin/env python3
"""What the Python path adds to a qmoe call on the GPU: torch.ops.qmoe.moe_forward (and its out=
form) against the most direct call Python can make into the C++ layer (Layer._impl._run_ptr with
pointers computed once), at 1 and 8 tokens, in CUDA graph replay and eagerly.

Graph replay: each form is captured N times back to back into one graph; the per-call time is a
replay's GPU time (CUDA events) / N. The op launches no kernel of its own (its workspace comes
from the graph's pool), so the difference should be ~0.
Eager: N calls back to back then one synchronize; the per-call time is wall time / N, i.e. the
larger of the GPU time and the host time to issue a call; "host us" is the host time alone
(the loop before the synchronize).

With --model it also times one decode step (1 token) of a tiny random Qwen3-MoE with qmoe blocks,
eager and torch.compile'd.

    PYTHONPATH=build/python python3 bench/python_overhead.py [--format int4] [--json]"""

import argparse
import json
import sys
import time

import numpy as np
import torch

import qmoe
import qmoe.torch as qt


def make_layer(args):
    rng = np.random.default_rng(0)
    e, h, i = args.experts, args.hidden, args.inter
    w1 = rng.standard_normal((e, 2 * i, h), dtype=np.float32) / np.sqrt(h)
    w2 = rng.standard_normal((e, h, i), dtype=np.float32) / np.sqrt(i)
    layer = qmoe.Layer.from_float(w1, w2, top_k=args.top_k, format=args.format,
                                  normalize=True, dtype="bf16", backend="cuda")
    return layer, qt.register_layer(layer)


def callers(layer, handle, x, logits):
    """name -> zero-argument function issuing one call on torch's current stream."""
    out = torch.empty_like(x)
    tokens = x.shape[0]
    nbytes = layer.workspace_size(tokens)
    ws = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    bf16 = int(qmoe.DType.bf16.value)
    impl = layer._impl

    def direct():
        impl._run_ptr(tokens, x.data_ptr(), bf16, logits.data_ptr(), bf16, 0, 0, out.data_ptr(),
                      ws.data_ptr(), nbytes, torch.cuda.current_stream().cuda_stream)

    def op():
        torch.ops.qmoe.moe_forward(x, logits, handle)

    def op_out():
        torch.ops.qmoe.moe_forward_out(x, logits, handle, out=out)

    return {"direct _run_ptr": direct, "torch.ops.qmoe.moe_forward": op,
            "torch.ops.qmoe.moe_forward_out": op_out}


def time_graph(fn, n, reps):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / n)
    return best


def time_eager(fn, n, reps):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best_wall = best_host = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        best_host = min(best_host, (t1 - t0) * 1e6 / n)
        best_wall = min(best_wall, (t2 - t0) * 1e6 / n)
    return best_wall, best_host


def bench_model(args, rows):
    """One decode step (1 token, no KV cache) of a tiny random Qwen3-MoE with qmoe blocks."""
    try:
        import transformers
    except ImportError:
        print("--model: transformers is not installed; no model rows", file=sys.stderr)
        return
    cfg = transformers.Qwen3MoeConfig(vocab_size=1024, hidden_size=512, moe_intermediate_size=256,
                                      intermediate_size=1024, num_experts=16,
                                      num_experts_per_tok=4, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                      norm_topk_prob=True)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval().cuda().to(torch.bfloat16)
    qt.replace_moe_blocks(model, format=args.format)
    ids = torch.randint(0, 1024, (1, 1), device="cuda")
    for name, m in (("eager", model), ("compiled", torch.compile(model, fullgraph=True))):
        def step(m=m):
            m(ids, use_cache=False)
        wall, host = time_eager(step, 20, args.reps)
        rows.append({"what": f"tiny Qwen3-MoE decode step ({name})", "tokens": 1,
                     "mode": "eager", "us_per_call": wall, "host_us_per_call": host})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--format", default="int4")
    p.add_argument("--hidden", type=int, default=2048)   # Qwen3-30B-A3B's MoE layer
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--tokens", default="1,8")
    p.add_argument("--calls", type=int, default=50, help="calls per graph / eager loop")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--model", action="store_true", help="also time a tiny model's decode step")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not (torch.cuda.is_available() and qmoe.backend_available(qmoe.Backend.cuda)):
        sys.exit("python_overhead.py: needs a CUDA device and a CUDA build of qmoe")

    layer, handle = make_layer(args)
    rows = []
    with torch.no_grad():
        for tokens in [int(t) for t in args.tokens.split(",")]:
            x = torch.randn(tokens, args.hidden, device="cuda", dtype=torch.bfloat16)
            logits = torch.randn(tokens, args.experts, device="cuda", dtype=torch.bfloat16)
            for name, fn in callers(layer, handle, x, logits).items():
                rows.append({"what": name, "tokens": tokens, "mode": "graph replay",
                             "us_per_call": time_graph(fn, args.calls, args.reps)})
                wall, host = time_eager(fn, args.calls, args.reps)
                rows.append({"what": name, "tokens": tokens, "mode": "eager",
                             "us_per_call": wall, "host_us_per_call": host})
        layer.take_deferred_error()
        if args.model:
            bench_model(args, rows)

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "shape": f"H={args.hidden} I={args.inter} E={args.experts} k={args.top_k}",
            "format": args.format}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
        return
    print(" ".join(f"{k}={v}" for k, v in meta.items()))
    print(f"{'what':40s} {'tokens':>6s} {'mode':>13s} {'us/call':>9s} {'host us':>8s} {'added':>8s}")
    base = {(r["tokens"], r["mode"]): r["us_per_call"] for r in rows
            if r["what"] == "direct _run_ptr"}
    for r in rows:
        ref = base.get((r["tokens"], r["mode"]))
        added = "" if ref is None else f"{r['us_per_call'] - ref:+8.2f}"
        host = f"{r['host_us_per_call']:8.2f}" if "host_us_per_call" in r else ""
        print(f"{r['what']:40s} {r['tokens']:6d} {r['mode']:>13s} {r['us_per_call']:9.2f} "
              f"{host:>8s} {added:>8s}")


if __name__ == "__main__":
    main()
