"""qmoe.distributed.ExpertParallelMoE: a layer sharded over 2 and 3 processes (gloo, CPU) against
the unsharded layer and qmoe's fp64 oracle, deterministic mode bitwise reproducible, ranks with
zero tokens, uneven token counts and expert splits, every routing method's plan, and bad
arguments raising the same clear error on every rank. A GPU test (NCCL) needs two CUDA devices.

Each world size is one torch.multiprocessing spawn running a list of cases, because starting the
processes (importing torch) costs more than the cases themselves. A failing case raises in its
process, and the spawn reports that traceback."""

import json
import multiprocessing
import os
import runpy
import socket
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if os.environ.get("QMOE_REQUIRE_PYTHON"):
    import qmoe
else:
    qmoe = pytest.importorskip("qmoe",
                               reason="qmoe Python module not built (PYTHONPATH=build/python)")
import qmoe.torch as qt  # noqa: E402
from qmoe.distributed import ExpertParallelMoE, even_split, shard_from_float  # noqa: E402

from test_python_api import rel  # noqa: E402

mp = torch.multiprocessing
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")

H, I, E = 128, 64, 8  # the shapes of the operator's tests (test_python_api.py), GPU ones included
F32_BUDGET, BF16_BUDGET = 1e-5, 2e-2  # the op's own tests' budgets (test_torch_op.py)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(worker, world, args):
    """Runs worker(rank, *args) in `world` processes forked from a forkserver that has imported
    torch and qmoe once: each process then starts in well under a second, where a spawned one
    imports torch again (seconds on a busy 2-core machine)."""
    multiprocessing.set_forkserver_preload(["torch", "qmoe.torch", "qmoe.distributed"])
    mp.start_processes(worker, args=args, nprocs=world, join=True, start_method="forkserver")


def _spawn(fn, world, seed, backend="gloo"):
    _start(_worker, world, (world, _free_port(), backend, fn, seed))


def _worker(rank, world, port, backend, fn, seed):
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.set_num_threads(1)
        fn(rank, world, seed)
    finally:
        dist.destroy_process_group()


def _weights(seed, e=E, fc3=False):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((e, (1 if fc3 else 2) * I, H)) / np.sqrt(H)).astype(np.float32)
    w2 = (rng.standard_normal((e, H, I)) / np.sqrt(I)).astype(np.float32)
    return w1, w2


def _pair(seed, split, rank, backend="cpu", **kw):
    """(this rank's shard, the whole layer as a QMoE module) from the same weights."""
    w1, w2 = _weights(seed, kw.pop("experts", E))
    kw.setdefault("format", "int8")
    kw.setdefault("block_size", 64)
    kw.setdefault("top_k", 2)
    first, count = split[rank]
    shard = shard_from_float(w1, w2, first=first, count=count, backend=backend, **kw)
    return shard, qt.QMoE.from_float(w1, w2, backend=backend, **kw)


def _inputs(seed, rank, t, e=E, dtype=torch.float32, device="cpu", ties=False):
    g = torch.Generator().manual_seed((seed * 31 + rank) % 2**62)
    x = torch.randn(t, H, generator=g)
    logits = torch.randn(t, e, generator=g)
    if ties:  # few distinct values: equal logits, equal probabilities, ties in every ranking
        logits = torch.round(logits * 2) / 2
    if ties == "near":  # and logits a few ulps apart, whose fp32 probabilities may round equal
        logits = logits * (1 + torch.randint(-3, 4, logits.shape, generator=g) * 2.0**-23)
    return x.to(device, dtype), logits.to(device, dtype)


def _boundary_ties(logits):
    """Logits whose second pick is a near tie across the shards: expert 5 (rank 1) leads, expert
    6 (rank 1) is one ulp above expert 1 (rank 0). Where their fp32 probabilities round equal,
    qmoe takes expert 1 (the lower index), which a plan by logits alone would miss."""
    out = torch.full_like(logits, -4.0)
    v = logits[:, 0].abs() / 4
    out[:, 5] = 3.0
    out[:, 1] = v
    out[:, 6] = torch.nextafter(v, torch.full_like(v, 10.0))
    return out


