#!/usr/bin/env python3
"""Expert-parallel timing: a preset layer sharded evenly over the ranks (qmoe.distributed), at
1, 64 and 4096 tokens per rank, against the unsharded layer on one device.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=build/python torchrun --nproc-per-node 2 bench/expert_parallel.py
    PYTHONPATH=build/python torchrun --nproc-per-node 2 bench/expert_parallel.py --shape tiny

Per preset and token count it reports (rank 0 prints, --json writes the rows):
  layer_us       one ExpertParallelMoE call, wall time per call over back-to-back calls after
                 warm-up, the slowest rank's (every rank waits for the slowest at the exchanges)
  comm_us        the three exchanges (counts, dispatch, return) of a profiled call, which
                 synchronizes the device between stages (so stages do not overlap), slowest rank
  compute_us     the shard's qmoe call in the same profiled call, slowest rank
  other_us       the plan (which ranks a token visits) and the combine, slowest rank
  ranks_per_token  the ranks a token visits on average (the plan's superset of its routes' ranks)
  one_device_us  the unsharded layer on rank 0's device at world_size x tokens tokens (--no-baseline
                 skips it; it needs the whole layer's weights on one device)
  scaling        one_device_us / layer_us: R devices' throughput over one's on the same tokens

Presets (tools/qmoe/presets.cpp): qwen3-30b-a3b (H 2048, I 768, E 128, top-8, INT4 b128, softmax
top-k normalized, bf16) and deepseek-v3 (H 7168, I 2048, E 256, top-8, fp8_block 128x128, grouped
top-k 8 groups / 4, scaling 2.5, separate gate and up projections, bf16 activations, f32 logits).
The weights are synthesized: a few experts quantized from random fp32 weights, repeated to fill
the shard (the kernels' time does not depend on the values, and quantizing all of DeepSeek-V3's
experts would take far longer than the run). --shape tiny shrinks both to a CPU smoke size.
NCCL and the CUDA backend (one GPU per rank) when CUDA is available, gloo and the CPU otherwise."""

import argparse
import json
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import qmoe
from qmoe.distributed import ExpertParallelMoE, even_split, init_from_env

# name -> (hidden, inter, experts, top_k, format, make_spec keywords, glu, f32 logits)
PRESETS = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, "int4",
                      dict(routing="softmax_topk", normalize=True), "interleaved", False),
    "deepseek-v3": (7168, 2048, 256, 8, "fp8_block",
                    dict(routing="grouped_topk", normalize=True, n_group=8, topk_group=4,
                         routed_scaling_factor=2.5), "separate_fc3", True),
}
TINY = {"qwen3-30b-a3b": (128, 128, 16, 4), "deepseek-v3": (128, 128, 16, 4)}
UNIQUE_EXPERTS = 4  # experts quantized from random weights; the rest repeat them
_FC_KEYS = {"weight": "experts_weights", "scales": "scales", "zero_points": "zero_points",
            "global_scale": "global_scale"}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="qwen3-30b-a3b,deepseek-v3")
    p.add_argument("--tokens", default="1,64,4096", help="tokens per rank")
    p.add_argument("--shape", default="full", choices=["full", "tiny"])
    p.add_argument("--mode", default="deterministic", choices=["deterministic", "fast"])
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cuda: NCCL, one GPU per rank; cpu: gloo (auto: cuda where available)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--json", default=None, help="write the rows here (rank 0)")
    return p.parse_args()


def make_layer(preset, tiny, first, count, backend, device):
    """The shard [first, first + count) of the preset's layer (all experts: first 0, count E)."""
    h, i, e, k, fmt, routing, glu, _ = PRESETS[preset]
    if tiny:
        h, i, e, k = TINY[preset]
    local = 0 if count == e else count
    spec = qmoe.make_spec(h, i, e, top_k=k, format=fmt, activation="swiglu", glu=glu,
                          dtype="bf16", first_expert=first, local_experts=local, **routing)
    rng = np.random.default_rng(1)
    u = min(UNIQUE_EXPERTS, count)
    fcs = {"fc1": (u, (1 if glu == "separate_fc3" else 2) * i, h), "fc2": (u, h, i)}
    if glu == "separate_fc3":
        fcs["fc3"] = (u, i, h)
    tensors = {}
    for prefix, shape in fcs.items():
        w = (rng.standard_normal(shape) / np.sqrt(shape[2])).astype(np.float32)
        fc_fmt = spec.fc2 if prefix == "fc2" else spec.fc1
        for key, (arr, dt) in qmoe.quantize_fc(w, fc_fmt).items():
            reps = -(-count // u)
            tensors[f"{prefix}_{_FC_KEYS[key]}"] = (np.tile(arr, (reps,) + (1,) * (arr.ndim - 1))
                                                    [:count].copy(), dt)
    bias = None
    if routing["routing"] == "grouped_topk":
        bias = (rng.standard_normal(e) * 0.01).astype(np.float32)
        tensors["router_correction_bias"] = bias
    return qmoe.Layer(spec, tensors, backend=backend, device=device), bias


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, device, iters, warmup, group_barrier=True):
    for _ in range(warmup):
        fn()
    sync(device)
    if group_barrier:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - start) / iters * 1e6


