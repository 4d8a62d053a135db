"""qmoe.onnx: QMoE nodes of an ONNX model to layer files / model packs and back.

The ONNX models come from ortqmoe.build_model (written independently of the package). Checked:
qmoe's CPU result on an extracted layer equals onnxruntime CPU's on the source model and on the
exported model, within the conformance suite's fp32 budget; extract(export(x)) gives back every
tensor bit for bit and the same metadata; bad models fail with a message naming the node and the
attribute or input, and leave nothing behind.

Needs the built module (PYTHONPATH=build/python) and onnx / onnxruntime."""

import os
import subprocess
import sys

import numpy as np
import pytest

from ortqmoe import BF16, QNBIT_ENV, build_model, import_qmoe, make_layer, rel_norm, run_ort

qmoe = import_qmoe()
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import qmoe.onnx as qonnx  # noqa: E402
from qmoe import _safetensors  # noqa: E402

H, I, E, K, T = 64, 32, 8, 2, 6
TOL_F32 = 1e-5  # test_ort_conformance.TOL[np.float32]: fp32 GEMMs on exact weights


def _model_file(tmp_path, layer, name="src.onnx"):
    p = tmp_path / name
    p.write_bytes(build_model(layer))
    return p


def _layer(rng, **kw):
    args = dict(bits=4, block_size=32, zero_points=True, activation="swiglu", swiglu_fusion=1,
                k=K, normalize_routing_weights=1)
    args.update(kw)
    return make_layer(rng, H, I, E, **args)


def _inputs(rng):
    return (rng.standard_normal((T, H)).astype(np.float32),
            (2 * rng.standard_normal((T, E))).astype(np.float32))


def _qmoe_cpu(path, x, logits):
    return qmoe.Layer.from_file(path, backend="cpu").run(x, logits)


@pytest.mark.parametrize("kw", [{}, {"zero_points": False, "block_size": 0, "bits": 8},
                                {"activation": "relu", "bias": False,
                                 "normalize_routing_weights": 0},
                                {"quant": "mxfp4", "block_size": 32}],
                         ids=["int4_b32_zp", "int8_channel", "relu_nobias", "mxfp4"])
def test_layer_file_round_trip_matches_onnxruntime(kw, rng, tmp_path, record_max):
    layer = _layer(rng, **kw)
    src = _model_file(tmp_path, layer)
    x, logits = _inputs(rng)
    y_src = run_ort(src.read_bytes(), {"input": x, "router_probs": logits})

    (lf,) = qonnx.extract(src, tmp_path / "layers", layer_files=True, semantics="cpu")
    tensors, meta = _safetensors.read(lf)
    expect = {k: np.asarray(v.bits if hasattr(v, "bits") else v)
              for k, v in layer.weight_tensors().items()}
    assert sorted(tensors) == sorted(expect)
    for k, (arr, _) in tensors.items():
        assert arr.shape == expect[k].shape and arr.tobytes() == expect[k].tobytes(), k
    assert meta["qmoe.ort_semantics"] == "cpu" and meta["k"] == str(K)

    y = _qmoe_cpu(lf, x, logits)
    e = rel_norm(y, y_src)
    record_max("qmoe on extracted layer vs onnxruntime (f32)", e)
    assert e <= TOL_F32

    model = qonnx.export(lf, tmp_path / "out.onnx")
    onnx.checker.check_model(str(model))
    y_exp = run_ort(model.read_bytes(), {"input": x, "router_probs": logits})
    e = rel_norm(y, y_exp)
    record_max("qmoe vs onnxruntime on exported model (f32)", e)
    assert e <= TOL_F32

    (again,) = qonnx.extract(model, tmp_path / "again", layer_files=True, semantics="cpu")
    assert _same(again, lf)


def _same(a, b):
    ta, ma = _safetensors.read(a)
    tb, mb = _safetensors.read(b)
    assert ma == mb
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k][1] == tb[k][1] and ta[k][0].shape == tb[k][0].shape, k
        assert ta[k][0].tobytes() == tb[k][0].tobytes(), k
    return True


def _pack(rng, tmp_path, semantics="cpu"):
    """A two-layer pack (layers 3 and 5) from extracted layer files plus router weights."""
    tensors, meta = {}, {"qmoe.pack_version": "1", "qmoe.layers": "3,5",
                         "qmoe.model_type": "onnx", "qmoe.converted_from": "onnx"}
    routers = {}
    for n, kw in ((3, {}), (5, {"bits": 8, "zero_points": False})):
        src = _model_file(tmp_path, _layer(rng, **kw), f"l{n}.onnx")
        (lf,) = qonnx.extract(src, tmp_path / f"l{n}", layer_files=True, semantics=semantics)
        t, md = _safetensors.read(lf)
        w = (rng.standard_normal((E, H)) / 8).astype(np.float32)
        routers[n] = (lf, w)
        tensors.update({f"layers.{n}.{k}": v for k, v in t.items()})
        tensors[f"layers.{n}.router_weight"] = (w, "f32")
        meta.update({f"layers.{n}.{k}": v for k, v in md.items()})
    pack = tmp_path / "pack.safetensors"
    _safetensors.write_atomic(pack, _safetensors.to_bytes(tensors, meta))
    return pack, routers


