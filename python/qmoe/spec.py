"""Spec helpers: enums from strings, FC formats and layer specs in one call.

The spec types themselves (LayerSpec, RoutingSpec, ActivationSpec, FcFormat and the enums) are the
C++ structs, bound field by field; this module only adds keyword constructors."""

from . import _qmoe
from ._qmoe import (Activation, Backend, DType, FcFormat, GluLayout, LayerSpec,  # noqa: F401
                    RoutingMethod, SharedWeight, TieBreak, CombineMode, Fp4Layout, OrtSemantics,
                    WeightFormat)


def as_enum(enum, value, what):
    """enum member from a member or its name ("int4", "softmax_topk", "bf16", ...)."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        try:
            return enum[value]
        except KeyError:
            pass
    names = ", ".join(m.name for m in enum)
    raise ValueError(f"{what}: expected one of {names}, got {value!r}")


_TORCH_TO_DTYPE = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}


def as_dtype(value, what="dtype"):
    """DType from a DType, its name, a numpy dtype or a torch dtype."""
    if value is None or isinstance(value, DType):
        return value
    if not isinstance(value, str):
        name = str(value).replace("torch.", "")
        if name not in _TORCH_TO_DTYPE:
            try:  # numpy dtypes and scalar types
                import numpy as np
                name = np.dtype(value).name
            except TypeError:
                pass
        value = _TORCH_TO_DTYPE.get(name, name)
    return as_enum(DType, value, what)


def fc_format(format="int4", block_size=None, zero_points=False, scale_dtype=None,
              fp4_layout=None):
    """An FcFormat: the format's defaults (default_fc_format) with the given fields replaced."""
    f = _qmoe.default_fc_format(as_enum(WeightFormat, format, "format"))
    if block_size is not None:
        f.block_size = int(block_size)
    f.zero_points = bool(zero_points)
    if scale_dtype is not None:
        f.scale_dtype = as_dtype(scale_dtype, "scale_dtype")
    if fp4_layout is not None:
        f.fp4_layout = as_enum(Fp4Layout, fp4_layout, "fp4_layout")
    return f


def make_spec(hidden, inter, num_experts, *, top_k, format="int4", block_size=None,
              zero_points=False, fc2_format=None, routing="softmax_topk", normalize=False,
              num_shared=0, activation="swiglu", glu="concatenated", dtype="f32",
              fc1_bias=False, fc2_bias=False, fc3_bias=False, first_expert=0, local_experts=0,
              **routing_fields):
    """A LayerSpec from keywords. `format` (a name or an FcFormat) applies to every FC unless
    fc2_format says otherwise; first_expert / local_experts make a shard of local experts
    (docs/semantics.md); routing_fields sets further RoutingSpec fields (n_group,
    topk_group, routed_scaling_factor, sparse_mixer_eps, ties, combine, shared_weight) or
    ActivationSpec fields
    (alpha, beta, limit, limit_after_activation)."""
    s = LayerSpec()
    s.hidden, s.inter, s.num_experts = int(hidden), int(inter), int(num_experts)
    s.first_expert, s.local_experts = int(first_expert), int(local_experts)
    fc = format if isinstance(format, FcFormat) else fc_format(format, block_size, zero_points)
    s.fc1 = fc
    s.fc3 = fc
    s.fc2 = fc2_format if isinstance(fc2_format, FcFormat) else (
        fc if fc2_format is None else fc_format(fc2_format, block_size, zero_points))
    a = s.activation
    a.kind = as_enum(Activation, activation, "activation")
    a.glu = as_enum(GluLayout, glu, "glu")
    r = s.routing
    r.method = as_enum(RoutingMethod, routing, "routing")
    r.top_k = int(top_k)
    r.normalize = bool(normalize)
    r.num_shared = int(num_shared)
    for key, value in routing_fields.items():
        if key in ("alpha", "beta", "limit", "limit_after_activation"):
            setattr(a, key, value)
            continue
        if not hasattr(r, key):
            raise TypeError(f"make_spec: unknown keyword {key!r}")
        if key == "ties":
            value = as_enum(TieBreak, value, "ties")
        elif key == "combine":
            value = as_enum(CombineMode, value, "combine")
        elif key == "shared_weight":
            value = as_enum(SharedWeight, value, "shared_weight")
        setattr(r, key, value)
    s.has_fc1_bias, s.has_fc2_bias, s.has_fc3_bias = bool(fc1_bias), bool(fc2_bias), bool(fc3_bias)
    s.act_dtype = as_dtype(dtype)
    s.check()
    return s


def describe(spec):
    """A dict of a spec's fields (enums by name), for info() and printing."""
    r, a = spec.routing, spec.activation
    d = {
        "hidden": spec.hidden, "inter": spec.inter, "num_experts": spec.num_experts,
        "act_dtype": spec.act_dtype.name,
        "activation": a.kind.name, "glu": a.glu.name if a.gated else None,
        "routing": r.method.name, "top_k": r.top_k, "normalize": r.normalize,
        "num_shared": r.num_shared,
        "shared_weight": r.shared_weight.name if r.num_shared else None,
        "fc1": repr(spec.fc1), "fc2": repr(spec.fc2),
        "fc3": repr(spec.fc3) if spec.has_fc3 else None,
    }
    return d
