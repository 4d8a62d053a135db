"""ONNX interop: com.microsoft::QMoE nodes to qmoe layer files / model packs, and back.

    qmoe.onnx.extract("model.onnx", "model.pack.safetensors")          every QMoE node, one pack
    qmoe.onnx.extract("model.onnx", "layers/", layer_files=True)       one layer file per node
    qmoe.onnx.export("model.pack.safetensors", "model.onnx")            a pack (or a layer file)
    python -m qmoe.onnx extract MODEL -o OUT [--layer-files] [--semantics cpu|cuda]
    python -m qmoe.onnx export PACK_OR_LAYER -o MODEL

A QMoE node's weight inputs (ORT names, ORT raw layouts) are exactly a layer file's tensors and
its attributes exactly the layer file's ORT keys (docs/layer-file.md), so both directions copy
bytes; the tensors round-trip bit for bit. Every node is validated by qmoe's own ORT import
(spec_from_ort) before anything is written, and files are written to a temporary name and renamed.

A pack also needs each layer's router weight (and bias). In the graph qmoe looks for it where
exporters put it and where export() puts it (details in _router):

    input [T, H] --MatMul(B = W^T, [H, E])--(Add bias [E])--> router_probs [T, E] --> QMoE
    input [T, H] --Gemm(B = W [E, H] transB=1 | W^T [H, E] transB=0; C = bias)--> router_probs

Needs the `onnx` package (onnxruntime only to run the result)."""

import math
import re
import sys
from pathlib import Path

import numpy as np

from . import _qmoe, _safetensors

# ORT's QMoE inputs; the position of each name is its input index.
ORT_INPUTS = (
    "input", "router_probs",
    "fc1_experts_weights", "fc1_scales", "fc1_experts_bias",
    "fc2_experts_weights", "fc2_scales", "fc2_experts_bias",
    "fc3_experts_weights", "fc3_scales", "fc3_experts_bias",
    "fc1_zero_points", "fc2_zero_points", "fc3_zero_points",
    "router_weights", "fc1_global_scale", "fc2_global_scale",
    "fc1_act_scale", "fc2_act_scale", "fc1_act_block_scale", "fc2_act_block_scale",
)
_CALL_INPUTS = ("input", "router_probs", "router_weights")
# Inputs of the contract that qmoe does not implement (activation quantization).
_UNSUPPORTED_INPUTS = ("fc1_act_scale", "fc2_act_scale", "fc1_act_block_scale",
                       "fc2_act_block_scale")

# ORT attribute -> (kind, ORT default or None when it is always written).
_ATTRS = {
    "k": ("int", None), "activation_type": ("str", None), "expert_weight_bits": ("int", None),
    "block_size": ("int", None), "normalize_routing_weights": ("int", 0),
    "use_sparse_mixer": ("int", 0), "swiglu_fusion": ("int", 0),
    "swiglu_limit": ("float", math.inf),
    "swiglu_limit_after_activation": ("int", 0), "activation_alpha": ("float", 1.0),
    "activation_beta": ("float", 0.0), "fc1_expert_weight_bits": ("int", -1),
    "fc2_expert_weight_bits": ("int", -1), "fc3_expert_weight_bits": ("int", -1),
    "quant_type": ("str", "int"), "weights_prepacked": ("int", None),
    "accuracy_level": ("int", 0), "num_shared_experts": ("int", 0),
}

# ONNX TensorProto element type -> qmoe dtype name (storage types in _safetensors.DTYPES).
_ONNX_TO_QMOE = {1: "f32", 2: "u8", 3: "i8", 6: "i32", 10: "f16", 11: "f64", 16: "bf16",
                 17: "f8e4m3", 24: "f8e8m0"}
_QMOE_TO_ONNX = {v: k for k, v in _ONNX_TO_QMOE.items()}


class OnnxInteropError(ValueError):
    """A model, node, tensor or file qmoe cannot convert; the message names it."""


def _onnx():
    try:
        import onnx
    except ImportError:
        raise OnnxInteropError("qmoe.onnx needs the `onnx` package (pip install onnx)") from None
    return onnx


# ---------------------------------------------------------------------------------------------
# ONNX -> tensors
# ---------------------------------------------------------------------------------------------

