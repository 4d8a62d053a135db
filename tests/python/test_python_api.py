"""The qmoe Python package (python/qmoe): Layer from float weights, ORT tensors and layer files,
against an independent numpy fp64 reference; DLPack exchange with numpy and torch; errors.

Needs the built module: PYTHONPATH=build/python (scripts/test.sh and ctest set it). Without it
these tests skip, unless QMOE_REQUIRE_PYTHON=1 makes that a failure."""

import os

import numpy as np
import pytest

if os.environ.get("QMOE_REQUIRE_PYTHON"):
    import qmoe
else:
    qmoe = pytest.importorskip("qmoe", reason="qmoe Python module not built (PYTHONPATH=build/python)")

H, I, E, K = 128, 64, 8, 2


def _silu(v):
    return v / (1.0 + np.exp(-v))


def numpy_moe(x, logits, w1, w2, top_k, normalize):
    """fp64 reference: softmax over all experts, top-k, optional renormalization; SwiGLU experts
    with FC1 rows [gate; up] (concatenated); y = sum_j w_j * W2_j (silu(g) * u)."""
    x = np.asarray(x, np.float64)
    logits = np.asarray(logits, np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros_like(x)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        idx = np.argsort(-p[t], kind="stable")[:top_k]
        w = p[t, idx]
        if normalize:
            w = w / w.sum()
        for j, e in zip(range(top_k), idx):
            h = w1[e].astype(np.float64) @ x[t]
            a = _silu(h[:inter]) * h[inter:]
            out[t] += w[j] * (w2[e].astype(np.float64) @ a)
    return out


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def make_weights(rng, e=E, h=H, i=I):
    w1 = (rng.standard_normal((e, 2 * i, h)) / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32)
    return w1, w2


def make_inputs(rng, t=5, h=H, e=E):
    return (rng.standard_normal((t, h)).astype(np.float32),
            rng.standard_normal((t, e)).astype(np.float32))


def dequantized(layer_fmt, w):
    q = qmoe.quantize_fc(w, layer_fmt)
    return qmoe.dequantize_fc(q, layer_fmt, *w.shape)


@pytest.mark.parametrize("fmt", ["int8", "int4", "int2", "nvfp4", "mxfp4", "fp8", "fp8_block"])
def test_quantize_roundtrip_within_budget(rng, fmt):
    w = rng.standard_normal((2, 256, 256)).astype(np.float32)
    f = qmoe.fc_format(fmt)
    d = dequantized(f, w)
    assert d.shape == w.shape and d.dtype == np.float32
    err = rel(d, w)
    assert 0 < err <= qmoe.quantization_error_budget(f)


@pytest.mark.parametrize("fmt,block", [("int8", 64), ("int4", 32), ("int4", 0), ("nvfp4", None)])
@pytest.mark.parametrize("normalize", [False, True])
def test_from_float_matches_numpy_fp64(rng, fmt, block, normalize):
    w1, w2 = make_weights(rng)
    layer = qmoe.Layer.from_float(w1, w2, top_k=K, format=fmt, block_size=block,
                                  normalize=normalize)
    x, logits = make_inputs(rng)
    y = layer.run(x, logits)
    assert y.shape == x.shape and y.dtype == np.float32
    f = layer.spec.fc1
    ref = numpy_moe(x, logits, dequantized(f, w1), dequantized(layer.spec.fc2, w2), K, normalize)
    assert rel(y, ref) < 1e-5
    # qmoe's own oracle agrees with the independent one (it routes in fp32, as the backends do).
    assert rel(layer.reference(x, logits), ref) < 1e-6


@pytest.mark.parametrize("rule", ["sigmoid", "one"])
def test_shared_expert_weight_rules(rng, rule):
    # The last expert is shared: always on, outside the softmax, weight sigmoid(logit) or 1.
    w1, w2 = make_weights(rng)
    layer = qmoe.Layer.from_float(w1, w2, top_k=K, format="int8", block_size=64, num_shared=1,
                                  shared_weight=rule)
    assert qmoe.layer_file_metadata(layer.spec)["qmoe.shared_weight"] == rule
    x, logits = make_inputs(rng)
    y = layer.run(x, logits)
    d1, d2 = dequantized(layer.spec.fc1, w1), dequantized(layer.spec.fc2, w2)
    ref = numpy_moe(x, logits[:, :E - 1], d1[:E - 1], d2[:E - 1], K, False)
    shared = numpy_moe(x, np.zeros((x.shape[0], 1)), d1[E - 1:], d2[E - 1:], 1, False)
    gate = 1.0 if rule == "one" else 1.0 / (1.0 + np.exp(-logits[:, E - 1:].astype(np.float64)))
    assert rel(y, ref + gate * shared) < 1e-5


def test_run_with_torch_tensors_and_given_buffers(rng):
    torch = pytest.importorskip("torch")
    w1, w2 = make_weights(rng)
    layer = qmoe.Layer.from_float(torch.from_numpy(w1), torch.from_numpy(w2), top_k=K,
                                  format="int8", block_size=64)
    x, logits = make_inputs(rng, t=3)
    ref = layer.run(x, logits)
    xt, lt = torch.from_numpy(x), torch.from_numpy(logits)
    out = torch.full((3, H), float("nan"))
    ws = torch.empty(layer.workspace_size(3), dtype=torch.uint8)
    got = layer.run(xt, lt, out=out, workspace=ws)
    assert got is out  # written in place through DLPack, no copy
    np.testing.assert_array_equal(out.numpy(), ref)
    # [B, S, H] inputs are T = B * S tokens.
    y3 = layer.run(x.reshape(1, 3, H), logits)
    np.testing.assert_array_equal(y3.reshape(3, H), ref)


def _ort_tensors(rng, fmt, block):
    w1, w2 = make_weights(rng)
    f = qmoe.fc_format(fmt, block)
    tensors = {}
    for prefix, w in (("fc1", w1), ("fc2", w2)):
        for key, v in qmoe.quantize_fc(w, f).items():
            name = {"weight": "experts_weights"}.get(key, key)
            tensors[f"{prefix}_{name}"] = v
    return tensors


def test_from_ort_and_layer_file_agree(rng, tmp_path):
    tensors = _ort_tensors(rng, "int4", 64)
    attrs = {"k": K, "activation_type": "swiglu", "swiglu_fusion": 2,
             "normalize_routing_weights": 1, "expert_weight_bits": 4, "block_size": 64,
             "quant_type": "int"}
    layer = qmoe.Layer.from_ort(attrs, tensors)
    s = layer.spec
    assert (s.hidden, s.inter, s.num_experts, s.routing.top_k) == (H, I, E, K)
    assert s.routing.method == qmoe.RoutingMethod.softmax_topk and s.routing.normalize
    assert s.activation.glu == qmoe.GluLayout.concatenated
    assert s.fc1.format == qmoe.WeightFormat.int4 and s.fc1.block_size == 64
    x, logits = make_inputs(rng)
    y = layer.run(x, logits)
    assert rel(y, layer.reference(x, logits)) < 1e-5

    path = tmp_path / "layer.safetensors"
    qmoe.save_layer_file(path, s, tensors)
    from_file = qmoe.Layer.from_file(path)
    np.testing.assert_array_equal(from_file.run(x, logits), y)
    info = from_file.info(tokens=5)
    assert info["backend"] == "cpu" and info["top_k"] == K and info["workspace_bytes"] > 0


def test_local_expert_shards_sum_to_the_whole_layer(rng, tmp_path):
    """A shard holds experts [first_expert, first_expert + local_experts) and returns its partial
    sum; layer files of the shards, run in turn, add up to the whole layer."""
    tensors = _ort_tensors(rng, "int4", 64)
    attrs = {"k": K, "activation_type": "swiglu", "swiglu_fusion": 2,
             "normalize_routing_weights": 1, "expert_weight_bits": 4, "block_size": 64,
             "quant_type": "int"}
    whole = qmoe.Layer.from_ort(attrs, tensors)
    assert (whole.spec.first_expert, whole.spec.local_experts) == (0, 0)
    x, logits = make_inputs(rng, t=16)
    total = np.zeros((16, H))
    for first, count in ((0, 3), (3, 5)):
        spec = whole.spec
        spec.first_expert, spec.local_experts = first, count
        assert spec.weight_experts == count
        part = {name: (np.ascontiguousarray(arr[first:first + count]), dt)  # (array, dtype)
                for name, (arr, dt) in tensors.items()}
        path = tmp_path / f"shard{first}.safetensors"
        qmoe.save_layer_file(path, spec, part)
        shard = qmoe.Layer.from_file(path)
        assert (shard.spec.num_experts, shard.spec.first_expert) == (E, first)
        y = shard.run(x, logits)
        assert rel(y, shard.reference(x, logits)) < 1e-5
        total += y
    assert rel(total, whole.reference(x, logits)) < 1e-5
    bad = whole.spec
    bad.first_expert, bad.local_experts = 6, 4
    with pytest.raises(qmoe.Error, match="first_expert: expected 0 <= first_expert"):
        bad.check()


def test_spec_objects_and_enums():
    s = qmoe.make_spec(H, I, E, top_k=2, format="int4", block_size=64, routing="topk_softmax",
                       dtype="bf16", n_group=1)
    assert s.routing.method == qmoe.RoutingMethod.topk_softmax
    assert s.act_dtype == qmoe.DType.bf16 and s.fc1_rows == 2 * I and s.slots == 2
    s.routing.top_k = 3  # nested structs are references into the spec
    assert s.routing.top_k == 3
    assert "int4 b64" in repr(s.fc1)
    with pytest.raises(ValueError, match="format: expected one of .*int4"):
        qmoe.fc_format("int5")
    with pytest.raises(qmoe.Error, match=r"k: expected 1 <= k <= 8"):
        qmoe.make_spec(H, I, E, top_k=0)


def test_errors_carry_the_status_text(rng):
    w1, w2 = make_weights(rng)
    layer = qmoe.Layer.from_float(w1, w2, top_k=K, format="int8", block_size=64)
    x, logits = make_inputs(rng)
    with pytest.raises(qmoe.Error, match=r"input: expected shape \[tokens, 128\]"):
        layer.run(x[:, :64].copy(), logits)
    with pytest.raises(qmoe.Error, match=r"router_probs: expected f32 \[5, 8\], got f32 \[5, 4\]"):
        layer.run(x, logits[:, :4].copy())
    with pytest.raises(qmoe.Error, match="input: expected dtype f32 .*got f16"):
        layer.run(x.astype(np.float16), logits)
    with pytest.raises(qmoe.Error, match="input: expected a contiguous"):
        layer.run(np.asfortranarray(x), logits)
    with pytest.raises(qmoe.Error, match="workspace: expected at least"):
        layer.run(x, logits, workspace=np.empty(16, np.uint8))
    with pytest.raises(qmoe.Error, match="unsupported element type"):
        layer.run(x.astype(np.complex64), logits)
    # A missing tensor is named.
    tensors = _ort_tensors(rng, "int4", 64)
    del tensors["fc2_scales"]
    spec = qmoe.make_spec(H, I, E, top_k=K, format="int4", block_size=64)
    with pytest.raises(qmoe.Error, match="fc2_scales"):
        qmoe.Layer(spec, tensors)
    with pytest.raises(qmoe.Error, match="not a layer weight name"):
        qmoe.Layer(spec, {"fc9_weights": np.zeros(4, np.uint8)})
    with pytest.raises(qmoe.Error, match="No such file|cannot open|layer"):
        qmoe.Layer.from_file("/nonexistent/layer.safetensors")
    # The CPU backend has one path: "" is its only dispatch choice.
    layer.force_dispatch("")
    with pytest.raises(qmoe.Error, match="force_dispatch: 'generic' is not a path of this layer"):
        layer.force_dispatch("generic")
    # FP8 activations are a CUDA mode: the CPU backend (the exact one) names the option.
    f1, f2 = make_weights(rng, i=128)
    with pytest.raises(qmoe.Error, match="act_quant"):
        qmoe.Layer.from_float(f1, f2, top_k=K, format="fp8_block", act_quant="fp8_e4m3")


@pytest.mark.skipif(not qmoe.backend_available(qmoe.Backend.cuda),
                    reason="no CUDA device (or a CPU-only build)")
def test_cuda_layer_with_torch_tensors(rng):
    torch = pytest.importorskip("torch")
    w1, w2 = make_weights(rng)
    cpu = qmoe.Layer.from_float(w1, w2, top_k=K, format="int4", block_size=64, dtype="bf16")
    gpu = qmoe.Layer.from_float(w1, w2, top_k=K, format="int4", block_size=64, dtype="bf16",
                                backend="cuda")
    x, logits = make_inputs(rng, t=8)
    xt = torch.from_numpy(x).to(torch.bfloat16)
    lt = torch.from_numpy(logits).to(torch.bfloat16)
    ref = cpu.reference(xt.float().numpy(), lt.float().numpy())
    y = gpu.run(xt.cuda(), lt.cuda())
    assert y.is_cuda and y.dtype == torch.bfloat16
    assert rel(y.float().cpu().numpy(), ref) < 2e-2
    with pytest.raises(qmoe.Error, match="input: expected an array on cuda:0"):
        gpu.run(xt, lt)
    # FP8 activations (fp8_block weights; H and I multiples of 128): within the mode's budget.
    v1, v2 = make_weights(rng, i=128)
    f8 = qmoe.Layer.from_float(v1, v2, top_k=K, format="fp8_block", dtype="bf16",
                               backend="cuda", act_quant="fp8_e4m3")
    f8.force_dispatch("generic")
    ref8 = qmoe.Layer.from_float(v1, v2, top_k=K, format="fp8_block", dtype="bf16")
    x8, l8 = make_inputs(rng, t=40)
    x8t, l8t = torch.from_numpy(x8).to(torch.bfloat16), torch.from_numpy(l8).to(torch.bfloat16)
    want = ref8.reference(x8t.float().numpy(), l8t.float().numpy())
    assert rel(f8.run(x8t.cuda(), l8t.cuda()).float().cpu().numpy(), want) < 6e-2


@pytest.mark.parametrize("num_threads", [1, 0])
def test_threads_share_one_layer(rng, num_threads):
    """Several Python threads run one layer at once (the bindings release the GIL), each call
    with its own workspace; every result equals the sequential one."""
    import threading
    w1, w2 = make_weights(rng)
    layer = qmoe.Layer.from_float(w1, w2, top_k=K, format="int8", block_size=64,
                                  num_threads=num_threads)
    calls = [make_inputs(rng, t=16) for _ in range(4)]
    want = [layer.run(x, logits) for x, logits in calls]
    wrong = []

    def work(i):
        for _ in range(50):
            if not np.array_equal(layer.run(*calls[i]), want[i]):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in 120 s"
    assert wrong == []
