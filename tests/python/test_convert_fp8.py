"""`qmoe convert --from fp8`: block-scaled FP8 checkpoints (DeepSeek-V3, Qwen3 FP8) built here with
numpy, converted to fp8_block, and compared bit for bit with their dequantization.

Layouts followed (public):
- DeepSeek-V3 (transformers modeling_deepseek_v3.py, DeepSeek-V3's inference/kernel.py
  weight_dequant): config model_type deepseek_v3 with n_routed_experts, num_experts_per_tok,
  n_group, topk_group, routed_scaling_factor, norm_topk_prob, scoring_func "sigmoid", topk_method
  "noaux_tc", n_shared_experts, first_k_dense_replace, moe_layer_freq; tensors
  model.layers.L.mlp.gate.weight [E, H], mlp.gate.e_score_correction_bias [E],
  mlp.experts.J.{gate,up,down}_proj.weight, mlp.shared_experts.{gate,up,down}_proj.weight (of
  n_shared_experts * moe_intermediate_size rows, added with weight 1).
- FP8 weights, quantization_config {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
  "dynamic", "weight_block_size": [b, b]}: weight float8_e4m3fn [N, K], weight_scale_inv float32
  [ceil(N/b), ceil(K/b)], W = weight * weight_scale_inv[n // b, k // b].
- `scale_fmt: "ue8m0"` (transformers' FineGrainedFP8Config, DeepSeek's UE8M0 scales):
  weight_scale_inv float8_e8m0fnu (safetensors F8_E8M0), one unsigned exponent byte e per block,
  the scale 2^(e - 127); 0xFF is NaN.
"""

import json
import math

import numpy as np
import pytest

from ortqmoe import E4M3_VALUES, Tagged, bf16, bf16_to_f32, read_safetensors, rel_norm, run_cli
from test_convert import (E, H, I, K_TOP, _expect_failure, convert_ok, hf_block, moe_layers,
                          qwen_config, run_model, write_checkpoint)


def deepseek_config(layers=3, **extra):
    c = {"model_type": "deepseek_v3", "hidden_size": H, "moe_intermediate_size": I,
         "intermediate_size": 4 * H, "n_routed_experts": E, "num_experts_per_tok": K_TOP,
         "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
         "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_shared_experts": 1,
         "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_hidden_layers": layers,
         "hidden_act": "silu"}
    c.update(extra)
    return c


def e4m3_decode(codes):
    """float8_e4m3fn values of raw codes (the table is checked against torch's dtype below)."""
    return E4M3_VALUES[codes]


def test_e4m3_table_matches_torch():
    torch = pytest.importorskip("torch")
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    theirs = torch.from_numpy(codes).view(torch.float8_e4m3fn).double().numpy()
    assert np.array_equal(e4m3_decode(codes), theirs)


def fp8_proj(rng, n, k, b):
    """One FP8 projection: (tensors by suffix, exact dequantization f64 [n, k])."""
    codes = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes (a quantizer never writes them)
    s = (rng.uniform(0.5, 2.0, size=(math.ceil(n / b), math.ceil(k / b))) * 2.0 ** -8)
    s = s.astype(np.float32)
    deq = e4m3_decode(codes) * np.repeat(np.repeat(s.astype(np.float64), b, 0), b, 1)[:n, :k]
    return {".weight": Tagged("F8_E4M3", codes), ".weight_scale_inv": s}, deq


def e8m0_proj(rng, n, k, b, exponents=(114, 122)):
    """One FP8 projection with E8M0 block scales: (tensors, exact dequantization f64 [n, k])."""
    t, _ = fp8_proj(rng, n, k, b)
    e = rng.integers(*exponents, size=(math.ceil(n / b), math.ceil(k / b)), dtype=np.uint8)
    full = np.repeat(np.repeat(np.ldexp(1.0, e.astype(np.int64) - 127), b, 0), b, 1)[:n, :k]
    return {".weight": t[".weight"], ".weight_scale_inv": Tagged("F8_E8M0", e)}, \
        e4m3_decode(t[".weight"].bits) * full