def _tensor_from_proto(t, where):
    """(array in storage type, dtype name) of a TensorProto, bits unchanged."""
    from onnx import numpy_helper
    dtype = _ONNX_TO_QMOE.get(t.data_type)
    if dtype is None:
        raise OnnxInteropError(f"{where}: element type {t.data_type} is not one qmoe reads "
                               f"(expected one of {sorted(_ONNX_TO_QMOE.values())})")
    storage = _safetensors.DTYPES[dtype][1]
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:  # missing external data file, truncated raw data, ...
        raise OnnxInteropError(f"{where}: cannot read its data ({e})") from None
    arr = np.ascontiguousarray(arr)
    if arr.dtype != storage:
        arr = arr.view(storage) if arr.dtype.itemsize == storage.itemsize else arr.astype(storage)
    return arr.reshape(tuple(t.dims)), dtype


def _attr_value(a, where):
    from onnx import helper
    kind = _ATTRS.get(a.name)
    if kind is None:
        raise OnnxInteropError(f"{where}: attribute {a.name!r} is not one qmoe supports "
                               f"(known: {', '.join(sorted(_ATTRS))})")
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        v = v.decode()
    want = {"int": int, "float": float, "str": str}[kind[0]]
    if not isinstance(v, want) and not (want is float and isinstance(v, int)):
        raise OnnxInteropError(f"{where}: attribute {a.name!r} must be {kind[0]}, got {v!r}")
    return v


def _attr_strings(attrs):
    return {k: (repr(float(v)) if isinstance(v, float) else str(v)) for k, v in attrs.items()}


def _layer_metadata(item, semantics):
    """A layer file's metadata for a node: its attributes as ORT names them (floats as repr,
    an infinite limit as inf), those equal to ORT's defaults left out so that the text is one
    per layer, and the semantics the caller says they mean."""
    md = _attr_strings({k: v for k, v in item["attrs"].items()
                        if _ATTRS[k][1] is None or v != _ATTRS[k][1]})
    md.update({"qmoe.format_version": "1", "qmoe.ort_semantics": semantics})
    return md


def _spec(attrs, tensors, semantics, where):
    """The LayerSpec qmoe's ORT import builds; its errors named after `where`."""
    try:
        return _qmoe.spec_from_ort(_attr_strings(attrs), tensors,
                                   _qmoe.OrtSemantics.__members__[semantics])
    except _qmoe.Error as e:
        raise OnnxInteropError(f"{where}: {e}") from None


def _as_f32(value, what, where):
    """A router constant as f32, widened exactly from f16 / bf16 (the pack holds f32)."""
    arr, dtype = value
    if dtype == "f32":
        return arr
    if dtype == "f16":
        return arr.astype(np.float32)
    if dtype == "bf16":  # bf16 bits are the high half of the f32 bits
        return (arr.astype(np.uint32) << np.uint32(16)).view(np.float32)
    raise OnnxInteropError(f"{where}: router {what} is {dtype}; the pack's router holds f32, "
                           f"widened from f32, f16 or bf16 only")


def _const(producer, consts, name, what, where, by):
    """A router constant: an initializer or Constant, or the 2-D Transpose of one (exporters
    that do not fold constants write MatMul(x, Transpose(W)))."""
    node = producer.get(name)
    if name not in consts and node is not None and node.op_type == "Transpose" \
            and node.input[0] in consts:
        from onnx import helper
        arr, dtype = consts[node.input[0]]
        perm = [helper.get_attribute_value(a) for a in node.attribute if a.name == "perm"]
        if arr.ndim == 2 and (not perm or list(perm[0]) == [1, 0]):
            return np.ascontiguousarray(arr.T), dtype
    if name not in consts:
        raise OnnxInteropError(f"{where}: router {what} {name!r} (of {by}) is not an initializer "
                               f"or Constant, so the pack cannot hold it")
    return consts[name]


def _row_bias(c, e, what, where):
    """A bias that broadcasts along the tokens as [E]: shapes [], [1], [E], [1, 1] or [1, E].
    Any other shape differs from token to token (or is no [T, E] broadcast), which a pack's
    router_bias [E] cannot hold."""
    if c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1) or (c.ndim and c.shape[-1] not in (1, e)):
        raise OnnxInteropError(f"{where}: router {what} has shape {list(c.shape)}; the pack's "
                               f"router_bias holds one value per expert ([E] = [{e}], [1, {e}] "
                               f"or a scalar), added to every token's logits")
    return np.ascontiguousarray(np.broadcast_to(c.reshape(-1) if c.ndim else c, (e,)),
                                np.float32)


