"""Helpers shared by the Python suites, written independently of the C++ code.

- ORT raw layouts: LSB-first bitstream packing, integer quantizers (symmetric and with zero points,
  per channel or block-wise) and their fp64 dequantization.
- An ONNX model with one com.microsoft::QMoE node, and an onnxruntime CPU runner.
- An fp64 numpy reference of the layer with ORT CUDA routing ("cuda") or ORT CPU routing ("cpu").
- safetensors writer/reader and the qmoe layer/input file conventions.
- Locating and running the qmoe CLI.
"""

import json
import math
import os
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

# ORT's QMoE input order; the position of each name is its input index.
ORT_INPUTS = [
    "input", "router_probs",
    "fc1_experts_weights", "fc1_scales", "fc1_experts_bias",
    "fc2_experts_weights", "fc2_scales", "fc2_experts_bias",
    "fc3_experts_weights", "fc3_scales", "fc3_experts_bias",
    "fc1_zero_points", "fc2_zero_points", "fc3_zero_points",
    "router_weights", "fc1_global_scale", "fc2_global_scale",
    "fc1_act_scale", "fc2_act_scale", "fc1_act_block_scale", "fc2_act_block_scale",
]

# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------

ST_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"), "I64": np.dtype("<i8"), "U64": np.dtype("<u8"),
    "F8_E4M3": np.dtype("u1"), "F8_E8M0": np.dtype("u1"),
}
_NP_TO_ST = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
             np.dtype(np.float16): "F16", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
             np.dtype(np.int16): "I16", np.dtype(np.uint16): "U16", np.dtype(np.int32): "I32",
             np.dtype(np.uint32): "U32", np.dtype(np.int64): "I64", np.dtype(np.uint64): "U64"}


@dataclass
class Tagged:
    """A tensor of a dtype numpy cannot name (BF16, F8_*); `bits` holds the raw codes."""
    dtype: str
    bits: np.ndarray


def bf16(x) -> Tagged:
    """Rounds float32 values to bfloat16 (nearest even) and tags them BF16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return Tagged("BF16", rounded.astype(np.uint16))


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


BF16 = "bf16"  # activation dtype token for bfloat16 (numpy has none)


def cast_act(values, dtype):
    """Rounds values to an activation/scale dtype (np.float32, np.float16 or BF16). Returns the
    value to store (array or Tagged) and its exact float64 value."""
    if isinstance(dtype, str) and dtype == BF16:
        t = bf16(values)
        return t, bf16_to_f32(t.bits).astype(np.float64)
    a = np.asarray(values).astype(dtype)
    return a, a.astype(np.float64)


def as_f64(value) -> np.ndarray:
    if isinstance(value, Tagged):
        assert value.dtype == "BF16"
        return bf16_to_f32(value.bits).astype(np.float64)
    return np.asarray(value, np.float64)


def _st_entry(value):
    if isinstance(value, Tagged):
        return value.dtype, np.ascontiguousarray(value.bits)
    arr = np.ascontiguousarray(value)
    return _NP_TO_ST[arr.dtype], arr


def encode_header(header: dict) -> bytes:
    """8-byte little-endian length, then the JSON header padded with spaces to a multiple of 8."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


def safetensors_bytes(tensors: Dict[str, object],
                      metadata: Optional[Dict[str, str]] = None) -> bytes:
    header, chunks, offset = {}, [], 0
    for name, value in tensors.items():
        dtype, arr = _st_entry(value)
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    return encode_header(header) + b"".join(chunks)


def write_safetensors(path, tensors, metadata=None):
    Path(path).write_bytes(safetensors_bytes(tensors, metadata))


