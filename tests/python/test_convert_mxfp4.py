"""`qmoe convert --from mxfp4`: gpt-oss checkpoints built here with numpy, converted to mxfp4, and
compared bit for bit with their dequantization.

Layout followed (public): transformers' modeling_gpt_oss.py and integrations/mxfp4.py
(convert_moe_packed_tensors), as the openai/gpt-oss-20b and -120b checkpoints ship:
config model_type gpt_oss with hidden_size, intermediate_size, num_local_experts,
num_experts_per_tok, swiglu_limit, quantization_config {"quant_method": "mxfp4"}; per layer
model.layers.L.mlp.router.{weight [E, H], bias [E]}, and
mlp.experts.gate_up_proj_blocks uint8 [E, 2I, H/32, 16] (two E2M1 codes a byte, low nibble first),
gate_up_proj_scales uint8 [E, 2I, H/32] (e8m0: 2^(s - 127)), gate_up_proj_bias [E, 2I] (gate and
up interleaved along 2I), down_proj_{blocks,scales,bias} [E, H, I/32, 16], [E, H, I/32], [E, H].
The block: logits = x W^T + b, top-k, softmax over the k; h = fc1 x + b1, g = min(h[0::2], limit),
u = clip(h[1::2], -limit, limit), y = fc2 ((u + 1) * g * sigmoid(1.702 g)) + b2.
"""

import json

import numpy as np
import pytest

from ortqmoe import bf16, bf16_to_f32, rel_norm, run_cli
from test_convert import (E, H, I, K_TOP, _expect_failure, convert_exact, qwen_config,
                          run_model, write_checkpoint)

# E2M1 code -> value (bit 3 the sign), as transformers' FP4_VALUES.
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_decode(blocks, scales):
    """[..., N, K/2] bytes and [..., N, K/32] e8m0 codes -> f64 [..., N, K]."""
    b = np.asarray(blocks, np.uint8)
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],))
    out[..., 0::2] = FP4[b & 15]
    out[..., 1::2] = FP4[b >> 4]
    return out * np.repeat(np.exp2(scales.astype(np.float64) - 127), 32, axis=-1)