def _through_casts(producer, name):
    """The tensor a chain of Cast nodes starts from."""
    node = producer.get(name)
    while node is not None and node.op_type == "Cast":
        name = node.input[0]
        node = producer.get(name)
    return name


def _gemm_attrs(node, where):
    from onnx import helper
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    if a.get("transA", 0):
        raise OnnxInteropError(f"{where}: router Gemm {node.name!r} has transA = 1; qmoe reads a "
                               f"router Gemm whose A is the layer input [T, H] (transA = 0)")
    return float(a.get("alpha", 1.0)), float(a.get("beta", 1.0)), bool(a.get("transB", 0))


def _router(producer, consts, qnode, spec, where):
    """(weight [E, H] f32, bias [E] f32 or None) of the router that computes a QMoE node's
    router_probs from its input x, as one of

        MatMul(x, B [H, E] or Transpose(W))   (+ Add of a constant bias)   W = B^T
        Gemm(x, B, C?; transB, alpha, beta)   (+ Add when C is absent)     W = alpha * op(B),
                                                                           bias = beta * C
    where op(B) = B (transB = 1, B [E, H]) or B^T (transB = 0, B [H, E]). Cast nodes on the
    logits, between the product and the Add, and on x are looked through (the layer rounds the
    logits to its activation type, as a cast does; a Cast between the product and the Add
    rounds the product before the bias is added, the pack's router after, so such a model's
    logits may differ from the pack's in the last bit of the cast's type). alpha * B and beta * C are rounded to f32 once: exact when alpha (beta) is a
    power of two, 1 included; ORT's Gemm scales the product instead, which can differ in the
    last bit of a logit. A bias is f32 [E], broadcast over the tokens (_row_bias)."""
    x, probs = qnode.input[0], qnode.input[1]
    e, h = spec.num_experts, spec.hidden
    node, add_bias = producer.get(_through_casts(producer, probs)), None
    if node is not None and node.op_type == "Add":
        const = [i for i in node.input if i in consts]
        other = [i for i in node.input if i not in consts]
        if len(const) == 1 and len(other) == 1:
            add_bias = _as_f32(consts[const[0]], "bias", where)
            node = producer.get(_through_casts(producer, other[0]))
    forms = ("a MatMul with a constant weight (+ Add of a constant bias) or a Gemm with a "
             "constant B")
    if node is None:
        raise OnnxInteropError(
            f"{where}: router_probs {probs!r} is not computed by {forms}, so the pack's "
            f"router_weight cannot be found; extract layer files instead (layer_files=True, "
            f"--layer-files)")
    by = f"{node.op_type} {node.name!r}"
    if node.op_type == "MatMul":
        b = _as_f32(_const(producer, consts, node.input[1], "weight", where, by), "weight", where)
        weight, bias, want = (b.T if b.ndim == 2 else b), None, [h, e]
    elif node.op_type == "Gemm":
        alpha, beta, trans_b = _gemm_attrs(node, where)
        b = _as_f32(_const(producer, consts, node.input[1], "weight", where, by), "weight", where)
        weight, want = (b if trans_b else b.T), ([e, h] if trans_b else [h, e])
        if alpha != 1.0 and b.ndim == 2:
            with np.errstate(over="ignore"):  # an overflow is refused below, naming the node
                weight = weight * np.float32(alpha)
        bias = None
        if len(node.input) > 2 and node.input[2] and beta != 0.0:
            c = _as_f32(_const(producer, consts, node.input[2], "bias", where, by), "bias", where)
            bias = _row_bias(c, e, f"bias C of {by}", where)
            if beta != 1.0:
                with np.errstate(over="ignore"):
                    bias = bias * np.float32(beta)
            if add_bias is not None:
                raise OnnxInteropError(
                    f"{where}: router {by} has a bias C and is followed by an Add of another; "
                    f"the pack's router_bias holds one bias (their f32 sum rounds differently)")
    else:
        raise OnnxInteropError(
            f"{where}: router_probs {probs!r} is computed by {by}, not by {forms}, so the pack's "
            f"router_weight cannot be found; extract layer files instead (layer_files=True, "
            f"--layer-files)")
    if b.ndim != 2 or list(b.shape) != want:
        raise OnnxInteropError(f"{where}: router weight {node.input[1]!r} of {by} has shape "
                               f"{list(b.shape)}, expected {want} (H = {h}, E = {e})")
    if add_bias is not None:
        bias = _row_bias(add_bias, e, "bias (the Add's constant)", where)
    if _through_casts(producer, node.input[0]) != _through_casts(producer, x):
        raise OnnxInteropError(f"{where}: router {by} reads {node.input[0]!r}, not the layer's "
                               f"input {x!r}; the pack computes the logits from the layer input")
    for what, v in (("weight", weight), ("bias", bias)):
        if v is not None and not np.isfinite(v).all():
            raise OnnxInteropError(f"{where}: router {what} of {by} has values that are not "
                                   f"finite (after alpha / beta)")
    return ((np.ascontiguousarray(weight, np.float32), "f32"),
            None if bias is None else (bias, "f32"))


