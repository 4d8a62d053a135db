"""How each transformers MoE block maps onto a qmoe LayerSpec: one adapter per model family.

An adapter reads a block and returns a BlockPlan: the routed experts as fp weights in qmoe's
layout (fc1 [E, F*I, H], fc2 [E, H, I], y = x W^T), the routing and activation fields of the
model, the router (a linear layer the block keeps in torch) and, where the model has them, shared
experts. transformers stores experts in three layouts, all converted here:

    fused, y = x W^T   gate_up_proj [E, 2I, H], down_proj [E, H, I]   (Qwen, Mixtral, DeepSeek...)
    fused, y = x W     gate_up_proj [E, H, 2I], down_proj [E, I, H]   (gpt-oss, Llama-4): transposed
    ModuleList         one MLP per expert with gate/up/down Linear layers (transformers 4)

Shared experts (an MLP every token runs) join the routed experts' layer as qmoe's own shared
experts (routing.num_shared) where their intermediate size S is a multiple m of the routed
experts' I: the MLP is cut into m experts of I rows (an MLP sums over its intermediate rows, so
the m parts add up to it), each weighted by sigmoid(the shared gate's logit) (shared_weight
sigmoid, Qwen2: the gate's logit fills m appended router columns) or by exactly 1 (shared_weight
one, DeepSeek-V3, Llama-4: the appended columns are zeros nobody reads). fold_shared() does
that. Otherwise they become a second qmoe layer of one expert: its router logit is the gate's
with weight sigmoid(logit) (routing topk_sigmoid), or a zero logit through topk_softmax over the
one expert, whose weight exp(0) / exp(0) is exactly 1."""

from dataclasses import dataclass, field

import torch


@dataclass
class Experts:
    """Expert weights in qmoe's layout and how the layer runs them."""
    fc1: torch.Tensor                       # [E, F*I, H]
    fc2: torch.Tensor                       # [E, H, I]
    layer_kwargs: dict                      # Layer.from_float keywords: routing, activation, ...
    biases: dict = field(default_factory=dict)


@dataclass
class BlockPlan:
    routed: Experts
    router_weight: torch.Tensor             # [E, H]
    router_bias: torch.Tensor = None        # [E] (gpt-oss)
    router_fp32: bool = False               # logits from fp32 inputs and weights (DeepSeek-V3)
    shared: Experts = None                  # one always-on expert
    shared_gate: torch.Tensor = None        # [1, H]: shared weight sigmoid(x . g); None: weight 1
    returns_logits: bool = False            # the block returns (out, router logits)


def _block_error(block, what):
    return ValueError(f"{type(block).__name__}: {what}")


def _is_silu(act):
    return "silu" in type(act).__name__.lower()


def _require_silu(block, act, where="expert"):
    if not _is_silu(act):
        raise _block_error(block, f"expected a SiLU {where} activation (qmoe's swiglu), got "
                                  f"{type(act).__name__}")


def _swiglu(top_k, routing, **fields):
    return dict(top_k=int(top_k), routing=routing, activation="swiglu", glu="concatenated",
                **fields)


def _fused(block, transposed=False):
    """(fc1, fc2) from fused 3-D expert parameters."""
    ex = block.experts
    _require_silu(block, ex.act_fn)
    fc1, fc2 = ex.gate_up_proj.detach(), ex.down_proj.detach()
    if transposed:
        fc1, fc2 = fc1.transpose(1, 2), fc2.transpose(1, 2)
    return fc1, fc2


def _module_list(block, gate_name, up_name, down_name):
    """(fc1, fc2) from transformers 4's ModuleList of expert MLPs."""
    mlps = list(block.experts)
    for m in mlps:
        _require_silu(block, m.act_fn)
    fc1 = torch.stack([torch.cat([getattr(m, gate_name).weight, getattr(m, up_name).weight])
                       for m in mlps]).detach()
    fc2 = torch.stack([getattr(m, down_name).weight for m in mlps]).detach()
    return fc1, fc2


def _mlp_expert(block, mlp):
    """A gate/up/down MLP as a one-expert layer (always on: the caller picks its weight)."""
    act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    _require_silu(block, act, "shared-expert")
    fc1 = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()[None]
    fc2 = mlp.down_proj.weight.detach()[None]
    return fc1, fc2


