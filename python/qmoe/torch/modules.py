"""qmoe.torch.QMoE and drop-in replacements for transformers' MoE blocks.

QMoE is an nn.Module around one prepared qmoe.Layer: forward(x, router_logits) calls
torch.ops.qmoe.moe_forward with the layer's handle. It has no parameters or buffers: the weights
live in the prepared layer (on the device it was prepared for), so .to() does not move it and
state_dict() is empty; prepare a new one to move it.

quantize_moe_block() builds a QMoEBlock from a transformers MoE block: the block's router is kept
as it is (a linear layer) and its experts are quantized into one qmoe layer with the model's own
routing and activation; shared experts, where the model has them, join that layer as its shared
experts (or, where their size does not allow it, form a second one). ADAPTERS (blocks.py) lists
the supported blocks and says how each maps."""

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from ..layer import Layer
from ..spec import FcFormat, fc_format
from ._ops import register_layer, unregister_layer
from .blocks import ADAPTERS, REFUSED, fold_shared


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
    """A transformers MoE block with qmoe experts: the original router, then one qmoe call (two
    with shared experts that could not join the routed layer). Returns what the replaced block
    returned (some blocks also return the router logits).

    shared_columns = m: the layer's last m experts are the shared MLP (fold_shared); their m
    router columns are appended to the logits, the shared gate's logit (weight sigmoid) or zeros
    (weight 1, unread). Otherwise `shared` is a second one-expert layer."""

    def __init__(self, router_weight, moe, returns_logits, *, router_bias=None,
                 router_fp32=False, shared=None, shared_gate=None, shared_columns=0):
        super().__init__()

        def frozen(t):
            return None if t is None else nn.Parameter(t.detach().clone(), requires_grad=False)

        self.router_weight = frozen(router_weight)
        self.router_bias = frozen(router_bias)
        self.router_fp32 = router_fp32
        self.moe = moe
        self.shared = shared
        self.shared_gate = frozen(shared_gate)
        self.shared_columns = shared_columns
        self.returns_logits = returns_logits

    def forward(self, hidden_states):
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        if self.router_fp32:  # the model's own router runs in fp32 (qmoe takes f32 logits)
            logits = F.linear(flat.float(), self.router_weight.float())
        else:
            logits = F.linear(flat, self.router_weight, self.router_bias)
        if self.shared_columns:
            if self.shared_gate is None:
                cols = logits.new_zeros(logits.shape[0], self.shared_columns)
            else:
                cols = F.linear(flat, self.shared_gate).to(logits.dtype)
                cols = cols.expand(-1, self.shared_columns)
            out = self.moe(flat, torch.cat([logits, cols], dim=1))
        else:
            out = self.moe(flat, logits)
        if self.shared is not None:
            if self.shared_gate is None:  # weight exp(0) / exp(0) = 1 over the one expert
                shared_logits = flat.new_zeros(flat.shape[0], 1)
            else:  # weight sigmoid(gate logit)
                shared_logits = F.linear(flat, self.shared_gate)
            out = out + self.shared(flat, shared_logits)
        out = out.reshape(shape)
        return (out, logits) if self.returns_logits else out


def _prepare(experts, format, block_size, zero_points, backend, device, dtype, options):
    fc1 = experts.fc1
    dtype = dtype or fc1.dtype
    # Biases are in the activation dtype (a torch dtype here; a qmoe dtype name keeps theirs).
    biases = {k: v.to(dtype) if isinstance(dtype, torch.dtype) else v
              for k, v in experts.biases.items()}
    return QMoE(Layer.from_float(fc1.float(), experts.fc2.float(), format=format,
                                 block_size=block_size, zero_points=zero_points, dtype=dtype,
                                 biases=biases or None, backend=backend, device=device,
                                 **experts.layer_kwargs, **options))


def quantize_moe_block(block, format="int4", block_size=None, zero_points=False, *,
                       backend=None, device=None, dtype=None, **options):
    """A QMoEBlock computing what `block` computes, its experts quantized into `format`.

    backend/device default to where the block's weights are; dtype (the activation dtype of
    calls) defaults to theirs. options go to qmoe.Layer (num_threads, tune_file, ...)."""
    name = type(block).__name__
    if name in REFUSED:
        raise ValueError(f"quantize_moe_block: {name} is not supported: {REFUSED[name]}")
    if name not in ADAPTERS:
        raise ValueError(f"quantize_moe_block: unsupported block {name}; supported: "
                         f"{', '.join(sorted(ADAPTERS))}")
    plan = ADAPTERS[name](block)
    fc1 = plan.routed.fc1
    if backend is None:
        backend = "cuda" if fc1.is_cuda else "cpu"
    if device is None:
        device = (fc1.device.index or 0) if fc1.is_cuda else 0
    args = (format, block_size, zero_points, backend, device, dtype, options)
    fmt = format if isinstance(format, FcFormat) else fc_format(format, block_size, zero_points)
    folded = fold_shared(plan, fmt.block_size)
    if folded is not None:
        routed, m = folded
        return QMoEBlock(plan.router_weight, _prepare(routed, *args), plan.returns_logits,
                         router_bias=plan.router_bias, router_fp32=plan.router_fp32,
                         shared_gate=plan.shared_gate, shared_columns=m)
    shared = None if plan.shared is None else _prepare(plan.shared, *args)
    return QMoEBlock(plan.router_weight, _prepare(plan.routed, *args), plan.returns_logits,
                     router_bias=plan.router_bias, router_fp32=plan.router_fp32, shared=shared,
                     shared_gate=plan.shared_gate)


def replace_moe_blocks(model, format="int4", block_size=None, zero_points=False, **kwargs):
    """Replaces every supported MoE block of `model` in place; returns the replaced names.
    Raises ValueError, changing nothing, if the model has a block qmoe cannot run (REFUSED)."""
    for n, m in model.named_modules():
        if type(m).__name__ in REFUSED:
            raise ValueError(f"replace_moe_blocks: {n} ({type(m).__name__}) is not supported: "
                             f"{REFUSED[type(m).__name__]}")
    targets = [(n, m) for n, m in model.named_modules() if type(m).__name__ in ADAPTERS]
    for name, block in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, quantize_moe_block(block, format, block_size, zero_points,
                                                 **kwargs))
    return [n for n, _ in targets]