def rank_max(value, device, op=dist.ReduceOp.MAX):
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.item()


def rank_sum(value, device):
    return rank_max(value, device, dist.ReduceOp.SUM)


def bench_preset(args, preset, ctx):
    rank, world, device, use_cuda = ctx
    backend = "cuda" if use_cuda else "cpu"
    dev_index = device.index or 0
    h, _, e, _, _, _, _, f32_logits = PRESETS[preset]
    if args.shape == "tiny":
        h, _, e, _ = TINY[preset]
    first, count = even_split(e, world)[rank]
    shard, bias = make_layer(preset, args.shape == "tiny", first, count, backend, dev_index)
    moe = ExpertParallelMoE(shard, mode=args.mode, router_bias=bias, expect=(first, count))
    whole = None
    if rank == 0 and not args.no_baseline:
        import qmoe.torch as qt
        whole = qt.QMoE(make_layer(preset, args.shape == "tiny", 0, e, backend, dev_index)[0])
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        g = torch.Generator().manual_seed(1000 * rank + tokens)
        x = torch.randn(tokens, h, generator=g).to(device, torch.bfloat16)
        logits = torch.randn(tokens, e, generator=g).to(
            device, torch.float32 if f32_logits else torch.bfloat16)
        with torch.no_grad():
            layer_us = rank_max(time_calls(lambda: moe(x, logits), device, args.iters,
                                           args.warmup), device)
            moe.profile = True
            stages = {}
            for _ in range(args.iters):
                moe(x, logits)
                for k, v in moe.timings.items():
                    stages[k] = stages.get(k, 0.0) + v / args.iters * 1e6
            moe.profile = False
            visits = moe.last_rows[0]
            comm = rank_max(sum(stages.get(k, 0.0) for k in ("counts", "dispatch", "return")),
                            device)
            compute = rank_max(stages.get("compute", 0.0), device)
            other = rank_max(stages.get("plan", 0.0) + stages.get("combine", 0.0), device)
            one = None
            if whole is not None:
                xa = x.repeat(world, 1)
                la = logits.repeat(world, 1)
                one = time_calls(lambda: whole(xa, la), device, args.iters, args.warmup,
                                 group_barrier=False)
            dist.barrier()
        visits = rank_sum(visits, device) / max(1, world * tokens)
        row = dict(preset=preset, world_size=world, tokens_per_rank=tokens, mode=args.mode,
                   ranks_per_token=round(visits, 3),
                   device=str(torch.cuda.get_device_name(device)) if use_cuda else "cpu",
                   layer_us=round(layer_us, 1), comm_us=round(comm, 1),
                   compute_us=round(compute, 1), other_us=round(other, 1),
                   one_device_us=None if one is None else round(one, 1),
                   scaling=None if one is None else round(one / layer_us, 3))
        rows.append(row)
        if rank == 0:
            print(f"{preset:14s} R={world} T/rank={tokens:5d}  layer {row['layer_us']:9.1f} us"
                  f"  comm {row['comm_us']:9.1f}  compute {row['compute_us']:9.1f}"
                  f"  other {row['other_us']:8.1f}  ranks/token {row['ranks_per_token']:.2f}"
                  f"  one device "
                  f"{'-' if one is None else f'{one:9.1f}'} us  scaling "
                  f"{'-' if one is None else row['scaling']}", flush=True)
    return rows


def main():
    args = parse()
    device = init_from_env(args.backend)
    use_cuda = device.type == "cuda"
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for preset in args.presets.split(","):
        if preset not in PRESETS:
            raise SystemExit(f"--presets: unknown preset {preset!r} (known: "
                             f"{', '.join(PRESETS)})")
        rows += bench_preset(args, preset, (rank, world, device, use_cuda))
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
