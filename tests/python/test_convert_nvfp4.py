"""`qmoe convert --from nvfp4`: ModelOpt NVFP4 checkpoints built here with numpy, converted to
nvfp4, and compared bit for bit with their dequantization.

Layout followed (public): NVIDIA TensorRT Model Optimizer's Hugging Face export (modelopt
torch/export, NVFP4QTensor) as vLLM's and TensorRT-LLM's ModelOpt loaders read it: config.json
quantization_config {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}; per
quantized projection P: P.weight uint8 [N, K/2] (two E2M1 codes a byte, low nibble = even k),
P.weight_scale float8_e4m3fn [N, K/16], P.weight_scale_2 float32 scalar, P.input_scale float32
scalar; W = e2m1(code) * weight_scale * weight_scale_2.
"""

import json

import numpy as np

from ortqmoe import Tagged, read_safetensors, rel_norm
from test_convert import (E, H, I, _expect_failure, check_exact, convert_ok, hf_block,
                          mixtral_config, moe_layers, names, quantized_model, qwen_config,
                          run_model, write_checkpoint)
from test_convert_fp8 import deepseek_block, deepseek_config, e4m3_decode
from test_convert_mxfp4 import FP4

NVFP4_BUDGET = 0.13  # docs/formats.md


def fp4_decode(codes):
    """[..., N, K/2] bytes -> E2M1 values [..., N, K], low nibble first."""
    out = np.empty(codes.shape[:-1] + (2 * codes.shape[-1],))
    out[..., 0::2], out[..., 1::2] = FP4[codes & 15], FP4[codes >> 4]
    return out


def nvfp4_proj(rng, n, k, g):
    """One NVFP4 projection with global scale g: (tensors, exact dequantization f64 [n, k])."""
    codes = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scales = rng.integers(0x28, 0x48, size=(n, k // 16), dtype=np.uint8)  # e4m3 2^-2 .. 2^2
    g = np.float32(g)
    deq = fp4_decode(codes) * np.repeat(e4m3_decode(scales), 16, axis=1) * np.float64(g)
    t = {".weight": codes, ".weight_scale": Tagged("F8_E4M3", scales),
         ".weight_scale_2": np.array(g, np.float32), ".input_scale": np.array(0.25, np.float32)}
    return t, deq


def nvfp4_model(cfg, rng, differ=None):
    """Gate and up of an expert share their global scale (ModelOpt's export for fused gate/up)
    unless (layer, expert) == differ."""
    globals_ = {}

    def proj(r, n, k, at):
        layer, e, i = at
        if i < 2:
            key = (layer, e) if at[:2] != differ else at
            g = globals_.setdefault(key, r.uniform(0.5, 2.0) * 2.0 ** -9)
        else:
            g = r.uniform(0.5, 2.0) * 2.0 ** -9
        return nvfp4_proj(r, n, k, g)

    return quantized_model(cfg, rng, proj, {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                            "group_size": 16, "exclude_modules": ["lm_head"]})


def pack_nvfp4(t, layer, fc, n, k):
    p = f"layers.{layer}."
    codes = t[p + f"fc{fc}_experts_weights"].reshape(-1, n, k // 2)
    s = e4m3_decode(t[p + f"fc{fc}_scales"].reshape(-1, n, k // 16))
    g = t[p + f"fc{fc}_global_scale"].astype(np.float64).reshape(-1, 1, 1)
    return fp4_decode(codes) * np.repeat(s, 16, axis=2) * g


def test_nvfp4_converts_bit_exact(cli, tmp_path, rng):
    for arch in ("qwen3_moe", "mixtral"):
        base = qwen_config() if arch == "qwen3_moe" else mixtral_config()
        cfg, tensors, ref = nvfp4_model(base, rng)
        d = tmp_path / arch
        d.mkdir()
        check_exact(cli, d, rng, cfg, tensors, ref, "nvfp4", False, "F8_E4M3", fc=pack_nvfp4)


def test_nvfp4_deepseek_with_hf_quant_config(cli, tmp_path, rng):
    """An older export (DeepSeek-R1-FP4's layout): no quantization_config in config.json, the
    scheme in hf_quant_config.json. The shared expert (weight 1) is the layer's last expert."""
    cfg, tensors, ref = nvfp4_model(deepseek_config(), rng)
    del cfg["quantization_config"]
    biases, shared = {}, {}
    for layer in moe_layers(cfg):
        biases[layer] = (rng.standard_normal(E) * 0.1).astype(np.float32)
        tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = biases[layer]
        g = rng.uniform(0.5, 2.0) * 2.0 ** -9  # gate and up share it (one FC1 global scale)
        shared[layer] = []
        for name, n, k in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
            t, deq = nvfp4_proj(rng, n, k, g)
            tensors.update({f"model.layers.{layer}.mlp.shared_experts.{name}{s}": v
                            for s, v in t.items()})
            shared[layer].append(deq)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors)
    (tmp_path / "ckpt" / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt", "version": "0.23.0"},
         "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                          "exclude_modules": ["lm_head"]}}))
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "nvfp4")
    assert "exact" in r.stdout and "requantized" not in r.stdout, r.stdout
    t, _ = read_safetensors(out)
    for layer, (router, gate, up, down) in ref.items():
        fc1, fc2 = pack_nvfp4(t, layer, 1, 2 * I, H), pack_nvfp4(t, layer, 2, H, I)
        assert np.array_equal(fc1[:E, 0::2], gate) and np.array_equal(fc1[:E, 1::2], up)
        assert np.array_equal(fc2[:E], down)
        sg, su, sd = shared[layer]
        assert np.array_equal(fc1[E, 0::2], sg) and np.array_equal(fc1[E, 1::2], su)
        assert np.array_equal(fc2[E], sd) and fc1.shape[0] == E + 1
    layer = moe_layers(cfg)[-1]
    router, gate, up, down = ref[layer]
    x = rng.standard_normal((5, H)).astype(np.float32).astype(np.float64)
    want = deepseek_block(cfg, x, router, biases[layer].astype(np.float64), gate, up, down,
                          shared[layer])
    assert rel_norm(run_model(cli, tmp_path, out, layer, x), want) <= 1e-5
    (tmp_path / "ckpt" / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "W4A8_AWQ"}}))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["hf_quant_config.json", "W4A8_AWQ"],
                    frm="nvfp4")