def gpt_oss_config(layers=2, limit=7.0):
    return {"model_type": "gpt_oss", "hidden_size": H, "intermediate_size": I,
            "num_local_experts": E, "num_experts_per_tok": K_TOP, "experts_per_token": K_TOP,
            "num_hidden_layers": layers, "swiglu_limit": limit, "hidden_act": "silu",
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"]}}


def fused(rng, n, k):
    """One fused projection of all experts: (blocks, scales, bias Tagged, f64 weights, f64 bias)."""
    blocks = rng.integers(0, 256, size=(E, n, k // 32, 16), dtype=np.uint8)
    scales = rng.integers(120, 125, size=(E, n, k // 32), dtype=np.uint8)
    bias = bf16(rng.standard_normal((E, n)) * 0.1)
    w = mxfp4_decode(blocks.reshape(E, n, k // 2), scales)
    return blocks, scales, bias, w, bf16_to_f32(bias.bits).astype(np.float64)


def gpt_oss_model(cfg, rng):
    tensors, ref = {}, {}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp."
        r, rb = bf16(rng.standard_normal((E, H))), bf16(rng.standard_normal(E) * 0.5)
        tensors[p + "router.weight"], tensors[p + "router.bias"] = r, rb
        f1, f2 = fused(rng, 2 * I, H), fused(rng, H, I)
        for name, f in (("gate_up_proj", f1), ("down_proj", f2)):
            tensors[f"{p}experts.{name}_blocks"] = f[0]
            tensors[f"{p}experts.{name}_scales"] = f[1]
            tensors[f"{p}experts.{name}_bias"] = f[2]
        tensors[f"model.layers.{layer}.self_attn.sinks"] = bf16(rng.standard_normal(4))
        ref[layer] = (bf16_to_f32(r.bits).astype(np.float64),
                      bf16_to_f32(rb.bits).astype(np.float64), f1[3], f1[4], f2[3], f2[4])
    return tensors, ref


def gpt_oss_block(cfg, x, router, router_bias, fc1, b1, fc2, b2):
    logits = x @ router.T + router_bias
    limit = cfg["swiglu_limit"]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        sel = np.argsort(-logits[t], kind="stable")[:K_TOP]
        w = np.exp(logits[t][sel] - logits[t][sel].max())
        w /= w.sum()
        for j, e in zip(sel, w):
            h = fc1[j] @ x[t] + b1[j]
            g, u = np.minimum(h[0::2], limit), np.clip(h[1::2], -limit, limit)
            out[t] += e * (fc2[j] @ ((u + 1) * g / (1 + np.exp(-1.702 * g))) + b2[j])
    return out


@pytest.mark.parametrize("limit", [7.0, 0.5])
def test_gpt_oss_mxfp4_converts_bit_exact(cli, tmp_path, rng, limit):
    cfg = gpt_oss_config(limit=limit)
    tensors, ref = gpt_oss_model(cfg, rng)
    out, t, meta = convert_exact(cli, tmp_path, cfg, tensors, "mxfp4")
    assert meta["qmoe.layers"] == "0,1"
    for layer, (router, rbias, fc1, b1, fc2, b2) in ref.items():
        p = f"layers.{layer}."
        assert meta[p + "quant_type"] == "fp4" and meta[p + "swiglu_fusion"] == "1"
        assert float(meta[p + "activation_alpha"]) == pytest.approx(1.702)
        assert float(meta[p + "swiglu_limit"]) == limit
        got1 = mxfp4_decode(t[p + "fc1_experts_weights"], t[p + "fc1_scales"])
        got2 = mxfp4_decode(t[p + "fc2_experts_weights"], t[p + "fc2_scales"])
        assert np.array_equal(t[p + "fc1_global_scale"], np.ones(E, np.float32))
        assert np.array_equal(got1, fc1), "FC1 differs from gpt-oss's dequantization"
        assert np.array_equal(got2, fc2), "FC2 differs from gpt-oss's dequantization"
        assert np.array_equal(t[p + "fc1_experts_bias"], b1.astype(np.float32))
        assert np.array_equal(t[p + "fc2_experts_bias"], b2.astype(np.float32))
        assert np.array_equal(t[p + "router_bias"], rbias.astype(np.float32))
    x = rng.standard_normal((6, H)).astype(np.float32).astype(np.float64)
    y = run_model(cli, tmp_path, out, 1, x)
    want = gpt_oss_block(cfg, x, *ref[1])
    assert rel_norm(y, want) <= 1e-5, rel_norm(y, want)
    info = run_cli(cli, ["info", out])
    assert info.returncode == 0 and "mxfp4" in info.stdout, info.stdout + info.stderr


def test_gpt_oss_hostile(cli, tmp_path, rng):
    cfg = gpt_oss_config(layers=1)
    tensors, _ = gpt_oss_model(cfg, rng)
    name = "model.layers.0.mlp.experts.down_proj_scales"
    good = tensors[name]
    tensors[name] = good.astype(np.int32)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, ["model.safetensors", name, "U8 [8, 64, 2]",
                                                         "I32"], frm="mxfp4")
    tensors[name] = good
    bias = tensors.pop("model.layers.0.mlp.router.bias")
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, ["model.layers.0.mlp.router.bias"],
                    frm="mxfp4")
    tensors["model.layers.0.mlp.router.bias"] = bias
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    # Without quantization_config the experts are read as floats (test_convert_archs), under
    # their unquantized names.
    (tmp_path / "ckpt" / "config.json").write_text(
        json.dumps({k: v for k, v in cfg.items() if k != "quantization_config"}))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, ["model.layers.0.mlp.experts.gate_up_proj"],
                    frm="bf16")
    # gpt-oss is read from MXFP4 or floats only, and MXFP4 only from gpt-oss.
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(
        cfg, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 32})))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["--from mxfp4", "gpt_oss"], frm="gptq")
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(
        dict(qwen_config(layers=1), quantization_config={"quant_method": "mxfp4"})))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["--from mxfp4", "qwen3_moe"],
                    frm="mxfp4")