def test_f16_layer_matches_onnxruntime(rng, tmp_path, record_max):
    layer = _layer(rng, act_dtype=np.float16)
    src = tmp_path / "f16.onnx"
    src.write_bytes(build_model(layer, np.float16))
    x, logits = (a.astype(np.float16) for a in _inputs(rng))
    (lf,) = qonnx.extract(src, tmp_path / "l", layer_files=True, semantics="cpu")
    y = _qmoe_cpu(lf, x, logits)
    assert y.dtype == np.float16
    model = qonnx.export(lf, tmp_path / "out.onnx")
    y_exp = run_ort(model.read_bytes(), {"input": x, "router_probs": logits})
    e = rel_norm(y, y_exp)
    record_max("qmoe vs onnxruntime on exported model (f16)", e)
    assert e <= 2e-3  # test_ort_conformance.TOL[np.float16]
    (again,) = qonnx.extract(model, tmp_path / "again", layer_files=True, semantics="cpu")
    assert _same(again, lf)


def test_bf16_tensors_round_trip_bit_for_bit(rng, tmp_path):
    layer = _layer(rng, act_dtype=BF16)
    src = tmp_path / "bf16.onnx"
    src.write_bytes(build_model(layer, BF16))  # casts around the node; weights stay BF16
    (lf,) = qonnx.extract(src, tmp_path / "l", layer_files=True)
    tensors, _ = _safetensors.read(lf)
    assert tensors["fc1_scales"][1] == "bf16" and tensors["fc1_experts_bias"][1] == "bf16"
    assert tensors["fc1_scales"][0].tobytes() == layer.fc1.scales.bits.tobytes()
    model = qonnx.export(lf, tmp_path / "out.onnx")
    assert onnx.load(str(model)).graph.input[0].type.tensor_type.elem_type \
        == onnx.TensorProto.BFLOAT16
    (again,) = qonnx.extract(model, tmp_path / "again", layer_files=True)
    assert _same(again, lf)


def test_pack_round_trip_matches_onnxruntime(rng, tmp_path, record_max, monkeypatch):
    pack, routers = _pack(rng, tmp_path)
    model = qonnx.export(pack, tmp_path / "pack.onnx")
    onnx.checker.check_model(str(model))
    feeds = {f"layers.{n}.input": rng.standard_normal((T, H)).astype(np.float32)
             for n in routers}
    import onnxruntime as ort
    # As run_ort: fp32 activations in ORT's block-wise 8-bit GEMM, so the comparison can be tight.
    monkeypatch.setenv(QNBIT_ENV, "fp32")
    sess = ort.InferenceSession(model.read_bytes(), providers=["CPUExecutionProvider"])
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    for n, (lf, w) in routers.items():
        x = feeds[f"layers.{n}.input"]
        y = _qmoe_cpu(lf, x, x @ w.T)
        e = rel_norm(y, outs[f"layers.{n}.output"])
        record_max("qmoe vs onnxruntime on exported pack (f32)", e)
        assert e <= TOL_F32, f"layer {n}: {e:.3e}"

    back = tmp_path / "back.safetensors"
    qonnx.extract(model, back, semantics="cpu")
    assert _same(back, pack)


def _expect_error(tmp_path, model, *needles, **kw):
    out = tmp_path / "never.safetensors"
    with pytest.raises(qonnx.OnnxInteropError) as ei:
        qonnx.extract(model, out, **kw)
    for s in needles:
        assert s in str(ei.value), str(ei.value)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".never")]
    return str(ei.value)


def _qmoe_node(m):
    return next(n for n in m.graph.node if n.op_type == "QMoE")


def test_errors_name_node_and_input(rng, tmp_path):
    m = onnx.load_from_string(build_model(_layer(rng)))
    node = _qmoe_node(m)
    node.name = "moe7"
    # Pack: router_probs is a graph input, so there is no router weight to take.
    _expect_error(tmp_path, m, "moe7", "router_probs", "--layer-files")

    bad = onnx.ModelProto()
    bad.CopyFrom(m)
    _qmoe_node(bad).attribute.append(onnx.helper.make_attribute("frobnicate", 1))
    _expect_error(tmp_path, bad, "moe7", "frobnicate", layer_files=False)

    bad.CopyFrom(m)
    q = _qmoe_node(bad)
    q.input[5] = ""  # fc2_experts_weights
    _expect_error(tmp_path, bad, "moe7", "fc2_experts_weights", layer_files=True)

    bad.CopyFrom(m)
    _qmoe_node(bad).input[3] = "computed"  # fc1_scales from elsewhere
    _expect_error(tmp_path, bad, "moe7", "fc1_scales", "'computed'", layer_files=True)

    bad.CopyFrom(m)
    for a in _qmoe_node(bad).attribute:
        if a.name == "k":
            a.i = E + 1
    _expect_error(tmp_path, bad, "moe7", layer_files=True)

    bad.CopyFrom(m)
    q = _qmoe_node(bad)
    q.ClearField("domain")
    _expect_error(tmp_path, bad, "no com.microsoft QMoE node", layer_files=True)


