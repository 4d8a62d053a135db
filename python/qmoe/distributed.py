"""qmoe.distributed: expert parallelism over torch.distributed (NCCL on CUDA, gloo on the CPU).

Each rank holds one shard of a layer, experts [first, first + L) of the router's E (a qmoe.Layer
with spec.first_expert / local_experts, docs/semantics.md); the shards cover [0, E) in rank order.
Tokens live on the rank that computes them. One call of ExpertParallelMoE:

    rank r: x [T_r, H], logits [T_r, E]
      plan      which ranks each token must visit: a mask [T_r, R] (a safe superset, see below)
      counts    all_to_all of the per-destination row counts (one int64 per rank pair)
      dispatch  all_to_all of the token rows, x | logits (| router_weights) packed as bytes,
                ordered by destination rank, tokens ascending within a destination
      compute   this rank's shard on what it received: torch.ops.qmoe.moe_forward
      return    all_to_all of the partial outputs back to the tokens' ranks (the same splits,
                reversed)
      combine   each token's partials summed in fp32 and rounded once to the act dtype:
                deterministic: one pass per source rank in rank order (bitwise reproducible)
                fast: one scatter-add over all partials (on CUDA in atomic arrival order)

Routing stays qmoe's: every receiving shard routes the token itself over all E logits, and a
shard that holds none of the token's routes contributes exact zeros. The plan only has to name a
superset of the ranks holding a route; it is computed on the tokens' device with torch ops
(_visit_mask), per routing method, with margins that cover the fp32 rounding of qmoe's scores,
and falls back to every rank where a bound is not available. docs/expert-parallel.md has the
details and the guarantees of the two modes."""

import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from . import _qmoe
from .layer import Layer
from .spec import RoutingMethod
from .torch import _ops
from .torch.modules import QMoE

MODES = ("deterministic", "fast")

# Softmax top-k: logits closer than this to the k-th largest may tie with it after qmoe's fp32
# exp and division (a few ulps of relative error, plus the rounding of x - max, which grows with
# the gap); far below the maximum the probabilities leave the normal range and tie at 0.
_SOFTMAX_TOL, _SOFTMAX_TOL_PER_GAP, _SOFTMAX_MAX_GAP = 1e-4, 1e-5, 60.0
# Grouped top-k: group scores are sums of two sigmoids plus bias, computed here by torch's
# sigmoid (not qmoe's exp_f32): a margin far above their last-bit differences.
_GROUP_TOL = 1e-5


def init_from_env(backend="auto"):
    """Initializes the default process group from torchrun's environment (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT): NCCL and GPU LOCAL_RANK (made current) for backend
    "cuda", or for "auto" where CUDA and qmoe's CUDA backend are available; gloo and the CPU
    otherwise. With NCCL, NVLink multicast stays off (NCCL_NVLS_ENABLE=0) unless the environment
    sets it. Returns the device this rank's layer and tensors belong on."""
    if backend not in ("auto", "cuda", "cpu"):
        raise ValueError(f"backend: expected auto, cuda or cpu, got {backend!r}")
    use_cuda = backend == "cuda" or (backend == "auto" and torch.cuda.is_available()
                                     and _qmoe.backend_available(_qmoe.Backend.cuda))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off unless asked for
        if not 0 <= local_rank < torch.cuda.device_count():
            raise ValueError(f"init_from_env: LOCAL_RANK {local_rank} has no GPU (this machine has "
                             f"{torch.cuda.device_count()}); start at most that many ranks per "
                             f"node, or pass backend='cpu' for gloo on the CPU")
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    return torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")


def even_split(num_experts, world_size):
    """[(first, count)] per rank: E experts in world_size contiguous shards in rank order, the
    first E % world_size ranks one expert more."""
    e, r = int(num_experts), int(world_size)
    if r < 1 or e < r:
        raise ValueError(f"even_split: expected 1 <= world_size <= num_experts, got "
                         f"num_experts={e}, world_size={r}")
    base, extra = divmod(e, r)
    out, first = [], 0
    for i in range(r):
        n = base + (1 if i < extra else 0)
        out.append((first, n))
        first += n
    return out