def read_nodes(model, semantics="cuda", routers=False):
    """The QMoE nodes of a model (a path or a ModelProto), validated: a list of dicts with
    name, index (N of a node named "layers.N.*", else its position), attrs, tensors (ORT names ->
    (array, dtype name)), spec, and with routers=True router_weight / router_bias."""
    onnx = _onnx()
    if not isinstance(model, onnx.ModelProto):
        try:
            model = onnx.load(str(model))  # external data next to the model is loaded too
        except Exception as e:
            raise OnnxInteropError(f"{model}: cannot load the ONNX model ({e})") from None
    if semantics not in ("cuda", "cpu"):
        raise OnnxInteropError(f"semantics: expected 'cuda' or 'cpu', got {semantics!r}")
    g = model.graph
    consts = {t.name: _tensor_from_proto(t, f"initializer {t.name!r}") for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.attribute \
                and n.attribute[0].name == "value":
            consts[n.output[0]] = _tensor_from_proto(n.attribute[0].t, f"Constant {n.output[0]!r}")
    producer = {o: n for n in g.node for o in n.output}
    qnodes = [n for n in g.node if n.op_type == "QMoE" and n.domain == "com.microsoft"]
    if not qnodes:
        raise OnnxInteropError("the model has no com.microsoft QMoE node")
    out, seen = [], {}
    for pos, n in enumerate(qnodes):
        name = n.name or f"QMoE#{pos}"
        where = f"node {name!r}"
        if len(n.input) > len(ORT_INPUTS):
            raise OnnxInteropError(f"{where}: {len(n.input)} inputs, QMoE has {len(ORT_INPUTS)}")
        attrs = {a.name: _attr_value(a, where) for a in n.attribute}
        tensors = {}
        for i, src in enumerate(n.input):
            role = ORT_INPUTS[i]
            if not src or role in _CALL_INPUTS:
                continue
            if role in _UNSUPPORTED_INPUTS:
                raise OnnxInteropError(f"{where}: input {i} ({role}, {src!r}) is activation "
                                       f"quantization, which qmoe does not implement")
            if src not in consts:
                raise OnnxInteropError(f"{where}: input {i} ({role}) is {src!r}, which is not an "
                                       f"initializer or Constant; qmoe extracts constant "
                                       f"weights only")
            tensors[role] = consts[src]
        for role in ("fc1_experts_weights", "fc2_experts_weights"):
            if role not in tensors:
                raise OnnxInteropError(f"{where}: required input {role} is missing")
        m = re.match(r"layers\.(\d+)\.", n.name or "")
        index = int(m.group(1)) if m else pos
        if index in seen:
            raise OnnxInteropError(f"{where}: layer index {index} is also node {seen[index]!r}")
        seen[index] = name
        item = {"name": name, "index": index, "attrs": attrs, "tensors": tensors,
                "spec": _spec(attrs, tensors, semantics, where)}
        if routers:
            if len(n.input) < 2 or not n.input[1]:
                raise OnnxInteropError(f"{where}: router_probs (input 1) is missing")
            item["router_weight"], item["router_bias"] = _router(producer, consts, n,
                                                                 item["spec"], where)
        out.append(item)
    return sorted(out, key=lambda d: d["index"])


def extract(model, out, *, layer_files=False, semantics="cuda"):
    """Writes a model's QMoE nodes as one model pack at `out` (docs/model-pack.md) or, with
    layer_files=True, as layer files out/layer_N.safetensors. `semantics` ("cuda" or "cpu") says
    whose routing the attributes mean (qmoe.ort_semantics). Returns the paths written."""
    nodes = read_nodes(model, semantics, routers=not layer_files)
    if layer_files:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        blobs = [(out / f"layer_{d['index']}.safetensors",
                  _safetensors.to_bytes(d["tensors"], _layer_metadata(d, semantics)))
                 for d in nodes]
    else:
        tensors, meta = {}, {"qmoe.pack_version": "1", "qmoe.model_type": "onnx",
                             "qmoe.converted_from": "onnx",
                             "qmoe.layers": ",".join(str(d["index"]) for d in nodes)}
        for d in nodes:
            p = f"layers.{d['index']}."
            tensors.update({p + k: v for k, v in d["tensors"].items()})
            tensors[p + "router_weight"] = d["router_weight"]
            if d["router_bias"] is not None:
                tensors[p + "router_bias"] = d["router_bias"]
            meta.update({p + k: v for k, v in _layer_metadata(d, semantics).items()})
        blobs = [(Path(out), _safetensors.to_bytes(tensors, meta))]
    for path, data in blobs:
        _safetensors.write_atomic(path, data)
    return [p for p, _ in blobs]


# ---------------------------------------------------------------------------------------------
# layer file / pack -> ONNX
# ---------------------------------------------------------------------------------------------

def _split_pack(tensors, metadata, path):
    """[(index, tensors, metadata, router)] of a pack or a layer file (index None)."""
    if "qmoe.pack_version" not in metadata:
        return [(None, tensors, metadata, None)]
    try:
        indices = [int(s) for s in metadata.get("qmoe.layers", "").split(",") if s]
    except ValueError:
        raise OnnxInteropError(f"{path}: qmoe.layers {metadata['qmoe.layers']!r} is not a list "
                               f"of layer indices") from None
    layers = []
    for n in indices:
        p = f"layers.{n}."
        t = {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}
        md = {k[len(p):]: v for k, v in metadata.items() if k.startswith(p)}
        router = (t.pop("router_weight", None), t.pop("router_bias", None))
        if router[0] is None:
            raise OnnxInteropError(f"{path}: layer {n}: tensor {p}router_weight is missing")
        layers.append((n, t, md, router))
    return layers


def _ort_attrs(metadata, tensors, where):
    """ORT attributes of a layer's metadata, refusing qmoe.* settings ORT cannot express: the
    spec the attributes alone give must describe the layer as its metadata does."""
    attrs = {}
    for k, v in metadata.items():
        if k.startswith("qmoe."):
            continue
        if k not in _ATTRS:
            raise OnnxInteropError(f"{where}: metadata key {k!r} is not a QMoE attribute")
        kind, default = _ATTRS[k]
        val = {"int": int, "float": float, "str": str}[kind](v)
        if default is None or val != default:
            attrs[k] = val
    # The qmoe.* keys must be those the attributes imply, under either ORT's CUDA or CPU
    # reading of them (ONNX has no place for the semantics: the caller knows which runs it).
    wanted = {k: v for k, v in metadata.items()
              if k.startswith("qmoe.") and k not in ("qmoe.format_version", "qmoe.ort_semantics")}
    first = metadata.get("qmoe.ort_semantics", "cuda")
    mismatch = None
    for semantics in (first, "cpu" if first == "cuda" else "cuda"):
        normal = _qmoe.layer_file_metadata(_spec(attrs, tensors, semantics, where))
        bad = [k for k, v in wanted.items() if normal.get(k) != v]
        if not bad:
            return attrs
        mismatch = mismatch or (bad[0], normal.get(bad[0]))
    k, got = mismatch
    raise OnnxInteropError(f"{where}: {k} = {metadata[k]!r} cannot be expressed by QMoE "
                           f"attributes (they give {got!r})")


def _initializer(name, value):
    from onnx import helper
    arr, dtype = value
    return helper.make_tensor(name, _QMOE_TO_ONNX[dtype], list(arr.shape),
                              np.ascontiguousarray(arr).tobytes(), raw=True)


def to_model(path):
    """A ModelProto with one QMoE node per layer of a pack or layer file. Layer N (a pack) reads
    graph input layers.N.input [T, H] and writes layers.N.output; its router is a MatMul (+ Add)
    on layers.N.input. A layer file's node reads input and router_probs [T, E], writes output."""
    _onnx()
    from onnx import TensorProto, helper
    tensors, metadata = _safetensors.read(path)
    nodes, inits, g_in, g_out = [], [], [], []
    for index, t, md, router in _split_pack(tensors, metadata, path):
        where = f"{path}" + ("" if index is None else f": layer {index}")
        attrs = _ort_attrs(md, t, where)
        spec = _spec(attrs, t, md.get("qmoe.ort_semantics", "cuda"), where)
        act = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16,
               "bf16": TensorProto.BFLOAT16}[spec.act_dtype.name]
        p = "" if index is None else f"layers.{index}."
        h, e = spec.hidden, spec.num_experts
        x, probs = p + "input", p + "router_probs"
        g_in.append(helper.make_tensor_value_info(x, act, ["tokens", h]))
        if router is None:
            g_in.append(helper.make_tensor_value_info(probs, act, ["tokens", e]))
        else:
            w, b = router
            if act != TensorProto.FLOAT:
                raise OnnxInteropError(f"{where}: the router MatMul needs f32 activations, the "
                                       f"layer's are {spec.act_dtype.name}")
            inits.append(_initializer(p + "router_weight_t", (np.ascontiguousarray(w[0].T), "f32")))
            logits = p + "router_logits" if b is not None else probs
            nodes.append(helper.make_node("MatMul", [x, p + "router_weight_t"], [logits],
                                          name=p + "router"))
            if b is not None:
                inits.append(_initializer(p + "router_bias", b))
                nodes.append(helper.make_node("Add", [logits, p + "router_bias"], [probs],
                                              name=p + "router_bias"))
        unknown = sorted(set(t) - set(ORT_INPUTS))
        if unknown:
            raise OnnxInteropError(f"{where}: tensor {unknown[0]!r} has no QMoE input")
        last = max(ORT_INPUTS.index(k) for k in t)
        inputs = [x, probs] + [(p + k if k in t else "") for k in ORT_INPUTS[2:last + 1]]
        inits += [_initializer(p + k, v) for k, v in t.items()]
        nodes.append(helper.make_node("QMoE", inputs, [p + "output"], domain="com.microsoft",
                                      name=p + "qmoe", **attrs))
        g_out.append(helper.make_tensor_value_info(p + "output", act, ["tokens", h]))
    graph = helper.make_graph(nodes, "qmoe", g_in, g_out, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              producer_name="qmoe")
    model.ir_version = 10
    return model