def _shared_experts(block, mlp, gated):
    fc1, fc2 = _mlp_expert(block, mlp)
    routing = "topk_sigmoid" if gated else "topk_softmax"
    return Experts(fc1, fc2, _swiglu(1, routing))


def fold_shared(plan, block_size):
    """(routed Experts with the shared MLP appended as its m = S / I last experts, m), or None
    where the shared MLP cannot join the routed layer: S not a multiple of I, biases, or m > 1
    with FC2 quantized in groups (block_size, 0 for one per row) that a cut at a multiple of I
    would change."""
    routed, shared = plan.routed, plan.shared
    if shared is None or routed.biases or shared.biases:
        return None
    inter, s = routed.fc2.shape[2], shared.fc2.shape[2]
    if s % inter or routed.fc1.shape[1] != 2 * inter \
            or routed.layer_kwargs.get("glu") != "concatenated":
        return None
    m = s // inter
    if m > 1 and (block_size <= 0 or inter % block_size):
        return None
    gate, up = shared.fc1[0, :s], shared.fc1[0, s:]
    fc1 = [torch.cat([gate[c * inter:(c + 1) * inter], up[c * inter:(c + 1) * inter]])
           for c in range(m)]
    fc2 = [shared.fc2[0, :, c * inter:(c + 1) * inter] for c in range(m)]
    kw = dict(routed.layer_kwargs, num_shared=m,
              shared_weight="one" if plan.shared_gate is None else "sigmoid")
    return Experts(torch.cat([routed.fc1, torch.stack(fc1).to(routed.fc1.dtype)]),
                   torch.cat([routed.fc2, torch.stack(fc2).to(routed.fc2.dtype)]), kw), m


def _norm_topk(block):
    for owner in (block.gate, block):
        if hasattr(owner, "norm_topk_prob"):
            return bool(owner.norm_topk_prob)
    raise _block_error(block, "no norm_topk_prob attribute found")


def _softmax_family(names, normalize):
    """Qwen3-MoE, OLMoE, Mixtral: softmax over every expert (fp32), top-k, optionally
    renormalized."""
    def adapt(block):
        if hasattr(block.experts, "gate_up_proj"):
            (fc1, fc2), returns_logits = _fused(block), False
        else:
            (fc1, fc2), returns_logits = _module_list(block, *names), True
        top_k = getattr(block.gate, "top_k", None) or getattr(block, "top_k")
        kw = _swiglu(top_k, "softmax_topk", normalize=normalize(block))
        return BlockPlan(Experts(fc1, fc2, kw), block.gate.weight,
                         returns_logits=returns_logits)
    return adapt


def _qwen2_moe(block):
    """Qwen2-MoE: Qwen3's routing plus one shared expert weighted by sigmoid(shared gate)."""
    plan = _softmax_family(("gate_proj", "up_proj", "down_proj"), _norm_topk)(block)
    plan.shared = _shared_experts(block, block.shared_expert, gated=True)
    plan.shared_gate = block.shared_expert_gate.weight
    return plan


def _gpt_oss(block):
    """gpt-oss: logits with a bias, top-k then softmax over the k; fused gate_up [E, H, 2I] with
    gate and up interleaved along 2I, both projections biased; the clamped SwiGLU
    (up + 1) * g * sigmoid(alpha g), g = min(gate, limit), up clamped to [-limit, limit].
    The block returns (out, top-k scores), which the decoder layer discards; the QMoEBlock
    returns (out, router logits) in their place."""
    ex = block.experts
    fc1 = ex.gate_up_proj.detach().transpose(1, 2)  # [E, 2I, H], rows g0, u0, g1, u1, ...
    fc2 = ex.down_proj.detach().transpose(1, 2)
    kw = dict(top_k=int(block.router.top_k), routing="topk_softmax", activation="swiglu",
              glu="interleaved", alpha=float(ex.alpha), beta=1.0, limit=float(ex.limit))
    biases = {"fc1": ex.gate_up_proj_bias.detach(), "fc2": ex.down_proj_bias.detach()}
    return BlockPlan(Experts(fc1, fc2, kw, biases), block.router.weight,
                     router_bias=block.router.bias, returns_logits=True)