def shard_from_float(fc1, fc2, fc3=None, *, first, count, biases=None, **kwargs):
    """The shard [first, first + count) of fp32 expert weights over all E experts (fc1 [E, F*I,
    H], ...), quantized and prepared as qmoe.Layer.from_float does (same keywords). Each expert is
    quantized on its own, so a shard holds the same bytes as that slice of the whole layer."""
    fc1 = _as_numpy(fc1)
    e = fc1.shape[0]
    if not (0 <= first and 0 < count and first + count <= e):
        raise ValueError(f"shard_from_float: experts [{first}, {first + count}) do not fit in "
                         f"the weights' {e} experts")
    s = slice(first, first + count)

    def part(w):
        return None if w is None else _as_numpy(w)[s]

    biases = None if biases is None else {k: _as_numpy(v)[s] for k, v in biases.items()}
    return Layer.from_float(fc1[s], part(fc2), part(fc3), biases=biases, num_experts=e,
                            first_expert=first, **kwargs)


def _as_numpy(w):
    if isinstance(w, torch.Tensor):
        return w.detach().cpu().float().numpy()
    return np.asarray(w)


def _describe(layer, expect):
    s, r = layer.spec, layer.spec.routing
    first, count = int(s.first_expert), int(s.weight_experts)
    return {"E": int(s.num_experts), "hidden": int(s.hidden), "act": s.act_dtype.name,
            "routing": (r.method.name, int(r.top_k), int(r.num_shared), r.shared_weight.name,
                        int(r.n_group), int(r.topk_group)),
            "backend": layer.backend.name, "shard": (first, count),
            "expect": None if expect is None else (int(expect[0]), int(expect[1]))}


def _check_shards(descs):
    """Raises ValueError if the ranks' shards do not form one layer; every rank checks the same
    gathered list, so every rank raises the same error (none is left waiting in a collective)."""
    for r, d in enumerate(descs):
        if d["problem"] is not None:
            raise ValueError(f"rank {r}: {d['problem']}")
    ref = descs[0]
    for r, d in enumerate(descs):
        for key in ("E", "hidden", "act", "routing", "backend"):
            if d[key] != ref[key]:
                raise ValueError(f"layer: rank {r}'s shard has {key} {d[key]}, rank 0's has "
                                 f"{ref[key]}; every rank must hold a shard of the same layer")
        first, count = d["shard"]
        if d["expect"] is not None and d["expect"] != (first, count):
            a, n = d["expect"]
            raise ValueError(f"layer: rank {r} was expected to hold experts [{a}, {a + n}) but "
                             f"its layer holds [{first}, {first + count})")
    end = 0
    for r, d in enumerate(descs):
        first, count = d["shard"]
        if first != end:
            raise ValueError(f"layer: rank {r} holds experts [{first}, {first + count}) but the "
                             f"shards before it end at {end}; the ranks' shards must cover "
                             f"[0, E) contiguously in rank order (see even_split)")
        end = first + count
    if end != ref["E"]:
        raise ValueError(f"layer: the ranks' shards cover experts [0, {end}) of {ref['E']}; "
                         "they must cover all of them")