def _check_against_whole(ep, whole, x, logits, budget, oracle=True):
    y = ep(x, logits)
    assert y.shape == x.shape and y.dtype == x.dtype
    if x.shape[0] == 0:
        return y
    ref = whole(x, logits)
    assert rel(y.float().cpu().numpy(), ref.float().cpu().numpy()) < budget
    if oracle:
        fp64 = whole.layer.reference(x.float().numpy(), logits.float().numpy())
        assert rel(y.float().numpy(), fp64) < budget
    return y


# ---- two processes ----

def _cases_two(rank, world, seed):
    split = even_split(E, world)
    shard, whole = _pair(seed, split, rank, normalize=True)
    det = ExpertParallelMoE(shard, expect=split[rank])
    fast = ExpertParallelMoE(shard, mode="fast")
    assert det.shards == [(0, 4), (4, 8 - 4)]

    # Uneven token counts, tie-prone logits; deterministic: the same bits on every repeat.
    x, logits = _inputs(seed, rank, [7, 3][rank], ties=True)
    y = _check_against_whole(det, whole, x, logits, F32_BUDGET)
    for _ in range(3):
        assert torch.equal(det(x, logits), y)
    _check_against_whole(fast, whole, x, logits, F32_BUDGET)
    # [B, S, H] input as the op takes it.
    assert torch.equal(det(x.view(1, -1, H), logits), y.view(1, -1, H))

    # Zero tokens on one rank, then on both.
    x, logits = _inputs(seed, rank, [0, 5][rank])
    _check_against_whole(det, whole, x, logits, F32_BUDGET)
    x, logits = _inputs(seed, rank, 0)
    assert det(x, logits).shape == (0, H)

    # The plan skips ranks: with top-2 of 8 over two shards some tokens need one rank only.
    x, logits = _inputs(seed, rank, 64)
    mask = det._visit_mask(logits)
    assert mask.any(dim=1).all() and not mask.all()

    # A rank whose input is refused raises its error; the others raise instead of waiting.
    x, logits = _inputs(seed, rank, 4)
    bad = x[:, : H - 1].contiguous() if rank == 1 else x
    with pytest.raises(ValueError if rank == 1 else RuntimeError,
                       match="x: expected shape" if rank == 1 else "rank\\(s\\) \\[1\\] refused"):
        det(bad, logits)
    _check_against_whole(det, whole, x, logits, F32_BUDGET)  # the group is still in step
    # A non-finite logit on one rank: every shard sees the token and the CPU backend refuses it.
    nan_logits = logits.clone()
    if rank == 1:
        nan_logits[2, 3] = float("nan")
    with pytest.raises(qmoe.Error, match="router"):
        det(x, nan_logits)
    _check_against_whole(det, whole, x, logits, F32_BUDGET)

    # Uneven expert split: 2 experts on rank 0, 6 on rank 1.
    uneven = [(0, 2), (2, 6)]
    shard, whole = _pair(seed + 1, uneven, rank, format="int4", normalize=True)
    ep = ExpertParallelMoE(shard, expect=uneven[rank])
    x, logits = _inputs(seed, rank, [2, 9][rank], ties=True)
    _check_against_whole(ep, whole, x, logits, F32_BUDGET)

    # Shards in the wrong order, a shard other than the expected one, a layer of all experts.
    swapped = [(4, 4), (0, 4)]
    shard, _ = _pair(seed, swapped, rank)
    with pytest.raises(ValueError, match="rank 0 holds experts \\[4, 8\\) but the shards before"):
        ExpertParallelMoE(shard)
    with pytest.raises(ValueError, match="rank 0 was expected to hold experts \\[0, 4\\)"):
        ExpertParallelMoE(shard, expect=split[rank])
    with pytest.raises(ValueError, match="rank 1 holds experts \\[0, 8\\)"):
        ExpertParallelMoE(whole)
    # A bad argument on one rank raises on both.
    good, good_whole = _pair(seed, split, rank)
    with pytest.raises(ValueError, match="rank 1: mode: expected one of deterministic, fast"):
        ExpertParallelMoE(good, mode="exact" if rank == 1 else "fast")
    with pytest.raises(ValueError, match="rank 0: router_bias: expected shape \\[8\\]"):
        ExpertParallelMoE(good, router_bias=np.zeros(3, np.float32) if rank == 0 else None)
    _check_against_whole(ExpertParallelMoE(good), good_whole, x, logits, F32_BUDGET)


