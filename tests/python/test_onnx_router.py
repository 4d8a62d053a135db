"""qmoe.onnx.extract to a pack: the router weight (and bias) behind a QMoE node's router_probs, in
the forms exporters write it.

    MatMul(x, W^T) (+ Add b)      torch.matmul / a Linear traced as MatMul + Add (W^T a
                                  constant, or a Transpose of W where constants are not folded)
    Gemm(x, W, b, transB=1)       torch.nn.Linear as torch.onnx exports it
    Gemm(x, W^T, b, transB=0)     other exporters; alpha / beta scale the product and the bias

Each model is ortqmoe.build_model's one-node model with router_probs computed in the graph from
`input`. Checked: the pack's router_weight (router_bias) equals the source's W (b) exactly, or
alpha * W (beta * b) rounded once to f32; the layer of the pack, with the logits a pack's router
gives (x W^T + b accumulated in fp64, rounded to f32, as `qmoe run --model` computes them), matches
onnxruntime CPU on the source model within the fp32 budget; forms a pack cannot hold fail with an
error naming the QMoE node and the router node, and write nothing.

Needs the built module (PYTHONPATH=build/python) and onnx / onnxruntime; the `qmoe run --model`
check also runs where the CLI is built (ortqmoe.find_cli)."""

import numpy as np
import pytest

from ortqmoe import (build_model, find_cli, import_qmoe, make_layer, read_safetensors, rel_norm,
                     run_cli, run_ort, write_safetensors)

qmoe = import_qmoe()
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import qmoe.onnx as qonnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from qmoe import _safetensors  # noqa: E402

H, I, E, K, T = 64, 32, 8, 2, 6
TOL_F32 = 1e-5  # test_ort_conformance.TOL[np.float32]
TOL_F16 = 2e-3  # test_ort_conformance.TOL[np.float16]


def _layer(rng, act_dtype=np.float32):
    return make_layer(rng, H, I, E, bits=4, block_size=32, zero_points=True, activation="swiglu",
                      swiglu_fusion=1, k=K, normalize_routing_weights=1, act_dtype=act_dtype)


def _routed(layer, router, consts, act_dtype=np.float32, extra_inputs=()):
    """build_model(layer) with graph input router_probs replaced by `router` (nodes that write
    router_probs) and `consts` (name -> array) as initializers."""
    m = onnx.load_from_string(build_model(layer, act_dtype))
    g = m.graph
    keep = [i for i in g.input if i.name != "router_probs"]
    del g.input[:]
    g.input.extend(keep + list(extra_inputs))
    g.initializer.extend(numpy_helper.from_array(np.ascontiguousarray(v), k)
                         for k, v in consts.items())
    nodes = list(router) + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(m)
    return m


def _gemm(w, b, trans_b=1, alpha=None, beta=None, c_shape=None):
    attrs = {"transB": trans_b}
    if alpha is not None:
        attrs["alpha"] = alpha
    if beta is not None:
        attrs["beta"] = beta
    consts = {"router.B": w if trans_b else np.ascontiguousarray(w.T)}
    inputs = ["input", "router.B"]
    if b is not None:
        consts["router.C"] = b.reshape(c_shape or b.shape)
        inputs.append("router.C")
    return [helper.make_node("Gemm", inputs, ["router_probs"], name="router", **attrs)], consts


def _matmul_add(w, b, bias_first=False, bias_shape=None):
    consts = {"router.W_t": np.ascontiguousarray(w.T)}
    nodes = [helper.make_node("MatMul", ["input", "router.W_t"],
                              ["logits" if b is not None else "router_probs"], name="router")]
    if b is not None:
        consts["router.b"] = b.reshape(bias_shape or b.shape)
        ins = ["router.b", "logits"] if bias_first else ["logits", "router.b"]
        nodes.append(helper.make_node("Add", ins, ["router_probs"], name="router_bias"))
    return nodes, consts