class ExpertParallelMoE(nn.Module):
    """One MoE layer whose experts are spread over the ranks of a process group.

    layer: this rank's shard (a qmoe.Layer or a qmoe.torch.QMoE). group: the process group
    (default: the world). mode: "deterministic" or "fast" (module docstring). router_bias: the
    layer's grouped_topk correction bias [E - num_shared], the same values (sharper plans;
    without it grouped_topk tokens visit every rank; other values could leave a route out). expect: optional (first, count) this rank should hold, e.g.
    even_split(E, world)[rank]. Construction is collective: every rank of the group must
    construct its module at the same point, and all raise the same ValueError if the shards do not
    fit together."""

    def __init__(self, layer, *, group=None, mode="deterministic", router_bias=None,
                 expect=None):
        super().__init__()
        if isinstance(layer, QMoE):
            self.moe = layer
        elif isinstance(layer, Layer):
            self.moe = QMoE(layer)
        else:
            raise TypeError(f"layer: expected a qmoe.Layer or qmoe.torch.QMoE, got "
                            f"{type(layer).__name__}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ExpertParallelMoE: torch.distributed is not initialized (call "
                               "torch.distributed.init_process_group first, e.g. under torchrun)")
        self.group, self.mode = group, mode
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        lay = self.moe.layer
        spec, rt = lay.spec, lay.spec.routing
        self.device = _ops._entry(self.moe.handle).device
        self.num_experts, self.hidden = int(spec.num_experts), int(spec.hidden)
        self.method, self.top_k, self.num_shared = rt.method, int(rt.top_k), int(rt.num_shared)
        self.n_group, self.topk_group = int(rt.n_group), int(rt.topk_group)
        self.router_bias = None
        if router_bias is not None:
            self.router_bias = torch.as_tensor(router_bias).to(self.device, torch.float32)
        # Arguments are checked on every rank after the exchange, so that a mistake on one rank
        # raises everywhere instead of leaving the others waiting in a collective.
        desc = _describe(lay, expect)
        desc["problem"] = self._argument_problem(dist.get_backend(group))
        descs = [None] * self.world
        dist.all_gather_object(descs, desc, group=group)
        _check_shards(descs)
        self.shards = [d["shard"] for d in descs]
        # owner[e]: the rank holding expert e, for turning an expert mask into a rank mask.
        owner = [r for r, (_, n) in enumerate(self.shards) for _ in range(n)]
        self.owner = torch.tensor(owner, dtype=torch.int64, device=self.device)
        self.profile = False  # True: synchronize between stages and fill self.timings (seconds)
        self.timings = {}
        self.last_rows = (0, 0)  # the last call's rows (token visits) sent and received

    def _argument_problem(self, backend):
        """What is wrong with this rank's arguments (a message), or None."""
        if self.mode not in MODES:
            return f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}"
        if backend == "nccl" and self.device.type != "cuda":
            return ("layer: the group's backend is nccl, which needs CUDA tensors, but the layer "
                    "runs on the CPU (use gloo for CPU layers)")
        if backend == "gloo" and self.device.type == "cuda":
            return ("layer: the group's backend is gloo, whose all_to_all takes CPU tensors "
                    "only, but the layer runs on CUDA (use nccl)")
        want = self.num_experts - self.num_shared
        if self.router_bias is not None and tuple(self.router_bias.shape) != (want,):
            return (f"router_bias: expected shape [{want}], got "
                    f"{list(self.router_bias.shape)}")
        return None

    def extra_repr(self):
        return f"rank={self.rank}/{self.world}, shards={self.shards}, mode={self.mode}"

    # ---- the plan ----

    def _visit_mask(self, logits):
        """bool [T, R]: the ranks each token visits, a superset of those holding its routes."""
        t, e, k = logits.shape[0], self.num_experts, self.top_k
        n = e - self.num_shared
        x = logits[:, :n].float()
        m = RoutingMethod
        if self.method in (m.topk_softmax, m.topk_sigmoid, m.sparse_mixer):
            # qmoe selects the top k of x: never an expert below the k-th largest value.
            cand = x >= x.topk(k, dim=1).values[:, -1:]
        elif self.method == m.softmax_topk:
            # qmoe ranks fp32 probabilities, which may round equal for logits a few ulps apart.
            kth = x.topk(k, dim=1).values[:, -1:]
            gap = x.amax(dim=1, keepdim=True) - kth
            cand = x >= kth - (_SOFTMAX_TOL + _SOFTMAX_TOL_PER_GAP * gap)
            cand |= gap > _SOFTMAX_MAX_GAP
        elif self.method == m.grouped_topk and self.router_bias is not None:
            # Every expert of each group that may be among the topk_group best.
            c = (torch.sigmoid(x) + self.router_bias).view(t, self.n_group, n // self.n_group)
            score = c.topk(min(2, c.shape[2]), dim=2).values.sum(dim=2)
            kth = score.topk(self.topk_group, dim=1).values[:, -1:]
            cand = (score >= kth - _GROUP_TOL).repeat_interleave(n // self.n_group, dim=1)
        else:
            cand = torch.ones_like(x, dtype=torch.bool)
        # Non-finite logits: every rank sees the token, so its error is not lost to a skipped rank.
        cand |= ~torch.isfinite(x).all(dim=1, keepdim=True)
        if self.num_shared:
            cand = torch.cat([cand, cand.new_ones(t, self.num_shared)], dim=1)
        ranks = torch.zeros(t, self.world, dtype=torch.float32, device=logits.device)
        ranks.index_add_(1, self.owner, cand.float())
        return ranks > 0

    # ---- the call ----

    def _stage(self, name, start):
        """Records the time since start under name when profiling; returns the new start."""
        if not self.profile:
            return start
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.timings[name] = self.timings.get(name, 0.0) + now - start
        return now

    def forward(self, x, router_logits, router_weights=None):
        """x [T, H] (or [B, S, H]) and router_logits [T, E] of this rank's tokens, as
        torch.ops.qmoe.moe_forward takes them; returns the whole layer's output for them.
        Collective: every rank of the group calls it, T may differ per rank and be 0."""
        self.timings = {}
        if self.profile and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            if torch.is_grad_enabled() and any(
                    t is not None and t.requires_grad for t in (x, router_logits, router_weights)):
                raise RuntimeError("ExpertParallelMoE: no gradient (qmoe runs inference only); "
                                   "call it under torch.no_grad() or detach the inputs")
            _ops._check(x, router_logits, self.moe.handle, router_weights)
        except (ValueError, TypeError, RuntimeError):
            self._exchange_counts(None)  # tells the other ranks, so none waits for this one
            raise
        if self.world == 1:
            self.last_rows = (x.numel() // self.hidden,) * 2
            out = self.moe(x, router_logits, router_weights)
            self._stage("compute", start)
            return out
        with torch.no_grad():
            return self._forward(x, router_logits, router_weights, start)

    def _exchange_counts(self, send):
        """all_to_all of the per-destination row counts; a rank whose input was refused sends -1
        to everyone and every rank raises. Returns (send, recv) as lists."""
        refused = send is None
        if refused:
            send = torch.full((self.world,), -1, dtype=torch.int64, device=self.device)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        both = torch.stack([send, recv]).tolist()  # on the host: the splits are host lists
        bad = [r for r, c in enumerate(both[1]) if c < 0]
        if bad and not refused:
            raise RuntimeError(f"ExpertParallelMoE: rank(s) {bad} refused their input (see the "
                               "error raised there); no rank ran the layer")
        return both

    def _forward(self, x, router_logits, router_weights, start):
        shape, h = x.shape, self.hidden
        x = x.reshape(-1, h)
        t = x.shape[0]
        mask = self._visit_mask(router_logits)
        # (rank, token) pairs, rank-major and tokens ascending: the send order.
        pairs = mask.t().nonzero()
        tokens = pairs[:, 1]
        start = self._stage("plan", start)
        send_counts, recv_counts = self._exchange_counts(mask.sum(dim=0))
        self.last_rows = (sum(send_counts), sum(recv_counts))
        start = self._stage("counts", start)

        parts = [x, router_logits] + ([] if router_weights is None else [router_weights])
        widths = [p.shape[1] * p.element_size() for p in parts]
        packed = torch.cat([p.index_select(0, tokens).view(torch.uint8) for p in parts], dim=1)
        recv = packed.new_empty((sum(recv_counts), sum(widths)))
        dist.all_to_all_single(recv, packed, recv_counts, send_counts, group=self.group)
        got, col = [], 0
        for p, w in zip(parts, widths):
            got.append(recv[:, col:col + w].contiguous().view(p.dtype))
            col += w
        start = self._stage("dispatch", start)

        error = None
        try:
            partial = self.moe(got[0], got[1], got[2] if len(got) > 2 else None)
        except (RuntimeError, ValueError) as err:
            # This shard refused what it received (e.g. non-finite logits on the CPU backend).
            # The exchange below still runs, so no rank hangs; the tokens' owners get NaN, the
            # CUDA backend's answer for such inputs, and this rank raises.
            error = err
            partial = torch.full((recv.shape[0], h), float("nan"), dtype=x.dtype,
                                 device=x.device)
        start = self._stage("compute", start)

        back = partial.new_empty((tokens.shape[0], h))
        dist.all_to_all_single(back, partial, send_counts, recv_counts, group=self.group)
        start = self._stage("return", start)

        acc = torch.zeros((t, h), dtype=torch.float32, device=x.device)
        if self.mode == "deterministic":
            begin = 0
            for n in send_counts:  # source ranks in rank order: fp32 sums in that order
                if n:
                    acc.index_add_(0, tokens[begin:begin + n], back[begin:begin + n].float())
                begin += n
        else:
            acc.index_add_(0, tokens, back.float())
        out = acc.to(x.dtype).reshape(shape)
        self._stage("combine", start)
        if error is not None:
            raise error
        return out