def read_safetensors(path):
    """Returns ({name: array}, metadata). BF16 comes back as float32, F8_* as raw uint8 codes."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    metadata = header.pop("__metadata__", {})
    base, out = 8 + n, {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(blob[base + begin:base + end], dtype=ST_DTYPES[info["dtype"]])
        arr = arr.reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = bf16_to_f32(arr)
        out[name] = arr.copy()
    return out, metadata


# ---------------------------------------------------------------------------------------------
# Integer formats in ORT's raw layout
# ---------------------------------------------------------------------------------------------

def packed_bytes(count: int, bits: int) -> int:
    return (count * bits + 7) // 8


def pack_codes(q: np.ndarray, bits: int) -> np.ndarray:
    """Packs codes along the last axis into an LSB-first bitstream: code i occupies bits
    [i*bits, (i+1)*bits) of the row, bit 0 being the LSB of byte 0; the row is padded to a byte."""
    q = np.asarray(q, dtype=np.uint8)
    count = q.shape[-1]
    planes = (q[..., None] >> np.arange(bits, dtype=np.uint8)) & 1  # [..., count, bits]
    stream = planes.reshape(q.shape[:-1] + (count * bits,))
    pad = packed_bytes(count, bits) * 8 - count * bits
    if pad:
        stream = np.concatenate([stream, np.zeros(q.shape[:-1] + (pad,), np.uint8)], axis=-1)
    return np.packbits(stream, axis=-1, bitorder="little")


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    stream = np.unpackbits(np.asarray(packed, np.uint8), axis=-1, bitorder="little")
    planes = stream[..., :count * bits].reshape(packed.shape[:-1] + (count, bits))
    return (planes.astype(np.uint16) << np.arange(bits, dtype=np.uint16)).sum(-1).astype(np.uint8)


@dataclass
class QuantFc:
    """One FC of all experts in ORT's raw integer layout, plus its exact fp64 dequantization."""
    bits: int
    block_size: int  # 0: one scale per output channel
    weight: np.ndarray               # u8 [E, N, ceil(K*bits/8)]
    scales: object                   # [E, N] or [E, N, K/bs], scale dtype (array or Tagged)
    zero_points: Optional[np.ndarray]  # u8 packed, or None (symmetric)
    deq: np.ndarray                  # f64 [E, N, K]
    bias: object = None              # [E, N], act dtype (array or Tagged)
    global_scale: Optional[np.ndarray] = None  # f32 [E] (FP4 formats)

    @property
    def shape(self):
        return self.deq.shape