def test_nvfp4_gate_up_global_mismatch_is_requantized(cli, tmp_path, rng):
    cfg, tensors, ref = nvfp4_model(mixtral_config(layers=1), rng, differ=(0, 5))
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "nvfp4")
    assert "requantized 1 expert" in r.stdout and "weight_scale_2" in r.stdout, r.stdout
    t, _ = read_safetensors(out)
    _, gate, up, down = ref[0]
    fc1 = pack_nvfp4(t, 0, 1, 2 * I, H)
    others = [e for e in range(E) if e != 5]
    assert np.array_equal(fc1[others][:, 0::2], gate[others])
    assert np.array_equal(fc1[others][:, 1::2], up[others])
    err = rel_norm(fc1[5][0::2], gate[5])
    assert 0 < err <= NVFP4_BUDGET, err
    assert np.array_equal(pack_nvfp4(t, 0, 2, H, I), down)
    x = rng.standard_normal((4, H)).astype(np.float32).astype(np.float64)
    y = run_model(cli, tmp_path, out, 0, x)
    assert rel_norm(y, hf_block(cfg, x, *ref[0])) <= 2 * NVFP4_BUDGET


def test_nvfp4_hostile(cli, tmp_path, rng):
    cfg, tensors, _ = nvfp4_model(qwen_config(layers=1), rng)
    _, g, _, _ = names(cfg, moe_layers(cfg)[0], 3)
    tensors[g + ".weight_scale_2"] = np.array([0.5, 0.5], np.float32)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2,
                    ["model.safetensors", g + ".weight_scale_2", "one F32"], frm="nvfp4")
    tensors[g + ".weight_scale_2"] = np.array(0.5, np.float32)
    tensors[g + ".weight_scale"] = tensors[g + ".weight_scale"].bits  # U8 where E4M3 belongs
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [g + ".weight_scale", "F8_E4M3"],
                    frm="nvfp4")
    cfg["quantization_config"]["quant_algo"] = "FP8"
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["quant_algo", "FP8"], frm="nvfp4")