def export(path, out):
    """Writes a pack or layer file as an ONNX model (see to_model); returns out."""
    model = to_model(path)
    _safetensors.write_atomic(out, model.SerializeToString())
    return Path(out)


# ---------------------------------------------------------------------------------------------
# python -m qmoe.onnx
# ---------------------------------------------------------------------------------------------

def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(
        prog="python -m qmoe.onnx",
        description="Convert between ONNX models with com.microsoft QMoE nodes and qmoe model "
                    "packs / layer files.",
        epilog="examples:\n  python -m qmoe.onnx extract model.onnx -o model.pack.safetensors\n"
               "  python -m qmoe.onnx extract model.onnx -o layers/ --layer-files\n"
               "  python -m qmoe.onnx export model.pack.safetensors -o model.onnx",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="QMoE nodes -> a model pack (or layer files)")
    ex.add_argument("model")
    ex.add_argument("-o", "--output", required=True,
                    help="the pack, or a folder with --layer-files")
    ex.add_argument("--layer-files", action="store_true", help="one layer file per node")
    ex.add_argument("--semantics", choices=("cuda", "cpu"), default="cuda",
                    help="whose routing the attributes mean (default: cuda)")
    exp = sub.add_parser("export", help="a model pack or layer file -> an ONNX model")
    exp.add_argument("source")
    exp.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    try:
        if args.command == "extract":
            for p in extract(args.model, args.output, layer_files=args.layer_files,
                             semantics=args.semantics):
                print(p)
        else:
            print(export(args.source, args.output))
    except (ValueError, OSError, _qmoe.Error) as e:  # OnnxInteropError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
