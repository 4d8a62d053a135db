"""qmoe.Layer: one prepared MoE layer on the CPU or a CUDA device.

Four ways in:
    Layer(spec, tensors)                       spec + ORT-named weight tensors (docs/layer-file.md)
    Layer.from_ort(attributes, tensors)        ORT QMoE attributes + inputs, as an ORT node has them
    Layer.from_file(path)                      a layer file
    Layer.from_float(fc1, fc2, fc3=None, ...)  fp32 weights, quantized by qmoe's quantizers
Weights are copied at prepare (the CUDA backend uploads and prepacks them), so the caller's
arrays may be dropped afterwards.

run() takes numpy, torch or cupy arrays (DLPack, no copy): on the host for backend "cpu", on the
layer's device for "cuda". It allocates the output and workspace next to the input unless given;
a caller that runs often passes both (see workspace_size) and a stream."""

import numpy as np

from . import _qmoe
from ._arrays import current_stream, empty_like_framework, host_tensor, workspace_like
from .spec import (Backend, FcFormat, OrtSemantics, as_dtype, as_enum, describe, fc_format,
                   make_spec)

# Names of one FC's tensors: quantize_fc's keys -> the ORT / layer-file suffixes.
_FC_KEYS = {"weight": "experts_weights", "scales": "scales", "zero_points": "zero_points",
            "global_scale": "global_scale"}


def _host_tensors(tensors):
    return {name: host_tensor(name, value) for name, value in tensors.items() if value is not None}


def quantize_fc(w, format="int4", block_size=None, zero_points=False):
    """Quantizes fp32 weights [experts, n, k] (y = x W^T): a dict of raw tensors weight, scales,
    zero_points, global_scale (those the format has), each (numpy array, dtype name)."""
    fmt = format if isinstance(format, FcFormat) else fc_format(format, block_size, zero_points)
    arr, _ = host_tensor("w", w)
    return _qmoe.quantize_fc(fmt, np.ascontiguousarray(arr, dtype=np.float32))


def dequantize_fc(tensors, format, experts, n, k):
    """fp32 [experts, n, k] from an FC's raw tensors (quantize_fc's dict or ORT's tensors)."""
    fmt = format if isinstance(format, FcFormat) else fc_format(format)
    return _qmoe.dequantize_fc(fmt, _host_tensors(tensors), experts, n, k)