def _cases_methods(rank, world, seed):
    """Every routing method's plan, with and without shared experts, bf16 against bf16."""
    split = even_split(E, world)
    cases = [
        dict(routing="topk_softmax"),
        dict(routing="topk_sigmoid", normalize=True),
        dict(routing="sparse_mixer", sparse_mixer_eps=0.01),
        dict(routing="softmax_topk", num_shared=1, top_k=2),
        dict(routing="topk_sigmoid", num_shared=1, shared_weight="one", combine="scale_input"),
        dict(routing="grouped_topk", n_group=4, topk_group=2, normalize=True,
             routed_scaling_factor=2.5),
    ]
    for kw in cases:
        bias = None
        if kw["routing"] == "grouped_topk":
            bias = np.random.default_rng(seed).standard_normal(E).astype(np.float32) * 0.1
            kw["router_correction_bias"] = bias
        shard, whole = _pair(seed, split, rank, **kw)
        ep = ExpertParallelMoE(shard, router_bias=bias)
        x, logits = _inputs(seed, rank, [100, 160][rank], ties="near")
        _check_against_whole(ep, whole, x, logits, F32_BUDGET, oracle=False)
        if kw["routing"] == "softmax_topk":
            _check_against_whole(ep, whole, x, _boundary_ties(logits), F32_BUDGET, oracle=False)
    # bf16 activations, fast mode.
    shard, whole = _pair(seed, split, rank, format="int4", normalize=True, dtype="bf16")
    ep = ExpertParallelMoE(shard, mode="fast")
    x, logits = _inputs(seed, rank, [6, 2][rank], dtype=torch.bfloat16)
    _check_against_whole(ep, whole, x, logits, BF16_BUDGET, oracle=False)
    # Mixed dtypes in one packed row: bf16 x, f32 logits and router weights.
    g = torch.Generator().manual_seed(seed % 2**62 + rank)
    logits32, rw = torch.randn(x.shape[0], E, generator=g), torch.rand(x.shape[0], E, generator=g)
    y = ep(x, logits32, rw)
    ref = whole(x, logits32, rw)
    assert rel(y.float().numpy(), ref.float().numpy()) < BF16_BUDGET
    assert rel(y.float().numpy(), whole(x, logits32).float().numpy()) > 0.01  # rw mattered


def _cases_two_all(rank, world, seed):
    _cases_two(rank, world, seed)
    _cases_methods(rank, world, seed)


def test_two_ranks(seed):
    _spawn(_cases_two_all, 2, seed)


# ---- three processes ----

def _cases_three(rank, world, seed):
    split = even_split(E, world)
    assert split == [(0, 3), (3, 3), (6, 2)]
    shard, whole = _pair(seed, split, rank, normalize=True)
    det = ExpertParallelMoE(shard, expect=split[rank])
    fast = ExpertParallelMoE(shard, mode="fast")
    x, logits = _inputs(seed, rank, [4, 0, 9][rank], ties=True)
    y = _check_against_whole(det, whole, x, logits, F32_BUDGET)
    assert torch.equal(ExpertParallelMoE(shard)(x, logits), y)  # a new module, the same bits
    _check_against_whole(fast, whole, x, logits, F32_BUDGET)
    # A gap between shards is named.
    holes = [(0, 3), (4, 2), (6, 2)]
    shard, _ = _pair(seed, holes, rank)
    with pytest.raises(ValueError, match="rank 1 holds experts \\[4, 6\\) but the shards before"):
        ExpertParallelMoE(shard)


def test_three_ranks(seed):
    _spawn(_cases_three, 3, seed)