@pytest.mark.parametrize("key,value", [("qmoe.combine", "input"),
                                       ("qmoe.routing_method", "topk_sigmoid"),
                                       ("qmoe.shared_weight", "one"),
                                       ("activation_kind", "relu")])
def test_export_refuses_what_ort_cannot_hold(key, value, rng, tmp_path):
    (lf,) = qonnx.extract(_model_file(tmp_path, _layer(rng)),
                          tmp_path / "l", layer_files=True)
    tensors, meta = _safetensors.read(lf)
    meta[key] = value
    _safetensors.write_atomic(lf, _safetensors.to_bytes(tensors, meta))
    out = tmp_path / "x.onnx"
    with pytest.raises(qonnx.OnnxInteropError) as ei:
        qonnx.export(lf, out)
    assert key in str(ei.value) and str(lf) in str(ei.value)
    assert not out.exists()

    tensors["router_correction_bias"] = (np.zeros(E, np.float32), "f32")
    del meta[key]
    _safetensors.write_atomic(lf, _safetensors.to_bytes(tensors, meta))
    with pytest.raises(qonnx.OnnxInteropError, match="router_correction_bias"):
        qonnx.export(lf, out)
    assert not out.exists()


def test_external_data_and_cli(rng, tmp_path):
    m = onnx.load_from_string(build_model(_layer(rng)))
    src = tmp_path / "ext.onnx"
    onnx.save_model(m, str(src), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.bin", size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    run = lambda *a: subprocess.run([sys.executable, "-m", "qmoe.onnx", *map(str, a)],  # noqa
                                    capture_output=True, text=True, env=env, timeout=120)
    r = run("extract", src, "-o", tmp_path / "layers", "--layer-files", "--semantics", "cpu")
    assert r.returncode == 0, r.stderr
    lf = tmp_path / "layers" / "layer_0.safetensors"
    (node,) = qonnx.read_nodes(src, "cpu")  # the API reads the external data too
    tensors, _ = _safetensors.read(lf)
    assert sorted(tensors) == sorted(node["tensors"])
    assert all(tensors[k][0].tobytes() == v[0].tobytes() for k, v in node["tensors"].items())

    r = run("export", lf, "-o", tmp_path / "exp.onnx")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "exp.onnx").exists()

    r = run("extract", src, "-o", tmp_path / "p.safetensors")
    assert r.returncode == 1 and "router_probs" in r.stderr and "node" in r.stderr
    assert not (tmp_path / "p.safetensors").exists()
    r = run("export", tmp_path / "ext.bin", "-o", tmp_path / "x.onnx")
    assert r.returncode == 1 and "ext.bin" in r.stderr
    assert not (tmp_path / "x.onnx").exists()


def test_export_of_a_layer_file_qmoe_wrote(rng, tmp_path, record_max):
    """A layer file from qmoe's C++ writer (every qmoe.* key spelled out) exports as plain ORT
    attributes. Normalized softmax top-k is what ORT CPU's top-k-then-softmax computes."""
    spec = qmoe.make_spec(H, I, E, top_k=K, format="int4", block_size=32, normalize=True,
                          glu="interleaved")
    tensors = {}
    for fc, n, k in (("fc1", 2 * I, H), ("fc2", H, I)):
        w = (rng.standard_normal((E, n, k)) / np.sqrt(k)).astype(np.float32)
        for key, v in qmoe.quantize_fc(w, spec.fc1).items():
            tensors[f"{fc}_{'experts_weights' if key == 'weight' else key}"] = v
    lf = tmp_path / "cpp.safetensors"
    qmoe.save_layer_file(lf, spec, tensors)
    assert "qmoe.routing_method" in _safetensors.read(lf)[1]
    model = qonnx.export(lf, tmp_path / "cpp.onnx")
    x, logits = _inputs(rng)
    y_ort = run_ort(model.read_bytes(), {"input": x, "router_probs": logits})
    e = rel_norm(_qmoe_cpu(lf, x, logits), y_ort)
    record_max("qmoe vs onnxruntime on exported model (f32)", e)
    assert e <= TOL_F32