class Layer:
    """A prepared layer. See the module docstring."""

    def __init__(self, spec, tensors, *, backend="cpu", device=0, num_threads=0,
                 max_dequant_bytes=0, tune_file="", act_quant=""):
        self._backend = as_enum(Backend, backend, "backend")
        self._impl = _qmoe.Layer.prepare(spec, _host_tensors(tensors), self._backend,
                                         num_threads, device, max_dequant_bytes, str(tune_file),
                                         str(act_quant))
        self._ws_cache = {}

    @classmethod
    def _wrap(cls, impl, backend):
        self = cls.__new__(cls)
        self._backend, self._impl, self._ws_cache = backend, impl, {}
        return self

    @classmethod
    def from_file(cls, path, *, backend="cpu", dtype=None, device=0, num_threads=0,
                  max_dequant_bytes=0, tune_file="", act_quant=""):
        """A layer file (docs/layer-file.md). dtype: the activation dtype of calls (default: the
        biases' dtype, else f32)."""
        b = as_enum(Backend, backend, "backend")
        impl = _qmoe.Layer.from_file(str(path), b, as_dtype(dtype), num_threads, device,
                                     max_dequant_bytes, str(tune_file), str(act_quant))
        return cls._wrap(impl, b)

    @classmethod
    def from_ort(cls, attributes, tensors, *, semantics="cuda", dtype=None, **options):
        """ORT QMoE attributes (name -> value) and inputs by ORT name (fc1_experts_weights, ...;
        input and router_probs are optional and only give shapes). dtype overrides the activation
        dtype the import chose."""
        attrs = {k: (repr(float(v)) if isinstance(v, float) else str(v))
                 for k, v in attributes.items()}
        host = _host_tensors(tensors)
        spec = _qmoe.spec_from_ort(attrs, host, as_enum(OrtSemantics, semantics, "semantics"))
        if dtype is not None:
            spec.act_dtype = as_dtype(dtype)
        weights = {k: v for k, v in host.items() if k not in ("input", "router_probs",
                                                                 "router_weights")}
        return cls(spec, weights, **options)

    @classmethod
    def from_float(cls, fc1, fc2, fc3=None, *, top_k, format="int4", block_size=None,
                   zero_points=False, fc2_format=None, routing="softmax_topk", normalize=False,
                   activation="swiglu", glu="concatenated", dtype="f32", biases=None,
                   router_correction_bias=None, backend="cpu", device=0, num_threads=0,
                   max_dequant_bytes=0, tune_file="", act_quant="", num_experts=None,
                   first_expert=0, **routing_fields):
        """Quantizes fp32 expert weights and prepares them.

        fc1 [E, F*I, H] (F = 2 for a fused gated activation, laid out as `glu` says), fc2 [E, H, I],
        fc3 [E, I, H] with glu="separate_fc3". biases: optional {"fc1": [E, N], ...}.
        A shard of local experts: num_experts = the router's columns and first_expert the index of
        the first expert the weights (and biases) hold; the router correction bias stays over all
        experts (docs/semantics.md)."""
        fc1_np, _ = host_tensor("fc1", fc1)
        fc2_np, _ = host_tensor("fc2", fc2)
        e, n1, h = fc1_np.shape
        inter = fc2_np.shape[2]
        biases = biases or {}
        total = e if num_experts is None else int(num_experts)
        local = 0 if (total == e and first_expert == 0) else e
        spec = make_spec(h, inter, total, top_k=top_k, format=format, block_size=block_size,
                         zero_points=zero_points, fc2_format=fc2_format, routing=routing,
                         normalize=normalize, activation=activation,
                         glu=glu, dtype=dtype, fc1_bias="fc1" in biases,
                         fc2_bias="fc2" in biases, fc3_bias="fc3" in biases,
                         first_expert=first_expert, local_experts=local, **routing_fields)
        tensors = {}
        fcs = [("fc1", fc1_np, spec.fc1), ("fc2", fc2_np, spec.fc2)]
        if fc3 is not None:
            fcs.append(("fc3", host_tensor("fc3", fc3)[0], spec.fc3))
        for prefix, w, fmt in fcs:
            for key, value in quantize_fc(w, fmt).items():
                tensors[f"{prefix}_{_FC_KEYS[key]}"] = value
        for prefix, b in biases.items():
            tensors[f"{prefix}_experts_bias"] = b
        if router_correction_bias is not None:
            tensors["router_correction_bias"] = router_correction_bias
        return cls(spec, tensors, backend=backend, device=device, num_threads=num_threads,
                   max_dequant_bytes=max_dequant_bytes, tune_file=tune_file, act_quant=act_quant)

    # ---- introspection ----

    @property
    def spec(self):
        return self._impl.spec

    @property
    def backend(self):
        return self._backend

    @property
    def device(self):
        return self._impl.device

    def workspace_size(self, max_tokens):
        """Exact bytes of workspace a call of up to max_tokens tokens needs."""
        return self._impl.workspace_size(int(max_tokens))

    def info(self, tokens=1):
        """The spec's fields, the backend and the kernel path a call of `tokens` takes."""
        d = describe(self.spec)
        d.update(backend=self._backend.name, device=self.device,
                 dispatch=self._impl.dispatch_choice(int(tokens)),
                 workspace_bytes=self.workspace_size(tokens))
        return d

    def force_dispatch(self, choice):
        """Forces every later call onto one kernel path (a name info()'s dispatch can show, e.g.
        "generic", "decode/1", "generic/64"), or "" for the dispatch table again; raises
        qmoe.Error naming a choice that is not this layer's. Not while calls run on the layer."""
        self._impl.force_dispatch(str(choice))

    def take_deferred_error(self):
        """Raises qmoe.Error for non-finite inputs a CUDA call saw after returning; synchronizes
        with the device. Not thread-safe: call it from one thread at a time."""
        self._impl.take_deferred_error()

    # ---- calls ----

    def run(self, x, router_logits, router_weights=None, *, out=None, workspace=None, stream=None):
        """One call: x [T, H] (or [B, S, H]) and router_logits [T, E] in one framework and place.
        Returns out (allocated like x unless given)."""
        if out is None:
            out = empty_like_framework(x, tuple(x.shape))
        if workspace is None:
            tokens = int(np.prod(x.shape[:-1])) if len(x.shape) > 1 else 0
            workspace = workspace_like(x, self.workspace_size(tokens))
        if stream is None:
            stream = current_stream(x)
        self._impl.run(x, router_logits, out, workspace, router_weights, int(stream))
        return out

    def reference(self, x, router_logits, router_weights=None):
        """qmoe's fp64 oracle on this layer's weights: float64 [T, H] (host arrays)."""
        return self._impl.reference(np.ascontiguousarray(x), np.ascontiguousarray(router_logits),
                                    None if router_weights is None
                                    else np.ascontiguousarray(router_weights))


def save_layer_file(path, spec, tensors):
    """Writes a layer file (docs/layer-file.md) from a spec and ORT-named weight tensors."""
    _qmoe.save_layer_file(str(path), spec, _host_tensors(tensors))
