"""qmoe.torch.QMoE and drop-in replacements for transformers' MoE blocks.

QMoE is an nn.Module around one prepared qmoe.Layer: forward(x, router_logits) calls
torch.ops.qmoe.moe_forward with the layer's handle. It has no parameters or buffers: the weights
live in the prepared layer (on the device it was prepared for), so .to() does not move it and
state_dict() is empty; prepare a new one to move it.

quantize_moe_block() builds a QMoEBlock from a transformers MoE block: the block's router is kept
as it is (a linear layer) and its experts are quantized into one qmoe layer with the model's own
routing method. Supported blocks (ADAPTERS) take two weight layouts: transformers 5's fused
experts (gate_up_proj [E, 2I, H], down_proj [E, H, I]) and transformers 4's ModuleList of MLPs."""

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from ..layer import Layer
from ._ops import register_layer, unregister_layer


class QMoE(nn.Module):
    """One prepared qmoe layer as a module: forward(x, router_logits, router_weights=None)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.handle = register_layer(layer)
        weakref.finalize(self, unregister_layer, self.handle)

    @classmethod
    def from_float(cls, fc1, fc2, fc3=None, **kwargs):
        """Quantizes and prepares fp32 expert weights (see qmoe.Layer.from_float)."""
        return cls(Layer.from_float(fc1, fc2, fc3, **kwargs))

    def forward(self, x, router_logits, router_weights=None):
        return torch.ops.qmoe.moe_forward(x, router_logits, self.handle, router_weights)

    def extra_repr(self):
        s = self.layer.spec
        return (f"hidden={s.hidden}, inter={s.inter}, experts={s.num_experts}, "
                f"top_k={s.routing.top_k}, fc1={s.fc1!r}, backend={self.layer.backend.name}, "
                f"handle={self.handle}")


class QMoEBlock(nn.Module):
    """A transformers MoE block with qmoe experts: the original router, then one qmoe call.
    Returns what the replaced block returned (transformers 4 blocks also return the logits)."""

    def __init__(self, router_weight, moe, returns_logits):
        super().__init__()
        self.router_weight = nn.Parameter(router_weight.detach().clone(), requires_grad=False)
        self.moe = moe
        self.returns_logits = returns_logits

    def forward(self, hidden_states):
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        logits = F.linear(flat, self.router_weight)
        out = self.moe(flat, logits).reshape(shape)
        return (out, logits) if self.returns_logits else out


def _is_silu(act):
    return "silu" in type(act).__name__.lower()


def _swiglu_experts(block, gate_name, up_name, down_name):
    """(fc1 [E, 2I, H] gate rows then up rows, fc2 [E, H, I], returns_logits) of a block."""
    experts = block.experts
    if hasattr(experts, "gate_up_proj"):  # transformers 5: fused 3-D parameters
        if not _is_silu(experts.act_fn):
            raise ValueError(f"{type(block).__name__}: expected a SiLU expert activation, got "
                             f"{type(experts.act_fn).__name__}")
        return experts.gate_up_proj.detach(), experts.down_proj.detach(), False
    mlps = list(experts)  # transformers 4: a ModuleList of MLPs
    if not all(_is_silu(m.act_fn) for m in mlps):
        raise ValueError(f"{type(block).__name__}: expected SiLU expert activations")
    fc1 = torch.stack([torch.cat([getattr(m, gate_name).weight, getattr(m, up_name).weight])
                       for m in mlps]).detach()
    fc2 = torch.stack([getattr(m, down_name).weight for m in mlps]).detach()
    return fc1, fc2, True


def _norm_topk(block):
    for owner in (block.gate, block):
        if hasattr(owner, "norm_topk_prob"):
            return bool(owner.norm_topk_prob)
    raise ValueError(f"{type(block).__name__}: no norm_topk_prob attribute found")


# Block class name -> (expert weight names in transformers 4, routing normalization of the model).
# All three route as softmax over every expert (fp32), top-k, then optionally renormalize.
ADAPTERS = {
    "Qwen3MoeSparseMoeBlock": (("gate_proj", "up_proj", "down_proj"), _norm_topk),
    "OlmoeSparseMoeBlock": (("gate_proj", "up_proj", "down_proj"), _norm_topk),
    "MixtralSparseMoeBlock": (("w1", "w3", "w2"), lambda block: True),
}


def quantize_moe_block(block, format="int4", block_size=None, zero_points=False, *,
                       backend=None, device=None, dtype=None, **options):
    """A QMoEBlock computing what `block` computes, its experts quantized into `format`.

    backend/device default to where the block's weights are; dtype (the activation dtype of
    calls) defaults to theirs. options go to qmoe.Layer (num_threads, tune_file, ...)."""
    name = type(block).__name__
    if name not in ADAPTERS:
        raise ValueError(f"quantize_moe_block: unsupported block {name}; supported: "
                         f"{', '.join(sorted(ADAPTERS))}")
    names, normalize = ADAPTERS[name]
    fc1, fc2, returns_logits = _swiglu_experts(block, *names)
    router = block.gate.weight
    top_k = getattr(block.gate, "top_k", None) or getattr(block, "top_k")
    if backend is None:
        backend = "cuda" if fc1.is_cuda else "cpu"
    if device is None:
        device = (fc1.device.index or 0) if fc1.is_cuda else 0
    layer = Layer.from_float(fc1.float(), fc2.float(), top_k=int(top_k), format=format,
                             block_size=block_size, zero_points=zero_points,
                             routing="softmax_topk", normalize=normalize(block),
                             activation="swiglu", glu="concatenated",
                             dtype=dtype or fc1.dtype, backend=backend, device=device, **options)
    return QMoEBlock(router, QMoE(layer), returns_logits)


def replace_moe_blocks(model, format="int4", block_size=None, zero_points=False, **kwargs):
    """Replaces every supported MoE block of `model` in place; returns the replaced names."""
    targets = [(n, m) for n, m in model.named_modules() if type(m).__name__ in ADAPTERS]
    for name, block in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, quantize_moe_block(block, format, block_size, zero_points,
                                                 **kwargs))
    return [n for n, _ in targets]
