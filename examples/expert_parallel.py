#!/usr/bin/env python3
"""Expert parallelism with qmoe.distributed: one random Qwen3-like MoE layer (softmax top-k,
normalized, SwiGLU) whose experts are split evenly over the ranks; each rank runs its own tokens
(a different count per rank, 0 on the last rank when there are more than two) through the sharded
layer, and rank 0 checks every rank's output against the unsharded layer.

    export NCCL_NVLS_ENABLE=0 PYTHONPATH=build/python
    torchrun --nproc-per-node 2 examples/expert_parallel.py
    torchrun --nproc-per-node 3 examples/expert_parallel.py --backend cpu

NCCL and the CUDA backend (one GPU per rank, LOCAL_RANK) when CUDA is available, gloo and the CPU
backend otherwise or with --backend cpu. --shape 2048,768,128,8 gives Qwen3-30B-A3B's layer.
Exits 1 if an output is off by more than the budget (fp32 1e-5, bf16 2e-2)."""

import argparse
import sys

import numpy as np
import torch
import torch.distributed as dist

import qmoe.torch as qt
from qmoe.distributed import ExpertParallelMoE, even_split, init_from_env, shard_from_float

BUDGET = {"f32": 1e-5, "bf16": 2e-2, "f16": 2e-2}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="256,128,16,4", help="hidden,inter,experts,top_k")
    p.add_argument("--format", default="int4")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--dtype", default=None, help="act dtype (default bf16 on CUDA, f32 on CPU)")
    p.add_argument("--tokens", type=int, default=24, help="tokens on rank 0 (others differ)")
    p.add_argument("--mode", default="deterministic", choices=["deterministic", "fast"])
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse()
    device = init_from_env(args.backend)
    use_cuda = device.type == "cuda"
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = args.dtype or ("bf16" if use_cuda else "f32")
    h, i, e, k = (int(v) for v in args.shape.split(","))
    layer_kw = dict(top_k=k, format=args.format, block_size=args.block_size, normalize=True,
                    dtype=dtype, backend=device.type, device=device.index or 0)

    # The same weights on every rank (the same seed); each rank quantizes only its experts.
    rng = np.random.default_rng(args.seed)
    w1 = (rng.standard_normal((e, 2 * i, h)) / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32)
    first, count = even_split(e, world)[rank]
    shard = shard_from_float(w1, w2, first=first, count=count, **layer_kw)
    moe = ExpertParallelMoE(shard, mode=args.mode, expect=(first, count))

    tokens = 0 if world > 2 and rank == world - 1 else args.tokens + 5 * rank
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    act = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    x = torch.randn(tokens, h, generator=g).to(device, act)
    logits = torch.randn(tokens, e, generator=g).to(device, act)
    with torch.no_grad():
        y = moe(x, logits)
    print(f"rank {rank}/{world}: experts [{first}, {first + count}), {tokens} tokens -> "
          f"{list(y.shape)} on {device}", flush=True)

    gathered = [None] * world if rank == 0 else None
    dist.gather_object((x.cpu(), logits.cpu(), y.cpu()), gathered, dst=0)
    all_ok = True
    if rank == 0:
        whole = qt.QMoE.from_float(w1, w2, **layer_kw)
        for r, (xr, lr, yr) in enumerate(gathered):
            if xr.shape[0] == 0:
                continue
            ref = whole(xr.to(device), lr.to(device)).float().cpu()
            err = (torch.linalg.norm(yr.float() - ref) / torch.linalg.norm(ref)).item()
            good = err < BUDGET[dtype]
            print(f"rank {r}: relative difference to the unsharded layer {err:.2e} "
                  f"(budget {BUDGET[dtype]:.0e}) {'ok' if good else 'FAILED'}", flush=True)
            all_ok = all_ok and good
    ok = torch.tensor([1 if all_ok else 0], device=device)
    dist.broadcast(ok, src=0)  # every rank exits with rank 0's verdict
    dist.destroy_process_group()
    return 0 if ok.item() else 1


if __name__ == "__main__":
    sys.exit(main())