def fp8_model(cfg, rng, b, proj=fp8_proj, **quant):
    tensors, ref = {}, {}
    deepseek = cfg["model_type"] == "deepseek_v3"
    for layer in moe_layers(cfg):
        p = f"model.layers.{layer}.mlp."
        r = bf16(rng.standard_normal((E, H)))
        tensors[p + "gate.weight"] = r
        bias, shared = None, None
        if deepseek:
            bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
            tensors[p + "gate.e_score_correction_bias"] = bias
            shared = []
            for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                t, deq = proj(rng, *shape, b)
                tensors.update({f"{p}shared_experts.{name}{s}": v for s, v in t.items()})
                shared.append(deq)
        mats = [[], [], []]
        for e in range(E):
            for i, (name, n, k) in enumerate((("gate_proj", I, H), ("up_proj", I, H),
                                              ("down_proj", H, I))):
                t, deq = proj(rng, n, k, b)
                tensors.update({f"{p}experts.{e}.{name}{s}": v for s, v in t.items()})
                mats[i].append(deq)
        ref[layer] = (bf16_to_f32(r.bits).astype(np.float64), bias) + tuple(
            np.stack(m) for m in mats) + (shared,)
    for layer in range(cfg["num_hidden_layers"]):  # dense parts, in FP8 as well
        t, _ = fp8_proj(rng, 4 * H, H, b)
        tensors.update({f"model.layers.{layer}.self_attn.o_proj{s}": v for s, v in t.items()})
    q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": [b, b], **quant}
    return dict(cfg, quantization_config=q), tensors, ref


def swiglu_mlp(x, gate, up, down):
    g = x @ gate.T
    return (g / (1 + np.exp(-g)) * (x @ up.T)) @ down.T


def deepseek_block(cfg, x, router, bias, gate, up, down, shared=None):
    """modeling_deepseek_v3's MoE in f64: noaux_tc grouped top-k over the routed experts, plus
    the shared experts' MLP (gate, up, down) with weight 1 where given."""
    s = 1 / (1 + np.exp(-(x @ router.T)))
    out = np.zeros_like(x)
    groups = cfg["n_group"]
    for t in range(x.shape[0]):
        c = s[t] + bias
        score = np.sort(c.reshape(groups, -1), axis=1)[:, -2:].sum(axis=1)
        keep = np.argsort(-score, kind="stable")[:cfg["topk_group"]]
        masked = np.full_like(c, -np.inf)
        for g in keep:
            span = slice(g * E // groups, (g + 1) * E // groups)
            masked[span] = c[span]
        sel = np.argsort(-masked, kind="stable")[:K_TOP]
        w = s[t][sel]
        if cfg["norm_topk_prob"]:
            w = w / (w.sum() + 1e-20)
        w = w * cfg["routed_scaling_factor"]
        for j, e in zip(sel, w):
            g, u = gate[j] @ x[t], up[j] @ x[t]
            out[t] += e * (down[j] @ (g / (1 + np.exp(-g)) * u))
    return out if shared is None else out + swiglu_mlp(x, *shared)


def fp8_fc(t, layer, fc, n, k, b):
    p = f"layers.{layer}."
    codes = t[p + f"fc{fc}_experts_weights"].reshape(-1, n, k)
    s = t[p + f"fc{fc}_scales"].astype(np.float64)
    assert s.shape == (codes.shape[0], math.ceil(n / b), math.ceil(k / b))
    return E4M3_VALUES[codes] * np.repeat(np.repeat(s, b, 1), b, 2)[:, :n, :k]


@pytest.mark.parametrize("arch,b", [("deepseek_v3", 32), ("deepseek_v3", 16), ("qwen3_moe", 32)])
def test_fp8_converts_bit_exact(cli, tmp_path, rng, arch, b):
    base = deepseek_config() if arch == "deepseek_v3" else qwen_config()
    cfg, tensors, ref = fp8_model(base, rng, b)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "fp8")
    assert "exact" in r.stdout and "requantized" not in r.stdout, r.stdout
    t, meta = read_safetensors(out)
    assert meta["qmoe.layers"] == ",".join(map(str, moe_layers(cfg)))
    for layer, (router, bias, gate, up, down, shared) in ref.items():
        p = f"layers.{layer}."
        assert meta[p + "swiglu_fusion"] == "2", "FC1 must stack [gate; up]"
        assert int(meta[p + "block_size"]) == b
        # DeepSeek-V3's shared expert is the last expert, weight 1: its router row is zeros.
        fc1, fc2 = fp8_fc(t, layer, 1, 2 * I, H, b), fp8_fc(t, layer, 2, H, I, b)
        if shared is not None:
            assert meta[p + "num_shared_experts"] == "1"
            assert meta[p + "qmoe.shared_weight"] == "one"
            assert np.array_equal(fc1[E], np.concatenate(shared[:2])), "shared FC1 differs"
            assert np.array_equal(fc2[E], shared[2]), "shared FC2 differs"
            router = np.concatenate([router, np.zeros((1, H))])
        assert fc1.shape[0] == E + (shared is not None)
        assert np.array_equal(fc1[:E, :I], gate), "gate rows differ from the FP8 dequantization"
        assert np.array_equal(fc1[:E, I:], up), "up rows differ from the FP8 dequantization"
        assert np.array_equal(fc2[:E], down)
        assert np.array_equal(t[p + "router_weight"], router.astype(np.float32))
        if bias is not None:  # the routed experts' only
            assert np.array_equal(t[p + "router_correction_bias"], bias)
            assert meta[p + "qmoe.routing_method"] == "grouped_topk"
    layer = moe_layers(cfg)[-1]
    x = rng.standard_normal((6, H)).astype(np.float32).astype(np.float64)
    y = run_model(cli, tmp_path, out, layer, x)
    if arch == "deepseek_v3":
        want = deepseek_block(cfg, x, *ref[layer])
    else:
        want = hf_block(cfg, x, ref[layer][0], *ref[layer][2:5])
    assert rel_norm(y, want) <= 1e-5, rel_norm(y, want)
    info = run_cli(cli, ["info", out])
    assert info.returncode == 0 and "fp8_block" in info.stdout, info.stdout + info.stderr