def _matmul_transpose(w):
    """MatMul(x, Transpose(W)): a Linear exported without constant folding."""
    return ([helper.make_node("Transpose", ["router.W"], ["router.W_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["input", "router.W_t"], ["router_probs"], name="router")],
            {"router.W": w})


def _pack_layer(pack, tmp_path, index=0):
    """(layer file of pack layer `index`, router_weight, router_bias or None)."""
    tensors, meta = _safetensors.read(pack)
    p = f"layers.{index}."
    t = {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}
    md = {k[len(p):]: v for k, v in meta.items() if k.startswith(p)}
    w, b = t.pop("router_weight"), t.pop("router_bias", None)
    assert w[1] == "f32" and (b is None or b[1] == "f32")
    lf = tmp_path / f"pack_layer_{index}.safetensors"
    _safetensors.write_atomic(lf, _safetensors.to_bytes(t, md))
    return lf, w[0], None if b is None else b[0]


def _pack_logits(x, w, b):
    """A pack router's logits: fp64 accumulation of x W^T (+ b), rounded to f32."""
    acc = x.astype(np.float64) @ w.astype(np.float64).T
    if b is not None:
        acc += b.astype(np.float64)
    return acc.astype(np.float32)


def _check_against_ort(model, pack, x, tmp_path, record_max, tol=TOL_F32, label="f32"):
    y_src = run_ort(model.SerializeToString(), {"input": x})
    lf, w, b = _pack_layer(pack, tmp_path)
    logits = _pack_logits(x, w, b).astype(x.dtype)
    y = qmoe.Layer.from_file(lf, backend="cpu").run(x, logits)
    e = rel_norm(y, y_src)
    record_max(f"qmoe on pack with ONNX router vs onnxruntime ({label})", e)
    assert e <= tol
    cli = find_cli()
    if cli is not None:  # the C++ pack reader and router, where the CLI is built
        xin, yout = tmp_path / "x.safetensors", tmp_path / "y.safetensors"
        write_safetensors(xin, {"input": x})
        r = run_cli(cli, ["run", "--model", pack, "--layer", 0, "--input", xin, "--output",
                          yout, "--no-check"])
        assert r.returncode == 0, r.stderr
        e = rel_norm(read_safetensors(yout)[0]["output"], y_src)
        record_max(f"qmoe run --model vs onnxruntime ({label})", e)
        assert e <= tol


def _router_params(rng):
    w = (rng.standard_normal((E, H)) / 8).astype(np.float32)
    b = rng.standard_normal(E).astype(np.float32)
    return w, b


# (id, router builder (w, b) -> (nodes, consts), uses the bias, alpha, beta)
FORMS = [
    ("matmul", lambda w, b: _matmul_add(w, None), False, 1.0, 1.0),
    ("matmul_add", lambda w, b: _matmul_add(w, b), True, 1.0, 1.0),
    ("matmul_transpose", lambda w, b: _matmul_transpose(w), False, 1.0, 1.0),
    ("matmul_add_bias_first_1xE", lambda w, b: _matmul_add(w, b, True, (1, E)), True, 1.0, 1.0),
    ("gemm_transB1", lambda w, b: _gemm(w, b), True, 1.0, 1.0),
    ("gemm_transB0", lambda w, b: _gemm(w, b, trans_b=0), True, 1.0, 1.0),
    ("gemm_no_c", lambda w, b: _gemm(w, None), False, 1.0, 1.0),
    ("gemm_c_1xE_pow2_alpha_beta",
     lambda w, b: _gemm(w, b, alpha=0.5, beta=4.0, c_shape=(1, E)), True, 0.5, 4.0),
    ("gemm_transB0_alpha_beta", lambda w, b: _gemm(w, b, 0, alpha=0.7, beta=1.3), True, 0.7, 1.3),
    ("gemm_beta0", lambda w, b: _gemm(w, b, beta=0.0), False, 1.0, 0.0),
]


@pytest.mark.parametrize("form,build,biased,alpha,beta", FORMS, ids=[f[0] for f in FORMS])
def test_router_forms_match_onnxruntime(form, build, biased, alpha, beta, rng, tmp_path,
                                        record_max):
    layer = _layer(rng)
    w, b = _router_params(rng)
    model = _routed(layer, *build(w, b))
    pack = tmp_path / "pack.safetensors"
    qonnx.extract(model, pack, semantics="cpu")

    _, pw, pb = _pack_layer(pack, tmp_path)
    # The source's weight exactly (alpha 1), or alpha * W rounded once to f32: an f32 product
    # is exact in f64, so rounding it to f32 gives the correctly rounded product.
    want_w = (w.astype(np.float64) * np.float32(alpha)).astype(np.float32)
    assert pw.shape == (E, H) and np.array_equal(pw, want_w)
    if alpha == 1.0:
        assert pw.tobytes() == w.tobytes()
    if biased:
        want_b = (b.astype(np.float64) * np.float32(beta)).astype(np.float32)
        assert pb is not None and pb.shape == (E,) and np.array_equal(pb, want_b)
    else:
        assert pb is None

    x = rng.standard_normal((T, H)).astype(np.float32)
    _check_against_ort(model, pack, x, tmp_path, record_max)

    # export writes the router as MatMul (+ Add); extracting that gives the same pack back.
    back = tmp_path / "back.safetensors"
    qonnx.extract(qonnx.export(pack, tmp_path / "exported.onnx"), back, semantics="cpu")
    assert _safetensors.read(back)[0].keys() == _safetensors.read(pack)[0].keys()
    for k, (arr, dtype) in _safetensors.read(back)[0].items():
        assert _safetensors.read(pack)[0][k][0].tobytes() == arr.tobytes(), k


def test_gemm_scalar_c_and_casts(rng, tmp_path, record_max):
    """A scalar C broadcasts to every expert; Casts around the router are looked through."""
    layer = _layer(rng)
    w, _ = _router_params(rng)
    c = np.float32(rng.standard_normal())
    consts = {"router.B": w, "router.C": np.array(c, np.float32)}
    nodes = [helper.make_node("Cast", ["input"], ["x32"], to=TensorProto.FLOAT),
             helper.make_node("Gemm", ["x32", "router.B", "router.C"], ["logits"], name="router",
                              transB=1),
             helper.make_node("Cast", ["logits"], ["router_probs"], to=TensorProto.FLOAT)]
    model = _routed(layer, nodes, consts)
    pack = tmp_path / "pack.safetensors"
    qonnx.extract(model, pack, semantics="cpu")
    _, pw, pb = _pack_layer(pack, tmp_path)
    assert pw.tobytes() == w.tobytes() and np.array_equal(pb, np.full(E, c, np.float32))
    _check_against_ort(model, pack, rng.standard_normal((T, H)).astype(np.float32), tmp_path,
                       record_max)


def test_matmul_cast_add_cast(rng, tmp_path, record_max):
    """An f16 model whose router widens the product before adding an f32 bias and narrows the
    sum again: MatMul (f16) -> Cast (f32) -> Add (f32 bias) -> Cast (f16)."""
    layer = _layer(rng, np.float16)
    w, b = _router_params(rng)
    w16 = w.astype(np.float16)
    consts = {"router.W_t": np.ascontiguousarray(w16.T), "router.b": b}
    nodes = [helper.make_node("MatMul", ["input", "router.W_t"], ["p16"], name="router"),
             helper.make_node("Cast", ["p16"], ["p32"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["p32", "router.b"], ["l32"], name="router_bias"),
             helper.make_node("Cast", ["l32"], ["router_probs"], to=TensorProto.FLOAT16)]
    model = _routed(layer, nodes, consts, act_dtype=np.float16)
    pack = tmp_path / "pack.safetensors"
    qonnx.extract(model, pack, semantics="cpu")
    _, pw, pb = _pack_layer(pack, tmp_path)
    assert np.array_equal(pw, w16.astype(np.float32)) and pb.tobytes() == b.tobytes()
    x = rng.standard_normal((T, H)).astype(np.float16)
    _check_against_ort(model, pack, x, tmp_path, record_max, TOL_F16, "f16 cast chain")


def test_f16_router_widened_exactly(rng, tmp_path, record_max):
    """An f16 model's router weight and bias become the pack's f32 exactly."""
    layer = _layer(rng, np.float16)
    w, b = (a.astype(np.float16) for a in _router_params(rng))
    model = _routed(layer, *_gemm(w, b), act_dtype=np.float16)
    pack = tmp_path / "pack.safetensors"
    qonnx.extract(model, pack, semantics="cpu")
    _, pw, pb = _pack_layer(pack, tmp_path)
    assert pw.dtype == np.float32 and np.array_equal(pw, w.astype(np.float32))
    assert np.array_equal(pb, b.astype(np.float32))
    x = rng.standard_normal((T, H)).astype(np.float16)
    _check_against_ort(model, pack, x, tmp_path, record_max, TOL_F16, "f16")


def _expect_error(tmp_path, model, *needles):
    out = tmp_path / "never.safetensors"
    with pytest.raises(qonnx.OnnxInteropError) as ei:
        qonnx.extract(model, out)
    for s in needles:
        assert s in str(ei.value), str(ei.value)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".never")]


def _name_qmoe(m, name="moe3"):
    next(n for n in m.graph.node if n.op_type == "QMoE").name = name
    return m


def test_unsupported_router_forms_name_the_nodes(rng, tmp_path):
    layer = _layer(rng)
    w, b = _router_params(rng)

    nodes, consts = _gemm(w, b)
    nodes[0].attribute.append(helper.make_attribute("transA", 1))
    _expect_error(tmp_path, _name_qmoe(_routed(layer, nodes, consts)), "moe3", "'router'",
                  "transA")

    nodes, consts = _gemm(w, b, c_shape=None)
    consts["router.C"] = np.tile(b, (T, 1))  # a bias per token: no [E] can hold it
    _expect_error(tmp_path, _name_qmoe(_routed(layer, nodes, consts)), "moe3", "'router'",
                  f"[{T}, {E}]", "router_bias")

    nodes, consts = _gemm(w, b)
    nodes[0].output[0] = "gemm_out"
    consts["router.b2"] = b
    nodes.append(helper.make_node("Add", ["gemm_out", "router.b2"], ["router_probs"]))
    _expect_error(tmp_path, _name_qmoe(_routed(layer, nodes, consts)), "moe3", "'router'",
                  "one bias")

    # The router reads a tensor other than the layer's input.
    other = helper.make_tensor_value_info("other", TensorProto.FLOAT, ["tokens", H])
    nodes, consts = _gemm(w, b)
    nodes[0].input[0] = "other"
    _expect_error(tmp_path, _name_qmoe(_routed(layer, nodes, consts, extra_inputs=[other])),
                  "moe3", "'router'", "'other'", "layer's input")

    # A weight computed in the graph (here a graph input).
    wt = helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [E, H])
    nodes, consts = _gemm(w, b)
    nodes[0].input[1] = "w_in"
    del consts["router.B"]
    _expect_error(tmp_path, _name_qmoe(_routed(layer, nodes, consts, extra_inputs=[wt])),
                  "moe3", "Gemm 'router'", "'w_in'", "not an initializer")

    # Softmax before the node: QMoE takes logits, so this is no router qmoe reads.
    nodes, consts = _matmul_add(w, None)
    nodes[0].output[0] = "logits"
    nodes.append(helper.make_node("Softmax", ["logits"], ["router_probs"], name="probs", axis=1))
    _expect_error(tmp_path, _name_qmoe(_routed(layer, nodes, consts)), "moe3", "Softmax 'probs'",
                  "--layer-files")

    nodes, consts = _gemm(w, None, trans_b=0)  # B [H, E] where transB = 1 wants [E, H]
    nodes[0].attribute[0].i = 1
    consts["router.B"] = np.zeros((H, E), np.float32)
    _expect_error(tmp_path, _name_qmoe(_routed(layer, nodes, consts)), "moe3", f"[{H}, {E}]",
                  f"expected [{E}, {H}]")

    nodes, consts = _gemm(w * 100, b, alpha=3e38)  # alpha * W overflows f32
    _expect_error(tmp_path, _name_qmoe(_routed(layer, nodes, consts)), "moe3", "not finite")