def _deepseek_v3(block):
    """DeepSeek-V3 (and GLM-4-MoE, the same block): fp32 logits, sigmoid scores + correction
    bias, grouped top-k, optional normalization, routed_scaling_factor; shared experts added
    with weight 1."""
    gate = block.gate
    fc1, fc2 = _fused(block)
    kw = _swiglu(gate.top_k, "grouped_topk", normalize=bool(gate.norm_topk_prob),
                 n_group=int(gate.num_group), topk_group=int(gate.topk_group),
                 routed_scaling_factor=float(gate.routed_scaling_factor),
                 router_correction_bias=gate.e_score_correction_bias.detach().float())
    return BlockPlan(Experts(fc1, fc2, kw), gate.weight, router_fp32=True,
                     shared=_shared_experts(block, block.shared_experts, gated=False))


def _phimoe(block):
    """Phi-3.5-MoE: the sparse mixer (always two experts, whatever top_k says) with the router's
    jitter eps. Its input jitter and Gumbel sampling act only in training."""
    if block.training:
        raise _block_error(block, "the sparse mixer samples experts in training mode; call "
                                  "model.eval() first (qmoe runs the inference routing)")
    fc1, fc2 = _fused(block)
    kw = _swiglu(2, "sparse_mixer", sparse_mixer_eps=float(block.router.router_jitter_noise))
    return BlockPlan(Experts(fc1, fc2, kw), block.router.weight)


def _llama4(block):
    """Llama-4: top-k of the logits weighted by sigmoid(logit), applied to the expert's input
    (combine scale_input); fused gate_up [E, H, 2I] (gate then up); one shared expert added with
    weight 1. The block returns (out, router logits)."""
    fc1, fc2 = _fused(block, transposed=True)
    kw = _swiglu(block.router.top_k, "topk_sigmoid", combine="scale_input")
    return BlockPlan(Experts(fc1, fc2, kw), block.router.weight,
                     shared=_shared_experts(block, block.shared_expert, gated=False),
                     returns_logits=True)


_QWEN = ("gate_proj", "up_proj", "down_proj")
_MIXTRAL = ("w1", "w3", "w2")


def _always(block):  # routers that renormalize the k weights unconditionally
    return True


# Block class name -> adapter. Second names in a row are the same block under another model's
# name (transformers subclasses adding nothing, or copies).
ADAPTERS = {
    "Qwen3MoeSparseMoeBlock": _softmax_family(_QWEN, _norm_topk),
    "Qwen3VLMoeTextSparseMoeBlock": _softmax_family(_QWEN, _always),
    "Qwen3OmniMoeThinkerTextSparseMoeBlock": _softmax_family(_QWEN, _norm_topk),
    "OlmoeSparseMoeBlock": _softmax_family(_QWEN, _norm_topk),
    "FlexOlmoSparseMoeBlock": _softmax_family(_QWEN, _norm_topk),
    "MixtralSparseMoeBlock": _softmax_family(_MIXTRAL, _always),
    "MiniMaxSparseMoeBlock": _softmax_family(_MIXTRAL, _always),
    "Qwen2MoeSparseMoeBlock": _qwen2_moe,
    "Qwen3NextSparseMoeBlock": _qwen2_moe,
    "GptOssMLP": _gpt_oss,
    "DeepseekV3MoE": _deepseek_v3,
    "Glm4MoeMoE": _deepseek_v3,
    "Glm4MoeLiteMoE": _deepseek_v3,
    "Glm4vMoeTextMoE": _deepseek_v3,
    "Dots1MoE": _deepseek_v3,
    "SolarOpenMoE": _deepseek_v3,
    "PhimoeSparseMoeBlock": _phimoe,
    "Llama4TextMoe": _llama4,
}

# Blocks whose routing qmoe cannot express, with what it lacks. quantize_moe_block and
# replace_moe_blocks raise ValueError naming the block and the reason.
REFUSED = {
    "DeepseekV2Moe": "routing on softmax probabilities times routed_scaling_factor, with groups "
                     "ranked by their largest probability (group_limited_greedy); qmoe scales "
                     "only grouped_topk, whose groups rank by the sum of their two best sigmoid "
                     "scores",
    "Ernie4_5_MoeSparseMoeBlock": "selection on softmax probabilities plus a correction bias "
                                  "(moe_statics); qmoe adds a correction bias only to "
                                  "grouped_topk's sigmoid scores",
    "LongcatFlashMoE": "zero-computation (identity) experts and selection on softmax "
                       "probabilities plus a correction bias",
    "DeepseekV4SparseMoeBlock": "hash routing (experts chosen by a token-id table) in its first "
                                "layers; qmoe selects experts from the router logits",
}