def test_deepseek_moe_layers_follow_first_k_dense_and_freq(cli, tmp_path, rng):
    cfg, tensors, _ = fp8_model(deepseek_config(layers=5, first_k_dense_replace=1,
                                                moe_layer_freq=2), rng, 32)
    assert moe_layers(cfg) == [2, 4]
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    convert_ok(cli, tmp_path / "ckpt", out, "fp8")
    _, meta = read_safetensors(out)
    assert meta["qmoe.layers"] == "2,4"
    assert meta["layers.2.qmoe.n_group"] == "4" and meta["layers.2.qmoe.topk_group"] == "2"


def test_fp8_hostile(cli, tmp_path, rng):
    cfg, tensors, _ = fp8_model(deepseek_config(layers=2), rng, 32)
    name = "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv"
    good = tensors[name]
    tensors[name] = good[:, :1]
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, ["model.safetensors", name, "[2, 2]",
                                                         "[2, 1]"], frm="fp8")
    tensors[name] = good
    w = "model.layers.1.mlp.experts.5.up_proj.weight"
    tensors[w] = bf16(rng.standard_normal((I, H)))
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [w, "F8_E4M3"], frm="fp8")
    tensors[w] = fp8_proj(rng, I, H, 32)[0][".weight"]
    b = "model.layers.1.mlp.gate.e_score_correction_bias"
    bias = tensors.pop(b)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [b, "missing"], frm="fp8")
    tensors[b] = bias
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    # Blocks that do not divide the expert width would mix gate and up in one FC1 block.
    q = dict(cfg["quantization_config"], weight_block_size=[48, 48])
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["config.json", "multiple of the FP8"],
                    frm="fp8")
    for change, needle in ((dict(weight_block_size=None), "weight_block_size"),
                           (dict(activation_scheme="static"), "activation_scheme")):
        q = dict(cfg["quantization_config"], **change)
        (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg,
                                                                        quantization_config=q)))
        _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["config.json", needle], frm="fp8")
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg, scoring_func="softmax")))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["scoring_func 'softmax'"], frm="fp8")
    # Two shared experts are one MLP of 2I rows: slicing its FP8 blocks is not supported.
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg, n_shared_experts=2)))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4,
                    ["mlp.shared_experts.", "128 rows", "2 experts of 64", "--from fp8"],
                    frm="fp8")