def quantize_int(w: np.ndarray, bits: int, block_size: int = 0, zero_points: bool = False,
                 scale_dtype=np.float32) -> QuantFc:
    """Quantizes w [E, N, K] to `bits`-bit codes. Symmetric: zp = 2^(bits-1), scale = amax / zp;
    with zero points: scale = (max - min) / (2^bits - 1), zp = round(-min / scale)."""
    e, n, k = w.shape
    bs = k if block_size <= 0 else block_size
    assert k % bs == 0, "block size must divide K"
    nb = k // bs
    blocks = np.asarray(w, np.float64).reshape(e, n, nb, bs)
    qmax = (1 << bits) - 1
    if zero_points:
        lo = np.minimum(blocks.min(-1), 0.0)
        hi = np.maximum(blocks.max(-1), 0.0)
        scale, s_exact = cast_act((hi - lo) / qmax, scale_dtype)
        s64 = np.where(s_exact == 0, 1.0, s_exact)
        zp = np.clip(np.round(-lo / s64), 0, qmax).astype(np.uint8)
    else:
        amax = np.abs(blocks).max(-1)
        scale, s_exact = cast_act(amax / (1 << (bits - 1)), scale_dtype)
        s64 = np.where(s_exact == 0, 1.0, s_exact)
        zp = np.full((e, n, nb), 1 << (bits - 1), np.uint8)
    q = np.clip(np.round(blocks / s64[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    deq = (q.astype(np.float64) - zp[..., None]) * s_exact[..., None]
    q = q.reshape(e, n, k)
    if block_size <= 0:
        scales = _reshape(scale, (e, n))
        zpp = pack_codes(zp.reshape(e, n), bits) if zero_points else None
    else:
        scales = scale
        zpp = pack_codes(zp, bits) if zero_points else None
    return QuantFc(bits, max(block_size, 0), pack_codes(q, bits), scales, zpp, deq.reshape(e, n, k))


def _reshape(value, shape):
    if isinstance(value, Tagged):
        return Tagged(value.dtype, value.bits.reshape(shape))
    return value.reshape(shape)


def dequantize_int(weight, scales, zero_points, bits: int, block_size: int, k: int) -> np.ndarray:
    """fp64 dequantization of ORT raw tensors (independent of quantize_int's bookkeeping)."""
    q = unpack_codes(weight, bits, k).astype(np.float64)
    e, n = q.shape[:2]
    s = as_f64(scales)
    if block_size <= 0:
        s = s.reshape(e, n, 1)
        zp = (unpack_codes(zero_points, bits, n).reshape(e, n, 1) if zero_points is not None
              else np.full((e, n, 1), 1 << (bits - 1)))
        bs = k
    else:
        nb = k // block_size
        zp = (unpack_codes(zero_points, bits, nb) if zero_points is not None
              else np.full((e, n, nb), 1 << (bits - 1)))
        bs = block_size
    s = np.repeat(s, bs, axis=-1)
    zp = np.repeat(np.asarray(zp, np.float64), bs, axis=-1)
    return (q - zp) * s


# ---------------------------------------------------------------------------------------------
# FP4 (E2M1 codes with e8m0 or e4m3 block scales and an fp32 global scale per expert)
# ---------------------------------------------------------------------------------------------

E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


def _e4m3_table() -> np.ndarray:
    """float8e4m3fn value of every code (bias 7, no infinities, 0x7F/0xFF NaN)."""
    out = np.empty(256)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        mag = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        out[c] = np.nan if (c & 0x7F) == 0x7F else (-mag if c & 0x80 else mag)
    return out


E4M3_VALUES = _e4m3_table()


def _nearest_code(values, table):
    """Index of the nearest table entry (table: non-negative, ascending); ties to the even index."""
    v = np.asarray(values, np.float64)[..., None]
    d = np.abs(v - table)
    best = d.min(-1, keepdims=True)
    cand = d == best
    even = cand & (np.arange(table.size) % 2 == 0)
    return np.where(even.any(-1), even.argmax(-1), cand.argmax(-1))


def e2m1_encode(v) -> np.ndarray:
    v = np.asarray(v, np.float64)
    code = _nearest_code(np.minimum(np.abs(v), 6.0), E2M1_VALUES)
    return (code | ((v < 0) & (code != 0)) << 3).astype(np.uint8)


def e2m1_decode(c) -> np.ndarray:
    c = np.asarray(c, np.uint8)
    return np.where(c & 8, -1.0, 1.0) * E2M1_VALUES[c & 7]


def quantize_fp4(w: np.ndarray, kind: str, pow2_global: bool = True) -> QuantFc:
    """MXFP4 ("mxfp4": e8m0 scale per 32, global scale g) or NVFP4 ("nvfp4": e4m3 scale per 16,
    g = amax / (6 * 448)) in the K-packed layout [E, N, K/2] (low nibble = even k), which ORT
    reads with weights_prepacked = 1. pow2_global rounds g to a power of two."""
    e, n, k = w.shape
    bs = 32 if kind == "mxfp4" else 16
    blocks = np.asarray(w, np.float64).reshape(e, n, k // bs, bs)
    amax = np.abs(blocks).max(-1)
    g = np.abs(w).reshape(e, -1).max(-1) / (6 * 448 if kind == "nvfp4" else 6)
    if pow2_global:
        g = 2.0 ** np.round(np.log2(g))
    g = g.astype(np.float32)
    g64 = g.astype(np.float64)[:, None, None]
    if kind == "mxfp4":
        x = np.round(np.log2(np.maximum(amax / 6 / g64, 2.0 ** -126)))
        codes = np.clip(x + 127, 0, 254).astype(np.uint8)
        scale_tensor = Tagged("F8_E8M0", codes)
        block_scale = 2.0 ** (codes.astype(np.float64) - 127)
    else:
        codes = _nearest_code(np.minimum(amax / 6 / g64, 448.0), E4M3_VALUES[:127]).astype(np.uint8)
        scale_tensor = Tagged("F8_E4M3", codes)
        block_scale = E4M3_VALUES[codes]
    s = block_scale * g64
    q = e2m1_encode(blocks / np.where(s == 0, 1, s)[..., None])
    deq = (e2m1_decode(q) * s[..., None]).reshape(e, n, k)
    return QuantFc(4, bs, pack_codes(q.reshape(e, n, k), 4), scale_tensor, None, deq,
                   global_scale=g)


# ---------------------------------------------------------------------------------------------
# Layer description shared by the ONNX builder, the reference and the layer file
# ---------------------------------------------------------------------------------------------

@dataclass
class Layer:
    attrs: Dict[str, object]  # ORT attribute name -> value
    fc1: QuantFc
    fc2: QuantFc
    fc3: Optional[QuantFc] = None
    extra: Dict[str, np.ndarray] = field(default_factory=dict)  # any other initializer

    @property
    def num_experts(self):
        return self.fc1.deq.shape[0]

    @property
    def hidden(self):
        return self.fc2.deq.shape[1]

    @property
    def inter(self):
        return self.fc2.deq.shape[2]

    def weight_tensors(self) -> Dict[str, np.ndarray]:
        out = {}
        for i, fc in ((1, self.fc1), (2, self.fc2), (3, self.fc3)):
            if fc is None:
                continue
            out[f"fc{i}_experts_weights"] = fc.weight
            out[f"fc{i}_scales"] = fc.scales
            if fc.bias is not None:
                out[f"fc{i}_experts_bias"] = fc.bias
            if fc.zero_points is not None:
                out[f"fc{i}_zero_points"] = fc.zero_points
            if fc.global_scale is not None:
                out[f"fc{i}_global_scale"] = fc.global_scale
        out.update(self.extra)
        return out


def make_layer(rng: np.random.Generator, hidden: int, inter: int, experts: int, *, bits: int = 4,
               block_size: int = 0, zero_points: bool = False, activation: str = "swiglu",
               swiglu_fusion: int = 1, bias: bool = True, act_dtype=np.float32,
               scale_dtype=None, fc2_bits: Optional[int] = None, quant: str = "int",
               pow2_global: bool = True, **attrs) -> Layer:
    """Random weights, quantized; `attrs` become ORT attributes (k, normalize_routing_weights, ...).
    quant: "int" (bits, block_size, zero_points), "mxfp4" or "nvfp4" (K-packed, see
    quantize_fp4)."""
    scale_dtype = scale_dtype or act_dtype
    gated = activation == "swiglu"
    f = 2 if gated and swiglu_fusion in (1, 2) else 1
    fc2_bits = fc2_bits or bits

    def fc(n, k, b):
        w = rng.standard_normal((experts, n, k)) / math.sqrt(k)
        if quant == "int":
            q = quantize_int(w, b, block_size, zero_points, scale_dtype)
        else:
            q = quantize_fp4(w, quant, pow2_global)
        if bias:
            q.bias = cast_act(0.1 * rng.standard_normal((experts, n)), act_dtype)[0]
        return q

    fc1 = fc(f * inter, hidden, bits)
    fc2 = fc(hidden, inter, fc2_bits)
    fc3 = fc(inter, hidden, bits) if gated and swiglu_fusion == 0 else None
    a = {"activation_type": activation, "expert_weight_bits": bits}
    if quant != "int":
        a.update(quant_type={"mxfp4": "fp4", "nvfp4": "nvfp4"}[quant], weights_prepacked=1,
                 block_size=fc1.block_size)
    elif block_size > 0:
        a["block_size"] = block_size
    if gated:
        a["swiglu_fusion"] = swiglu_fusion
    if fc2_bits != bits:
        a["fc2_expert_weight_bits"] = fc2_bits
    a.update(attrs)
    return Layer(a, fc1, fc2, fc3)


# ---------------------------------------------------------------------------------------------
# ONNX model and onnxruntime CPU runner
# ---------------------------------------------------------------------------------------------

def _onnx_dtype(np_dtype):
    from onnx import TensorProto
    return {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
            np.dtype(np.uint8): TensorProto.UINT8}[np.dtype(np_dtype)]


def _initializer(name, value):
    from onnx import TensorProto, helper, numpy_helper
    if isinstance(value, Tagged):
        t = {"BF16": TensorProto.BFLOAT16, "F8_E4M3": TensorProto.FLOAT8E4M3FN,
             "F8_E8M0": TensorProto.FLOAT8E8M0}[value.dtype]
        return helper.make_tensor(name, t, value.bits.shape, value.bits.tobytes(), raw=True)
    return numpy_helper.from_array(np.ascontiguousarray(value), name)


def build_model(layer: Layer, act_dtype=np.float32, router_weights: bool = False) -> bytes:
    """A model with one QMoE node. Graph inputs: input [tokens, H], router_probs [tokens, E] and
    optionally router_weights; weights are initializers; skipped optional positions are "".
    For BF16 (which numpy cannot feed) the graph takes float32 and casts around the node."""
    from onnx import TensorProto, helper
    weights = layer.weight_tensors()
    calls = ["input", "router_probs"] + (["router_weights"] if router_weights else [])
    present = set(weights) | set(calls)
    last = max(i for i, name in enumerate(ORT_INPUTS) if name in present)
    is_bf16 = isinstance(act_dtype, str) and act_dtype == BF16
    inner = (lambda n: n + "_bf16") if is_bf16 else (lambda n: n)
    node_inputs = [(inner(n) if n in calls else n) if n in present else ""
                   for n in ORT_INPUTS[:last + 1]]
    nodes = [helper.make_node("QMoE", node_inputs, [inner("output")], domain="com.microsoft",
                              **layer.attrs)]
    if is_bf16:
        nodes = ([helper.make_node("Cast", [n], [inner(n)], to=TensorProto.BFLOAT16) for n in calls]
                 + nodes + [helper.make_node("Cast", [inner("output")], ["output"],
                                             to=TensorProto.FLOAT)])
    t = TensorProto.FLOAT if is_bf16 else _onnx_dtype(act_dtype)
    h, e = layer.hidden, layer.num_experts
    graph_inputs = [helper.make_tensor_value_info("input", t, ["tokens", h]),
                    helper.make_tensor_value_info("router_probs", t, ["tokens", e])]
    if router_weights:
        graph_inputs.append(helper.make_tensor_value_info("router_weights", t, ["tokens", e]))
    graph = helper.make_graph(nodes, "qmoe", graph_inputs,
                              [helper.make_tensor_value_info("output", t, ["tokens", h])],
                              initializer=[_initializer(n, v) for n, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


# ORT's CPU kernel reads this when a session is created. Block-wise 8-bit (and, at accuracy_level 4,
# 4-bit) experts otherwise run MLAS QNBit GEMM with int8-quantized activations, which is ~1e-2 off
# the exact result; "fp32" keeps fp32 activations so the comparison can be tight.
QNBIT_ENV = "ORT_QMOE_CPU_QNBIT_GEMM"


def run_ort(model: bytes, feeds: Dict[str, np.ndarray], threads: int = 1,
            qnbit: Optional[str] = "fp32") -> np.ndarray:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    ort.set_default_logger_severity(4)
    saved = os.environ.pop(QNBIT_ENV, None)
    try:
        if qnbit is not None:
            os.environ[QNBIT_ENV] = qnbit
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    finally:
        os.environ.pop(QNBIT_ENV, None)
        if saved is not None:
            os.environ[QNBIT_ENV] = saved
    return sess.run(["output"], feeds)[0]


def ort_forward(layer: Layer, x, logits, router_weights=None, act_dtype=None, **kw):
    """Runs the layer on onnxruntime's CPU provider. For BF16, pass act_dtype=BF16 and
    bf16-representable float32 arrays; the output comes back as float32."""
    act_dtype = act_dtype if act_dtype is not None else np.asarray(x).dtype
    cast = (lambda v: np.asarray(v, np.float32)) if isinstance(act_dtype, str) else (lambda v: v)
    feeds = {"input": cast(x), "router_probs": cast(logits)}
    if router_weights is not None:
        feeds["router_weights"] = cast(router_weights)
    model = build_model(layer, act_dtype, router_weights is not None)
    return run_ort(model, feeds, **kw)


# ---------------------------------------------------------------------------------------------
# fp64 reference
# ---------------------------------------------------------------------------------------------

def _softmax(v):
    v = np.asarray(v, np.float64)
    ex = np.exp(v - v.max(axis=-1, keepdims=True))
    return ex / ex.sum(axis=-1, keepdims=True)


def route(logits, k: int, normalize: bool, semantics: str = "cuda", router_weights=None,
          sparse_mixer: bool = False):
    """Returns (ids [T, k], weights [T, k] fp64) in selection order.
    cuda: softmax over all experts, top-k (ties to the lower index), optional renormalization.
    cpu:  top-k of logits (ties to the higher index), softmax over the k (always normalized)."""
    logits = np.asarray(logits, np.float64)
    t, e = logits.shape
    assert 0 < k <= e
    if sparse_mixer:
        return _sparse_mixer(logits)
    idx = np.arange(e)
    ids = np.empty((t, k), np.int64)
    w = np.empty((t, k), np.float64)
    for r in range(t):
        if semantics == "cuda":
            order = np.lexsort((idx, -_softmax(logits[r])))
        else:
            order = np.lexsort((-idx, -logits[r]))
        sel = order[:k]
        ids[r] = sel
        if router_weights is not None:
            # Both ORT kernels gather the mixing weights and renormalize only when asked.
            w[r] = np.asarray(router_weights[r], np.float64)[sel]
            if normalize:
                s = w[r].sum()
                if s > 1e-6:
                    w[r] /= s
        elif semantics == "cuda":
            w[r] = _softmax(logits[r])[sel]
            s = w[r].sum()
            if normalize and s > 1e-6:
                w[r] /= s
        else:
            w[r] = _softmax(logits[r][sel])
    return ids, w


def _sparse_mixer(logits, eps: float = 0.01):
    t, e = logits.shape
    ids = np.empty((t, 2), np.int64)
    w = np.empty((t, 2), np.float64)
    for r in range(t):
        scores = logits[r].copy()
        for j in range(2):
            m = scores.max()
            sel = int(np.argmax(scores))
            factor = np.maximum(np.abs(logits[r]), m)
            keep = (m - scores) / factor <= 2 * eps
            masked = np.where(keep, scores, -np.inf)
            ids[r, j] = sel
            w[r, j] = _softmax(masked)[sel]
            scores[sel] = -np.inf
    return ids, w


def activate(h, activation: str, inter: int, fusion: int = 1, lin=None, alpha=1.0, beta=0.0,
             limit=math.inf, limit_after=False):
    if activation == "swiglu":
        if lin is None:
            if fusion == 1:
                gate, lin = h[:, 0::2], h[:, 1::2]
            else:
                gate, lin = h[:, :inter], h[:, inter:]
        else:
            gate = h
        lin = np.clip(lin, -limit, limit)
        if limit_after:
            glu = np.minimum(gate / (1 + np.exp(-alpha * gate)), limit)
        else:
            gate = np.minimum(gate, limit)
            glu = gate / (1 + np.exp(-alpha * gate))
        return glu * (lin + beta)
    if activation == "silu":
        return h / (1 + np.exp(-h))
    if activation == "relu":
        return np.maximum(h, 0)
    if activation == "gelu":
        return 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))
    if activation == "identity":
        return h
    raise ValueError(activation)


def reference_forward(layer: Layer, x, logits, semantics: str = "cuda", router_weights=None):
    """fp64 output [T, H] of the layer on x [T, H]."""
    a = layer.attrs
    x = np.asarray(x, np.float64)
    ids, w = route(logits, int(a.get("k", 1)), bool(a.get("normalize_routing_weights", 0)),
                   semantics, router_weights, bool(a.get("use_sparse_mixer", 0)))
    act = a.get("activation_type", "relu")
    limit = float(a.get("swiglu_limit", math.inf))

    def lin(fc, e, v):
        y = v @ fc.deq[e].T
        if fc.bias is not None:
            y = y + as_f64(fc.bias)[e]
        return y

    out = np.zeros((x.shape[0], layer.hidden))
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            h = lin(layer.fc1, e, x[t:t + 1])
            l3 = lin(layer.fc3, e, x[t:t + 1]) if layer.fc3 is not None else None
            g = activate(h, act, layer.inter, int(a.get("swiglu_fusion", 0)), l3,
                         float(a.get("activation_alpha", 1.0)),
                         float(a.get("activation_beta", 0.0)), limit,
                         bool(a.get("swiglu_limit_after_activation", 0)))
            out[t] += w[t, j] * lin(layer.fc2, e, g)[0]
    return out


def rel_norm(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if np.isnan(a).any() or np.isnan(b).any():
        return math.inf
    den = np.linalg.norm(b)
    num = np.linalg.norm(a - b)
    return 0.0 if num == 0 else (math.inf if den == 0 else float(num / den))


# ---------------------------------------------------------------------------------------------
# qmoe layer and input files, CLI
# ---------------------------------------------------------------------------------------------

def attr_string(value) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


def layer_metadata(layer: Layer, semantics: str = "cpu", **extra) -> Dict[str, str]:
    md = {name: attr_string(v) for name, v in layer.attrs.items()}
    md["qmoe.format_version"] = "1"
    md["qmoe.ort_semantics"] = semantics
    md.update({k: str(v) for k, v in extra.items()})
    return md


def write_layer_file(path, layer: Layer, semantics: str = "cpu", **extra):
    write_safetensors(path, layer.weight_tensors(), layer_metadata(layer, semantics, **extra))


def write_input_file(path, x, logits, router_weights=None):
    t = {"input": x, "router_probs": logits}
    if router_weights is not None:
        t["router_weights"] = router_weights
    write_safetensors(path, t)


# The repository's default build directory.
DEFAULT_CLI = str(Path(__file__).resolve().parents[2] / "build" / "tools" / "qmoe")
BUILD_HINT = ("build it with: cmake -S <repo> -B build -G Ninja && ninja -C build qmoe_cli, "
              "then set QMOE_CLI=build/tools/qmoe or pass --qmoe-cli")


def find_cli(option: Optional[str] = None) -> Optional[str]:
    """The CLI to test: --qmoe-cli, else $QMOE_CLI, else the default build. A path given
    explicitly must exist; there is no falling back past it."""
    cand = option or os.environ.get("QMOE_CLI") or DEFAULT_CLI
    return cand if os.path.isfile(cand) and os.access(cand, os.X_OK) else None


def run_cli(cli: str, args: List[str], timeout: float = 120, cwd=None,
            env=None) -> subprocess.CompletedProcess:
    return subprocess.run([cli] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def qmoe_forward(cli: str, workdir: Path, layer: Layer, x, logits, semantics: str = "cpu",
                 router_weights=None, tag: str = "case") -> np.ndarray:
    """Writes the layer and inputs, runs `qmoe run --no-check`, returns `output` as float64."""
    lp, ip, op = workdir / f"{tag}.layer.safetensors", workdir / f"{tag}.in.safetensors", \
        workdir / f"{tag}.out.safetensors"
    write_layer_file(lp, layer, semantics)
    write_input_file(ip, x, logits, router_weights)
    r = run_cli(cli, ["run", "--layer", lp, "--input", ip, "--output", op, "--no-check"])
    assert r.returncode == 0, f"qmoe run failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    tensors, _ = read_safetensors(op)
    assert "output" in tensors, f"{op} has no 'output' tensor: {sorted(tensors)}"
    return tensors["output"].astype(np.float64)


def import_qmoe():
    """The qmoe package under test (PYTHONPATH=build/python): the calling suite is skipped where
    it is not built, and fails under QMOE_REQUIRE_PYTHON=1 (as the CMake registration sets)."""
    import pytest
    if os.environ.get("QMOE_REQUIRE_PYTHON"):
        import qmoe
        return qmoe
    return pytest.importorskip("qmoe",
                               reason="qmoe Python module not built (PYTHONPATH=build/python)")