def _deterministic_run(rank, world, seed):
    """One deterministic call per rank, its output saved for the parent to compare across runs."""
    seed, path = seed
    split = even_split(E, world)
    shard, _ = _pair(seed, split, rank, format="int4", normalize=True)
    x, logits = _inputs(seed, rank, [5, 12, 1][rank], ties="near")
    torch.save(ExpertParallelMoE(shard)(x, logits), f"{path}.{rank}")


def test_deterministic_across_runs(seed, tmp_path):
    runs = []
    for n in range(2):
        path = str(tmp_path / f"run{n}")
        _spawn(_deterministic_run, 3, (seed, path))
        runs.append([torch.load(f"{path}.{r}") for r in range(3)])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert [y.shape[0] for y in runs[0]] == [5, 12, 1]


def test_even_split_and_arguments():
    assert even_split(8, 3) == [(0, 3), (3, 3), (6, 2)]
    assert even_split(5, 5) == [(i, 1) for i in range(5)]
    with pytest.raises(ValueError, match="1 <= world_size <= num_experts"):
        even_split(2, 3)
    w1, w2 = _weights(0)
    with pytest.raises(ValueError, match="experts \\[6, 10\\) do not fit"):
        shard_from_float(w1, w2, first=6, count=4, top_k=2, format="int8", block_size=64)
    shard = shard_from_float(w1, w2, first=2, count=3, top_k=2, format="int8", block_size=64)
    assert (shard.spec.first_expert, shard.spec.weight_experts, shard.spec.num_experts) == (2, 3, 8)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            ExpertParallelMoE(shard)


# ---- two GPUs (NCCL) ----

def _cases_gpu(rank, world, seed):
    split = even_split(E, world)
    dev = torch.device("cuda", rank)
    shard, whole = _pair(seed, split, rank, backend="cuda", device=rank, format="int4",
                         normalize=True, dtype="bf16")
    det = ExpertParallelMoE(shard, expect=split[rank])
    fast = ExpertParallelMoE(shard, mode="fast")
    for t in ([5, 0], [1, 1], [64, 3], [300, 257]):
        x, logits = _inputs(seed, rank, t[rank], dtype=torch.bfloat16, device=dev)
        y = _check_against_whole(det, whole, x, logits, BF16_BUDGET, oracle=False)
        for _ in range(3):
            assert torch.equal(det(x, logits), y)
        _check_against_whole(fast, whole, x, logits, BF16_BUDGET, oracle=False)


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 2
                         and qmoe.backend_available(qmoe.Backend.cuda)),
                    reason="needs two CUDA devices and a CUDA build of qmoe")
def test_two_gpus_nccl(seed):
    _pair(seed, even_split(E, 2), 0, backend="cuda", format="int4", dtype="bf16")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
    _spawn(_cases_gpu, 2, seed, backend="nccl")


# ---- the example and the benchmark, as torchrun starts them ----

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_script(rank, world, port, script, argv):
    """One rank of `torchrun --nproc-per-node world script argv`: torchrun's environment, then
    the script as __main__; a non-zero exit fails the test."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.argv = [script, *argv]
    torch.set_num_threads(1)
    try:
        runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), f"{script} exited with {e.code} on rank {rank}"


def test_example():
    _start(_run_script, 2, (2, _free_port(), "examples/expert_parallel.py",
                            ["--backend", "cpu", "--tokens", "6"]))


def test_benchmark_smoke(tmp_path):
    rows = tmp_path / "rows.json"
    _start(_run_script, 2, (2, _free_port(), "bench/expert_parallel.py",
                            ["--backend", "cpu", "--shape", "tiny", "--tokens", "0,3", "--iters",
                             "1", "--warmup", "1", "--json", str(rows)]))
    got = json.loads(rows.read_text())
    assert [(r["preset"], r["tokens_per_rank"]) for r in got] == [
        ("qwen3-30b-a3b", 0), ("qwen3-30b-a3b", 3), ("deepseek-v3", 0), ("deepseek-v3", 3)]
    assert all(r["layer_us"] > 0 and r["world_size"] == 2 for r in got)
    assert all(1 <= r["ranks_per_token"] <= 2 for r in got if r["tokens_per_rank"])