# ---------------------------------------------------------------------------------------------
# scale_fmt "ue8m0": E8M0 block scales, widened exactly to fp8_block's f32 scales
# ---------------------------------------------------------------------------------------------

def test_fp8_ue8m0_scales_convert_bit_exact(cli, tmp_path, rng):
    b = 32
    cfg, tensors, ref = fp8_model(deepseek_config(), rng, b, proj=e8m0_proj, scale_fmt="ue8m0")
    # The extremes of E8M0 in one expert of the first MoE layer: 2^-127 (an f32 subnormal) and
    # 2^127 (e4m3 values up to 448 times it overflow f32 in a product, so that layer is not run).
    first = moe_layers(cfg)[0]
    extremes = f"model.layers.{first}.mlp.experts.1.down_proj.weight_scale_inv"
    tensors[extremes].bits[0, 0], tensors[extremes].bits[1, 1] = 0, 254
    down = ref[first][4]
    down[1][:b, :b] = e4m3_decode(tensors[extremes.replace("_scale_inv", "")].bits[:b, :b]) \
        * 2.0 ** -127
    down[1][b:2 * b, b:2 * b] = e4m3_decode(
        tensors[extremes.replace("_scale_inv", "")].bits[b:2 * b, b:2 * b]) * 2.0 ** 127
    write_checkpoint(tmp_path / "ckpt", cfg, tensors)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "fp8")
    assert "exact" in r.stdout and "requantized" not in r.stdout, r.stdout
    t, meta = read_safetensors(out)
    for layer, (_, _, gate, up, down, _) in ref.items():
        p = f"layers.{layer}."
        assert t[p + "fc1_scales"].dtype == np.float32
        # Every pack scale is the power of two its exponent byte names, bit for bit.
        e = np.stack([np.concatenate(
            [tensors[f"model.layers.{layer}.mlp.experts.{x}.{n}_proj.weight_scale_inv"].bits
             for n in ("gate", "up")]) for x in range(E)])
        want = np.ldexp(np.float32(1), e.astype(np.int32) - 127)
        assert np.array_equal(t[p + "fc1_scales"][:E], want)  # the routed experts'
        fc1 = fp8_fc(t, layer, 1, 2 * I, H, b)
        assert np.array_equal(fc1[:E, :I], gate) and np.array_equal(fc1[:E, I:], up)
        assert np.array_equal(fp8_fc(t, layer, 2, H, I, b)[:E], down)
    assert t[f"layers.{first}.fc2_scales"][1, 0, 0] == np.float32(2.0 ** -127)
    layer = moe_layers(cfg)[-1]
    x = rng.standard_normal((6, H)).astype(np.float32).astype(np.float64)
    y = run_model(cli, tmp_path, out, layer, x)
    assert rel_norm(y, deepseek_block(cfg, x, *ref[layer])) <= 1e-5


def test_fp8_ue8m0_hostile(cli, tmp_path, rng):
    cfg, tensors, _ = fp8_model(deepseek_config(layers=2), rng, 32, proj=e8m0_proj,
                                scale_fmt="ue8m0")
    name = "model.layers.1.mlp.experts.6.up_proj.weight_scale_inv"
    tensors[name].bits[1, 0] = 0xFF  # E8M0's NaN
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2,
                    ["model.safetensors", name, "[1, 0]", "NaN"], frm="fp8")
    # One projection with f32 scales among E8M0 ones: the first read decides, the rest agree.
    tensors[name] = np.ones((2, 2), np.float32)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [name, "F8_E8M0"], frm="fp8")
    q = dict(cfg["quantization_config"], scale_fmt="ue4m3")
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["config.json", "scale_fmt", "ue4m3"],
                    frm="fp8")
