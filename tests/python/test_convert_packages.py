"""`qmoe convert` against the formats' own Python packages: checkpoints written by the package's
quantizer and packer (where it has one), converted by qmoe, and the pack's dequantization
compared bit for bit with the package's.

- compressed-tensors (PyPI `compressed-tensors`, which needs torch and transformers): scales and
  zero points from calculate_qparams, codes from PackedQuantizationCompressor.compress
  (pack_to_int32) for pack-quantized int4/int8 and FloatQuantizationCompressor for
  float-quantized FP8 blocks, config.json's quantization_config from QuantizationConfig;
  dequantized by the same compressors' decompress.
- DeepSeek-style FP8 with 128 x 128 (here 32 x 32) blocks, `weight_scale_inv`: quantized by
  transformers' Fp8Quantize (integrations/finegrained_fp8.py, the save path of
  FineGrainedFP8Config), dequantized by its Fp8Dequantize (the load path with dequantize=True);
  with scale_fmt "ue8m0" the same quantizer writes E8M0 (power-of-two) scales.
- gpt-oss MXFP4: transformers quantizes MXFP4 only through a hub kernel, so the checkpoint is
  test_convert_mxfp4's (built from the published layout); dequantized by transformers'
  convert_moe_packed_tensors, as transformers loads gpt-oss on hardware without the kernel.

Each package multiplies in its output dtype. Where that product is exact (an integer below 2^8
times a bf16/f16 scale in f32; an E2M1 value times a power of two in bf16) the package's result
must equal the pack's exact dequantization; where it rounds (an e4m3 value times an f32 scale,
in f32) it must equal the pack's exact dequantization rounded once to that dtype. Where the
pack's tensors keep the source's layout, the package's dequantization of the pack's own
tensors must also equal that of the source's.

The packages are optional: each test skips, naming the package, where it is not installed."""

import json
import types

import numpy as np
import pytest

from ortqmoe import Tagged, rel_norm
from test_convert import (E, H, I, check_exact, convert_exact, hf_block, quantized_model,
                          qwen_config, run_model)
from test_convert_fp8 import fp8_fc
from test_convert_mxfp4 import gpt_oss_block, gpt_oss_config, gpt_oss_model, mxfp4_decode

torch = pytest.importorskip("torch")


def _tagged(t):
    """A torch tensor as a checkpoint tensor for ortqmoe's writer (bf16 / fp8 as raw bits)."""
    if t.dtype == torch.bfloat16:
        return Tagged("BF16", t.view(torch.int16).numpy().view(np.uint16))
    if t.dtype == torch.float8_e4m3fn:
        return Tagged("F8_E4M3", t.view(torch.uint8).numpy())
    if t.dtype == torch.float8_e8m0fnu:
        return Tagged("F8_E8M0", t.view(torch.uint8).numpy())
    return t.numpy()


# ---------------------------------------------------------------------------------------------
# compressed-tensors: pack-quantized int4/int8, float-quantized FP8 blocks
# ---------------------------------------------------------------------------------------------

def _ct_checkpoint(rng, compressor, args, fmt, wdtype, ranges):
    """A one-layer Qwen3-MoE checkpoint written by compressed-tensors: each projection's bf16 /
    f16 weight gets its scales from calculate_qparams over ranges(w) (the min and max of each
    group or block) and is compressed by `compressor`. Returns (cfg, tensors, ref, native):
    ref as quantized_model's, dequantized by the package with its scales widened to f32 (its
    formula's exact value: an integer below 2^8 or an e4m3 value times a bf16/f16 scale fits
    f32), native the package's own dequantization in the scale dtype with that exact value."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    native = []

    def proj(r, n, k, _):
        w = torch.from_numpy(r.standard_normal((n, k)) / np.sqrt(k)).to(getattr(torch, wdtype))
        scale, zp = calculate_qparams(*ranges(w), args)
        sd = compressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp},
                                 scheme)
        assert sd["weight_scale"].dtype == w.dtype
        exact = compressor.decompress(dict(sd, weight_scale=sd["weight_scale"].float()),
                                      scheme)["weight"]
        assert exact.dtype == torch.float32
        native.append((compressor.decompress(sd, scheme)["weight"], exact))
        return ({"." + key: _tagged(v) for key, v in sd.items()},
                exact.numpy().astype(np.float64))

    qcfg = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt,
                              quantization_status="compressed",
                              ignore=["lm_head", "re:.*mlp.gate$"])
    quant = json.loads(json.dumps(qcfg.to_dict(), default=str))  # as config.json holds it
    return quantized_model(qwen_config(layers=1), rng, proj, quant) + (native,)


def _check_native(native):
    """The package's own output, in the scale dtype, is the exact value rounded once."""
    for theirs, exact in native:
        assert torch.equal(theirs, exact.to(theirs.dtype))


@pytest.mark.parametrize("bits,group,sym,wdtype", [
    (4, 32, False, "bfloat16"),
    (4, None, True, "bfloat16"),
    (8, 16, False, "float16"),
], ids=["int4_g32_asym_bf16", "int4_channel_sym_bf16", "int8_g16_asym_f16"])
def test_compressed_tensors_package_checkpoint_converts_bit_exact(cli, tmp_path, rng, bits, group,
                                                                  sym, wdtype):
    ct_q = pytest.importorskip("compressed_tensors.quantization")
    ct_pack = pytest.importorskip("compressed_tensors.compressors.pack_quantized.base")
    args = ct_q.QuantizationArgs(num_bits=bits, type="int", symmetric=sym,
                                 strategy="group" if group else "channel", group_size=group)

    def ranges(w):
        g = w.reshape(w.shape[0], -1, group or w.shape[1])
        return g.amin(-1), g.amax(-1)

    cfg, tensors, ref, native = _ct_checkpoint(rng, ct_pack.PackedQuantizationCompressor, args,
                                               "pack-quantized", wdtype, ranges)
    want = "BF16" if wdtype == "bfloat16" else "F16"
    t, meta = check_exact(cli, tmp_path, rng, cfg, tensors, ref, "compressed-tensors", not sym,
                          want)
    assert int(meta["layers.0.expert_weight_bits"]) == bits
    assert int(meta["layers.0.block_size"]) == (group or 0)
    _check_native(native)


def _fp8_pack(t, meta, b):
    """(gate, up, down) of pack layer 0, f64 [E, n, k]: fp8_block, FC1 stacked [gate; up]."""
    assert meta["layers.0.swiglu_fusion"] == "2" and int(meta["layers.0.block_size"]) == b
    fc1 = fp8_fc(t, 0, 1, 2 * I, H, b)
    return fc1[:, :I], fc1[:, I:], fp8_fc(t, 0, 2, H, I, b)


def test_compressed_tensors_fp8_block_package_checkpoint_converts_bit_exact(cli, tmp_path, rng):
    """float-quantized FP8 with block scales, as the package's FloatQuantizationCompressor
    writes it: bf16 weights give bf16 block scales."""
    ct_q = pytest.importorskip("compressed_tensors.quantization")
    ct_fp = pytest.importorskip("compressed_tensors.compressors.naive_quantized.base")
    b = 32
    args = ct_q.QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block",
                                 block_structure=[b, b])

    def ranges(w):
        blocks = w.reshape(w.shape[0] // b, b, w.shape[1] // b, b)
        return blocks.amin((1, 3)), blocks.amax((1, 3))

    cfg, tensors, ref, native = _ct_checkpoint(rng, ct_fp.FloatQuantizationCompressor, args,
                                               "float-quantized", "bfloat16", ranges)
    out, t, meta = convert_exact(cli, tmp_path, cfg, tensors, "compressed-tensors")
    for mine, theirs in zip(_fp8_pack(t, meta, b), ref[0][1:]):
        assert np.array_equal(mine, theirs)
    _check_native(native)
    x = rng.standard_normal((5, H)).astype(np.float32).astype(np.float64)
    assert rel_norm(run_model(cli, tmp_path, out, 0, x), hf_block(cfg, x, *ref[0])) <= 1e-5


# ---------------------------------------------------------------------------------------------
# FP8 with block scales (weight_scale_inv), transformers' FineGrainedFP8
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale_fmt", ["float", "ue8m0"])
def test_fp8_block_checkpoint_from_transformers_converts_bit_exact(cli, tmp_path, rng, scale_fmt):
    """scale_fmt "ue8m0" stores weight_scale_inv as F8_E8M0 (powers of two), which the pack holds
    as f32. An e4m3 value (4 significant bits) times a power of two is exact in bf16, the dtype
    Fp8Dequantize returns for E8M0 scales, and in f32 (away from the subnormal range, as here)."""
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    from transformers import FineGrainedFP8Config
    b = 32
    qcfg = FineGrainedFP8Config(weight_block_size=(b, b), scale_fmt=scale_fmt)
    ue8m0 = scale_fmt == "ue8m0"
    quantize = fp8.Fp8Quantize(types.SimpleNamespace(quantization_config=qcfg))
    dequantize = fp8.Fp8Dequantize(None)
    src = {}  # (layer, expert, projection) -> (fp8 codes, weight_scale_inv) as torch tensors

    def proj(r, n, k, at):
        w = torch.from_numpy(r.standard_normal((n, k)) / np.sqrt(k)).to(torch.bfloat16)
        q = quantize.convert({"p.weight": w})
        src[at] = (q["p.weight"], q["p.weight_scale_inv"])
        assert q["p.weight_scale_inv"].dtype == (torch.float8_e8m0fnu if ue8m0 else torch.float32)
        deq = dequantize.convert({"weight": q["p.weight"],
                                  "weight_scale_inv": q["p.weight_scale_inv"]})["weight"]
        assert deq.dtype == (torch.bfloat16 if ue8m0 else torch.float32)
        return ({".weight": _tagged(q["p.weight"]), ".weight_scale_inv": _tagged(
            q["p.weight_scale_inv"])}, deq.double().numpy())

    # config.json as transformers writes it for this config.
    quant = json.loads(json.dumps(qcfg.to_dict(), default=str))
    cfg, tensors, ref = quantized_model(qwen_config(layers=1), rng, proj, quant)
    out, t, meta = convert_exact(cli, tmp_path, cfg, tensors, "fp8")
    # An e4m3 value times an f32 scale rounds in f32: the package's result is the pack's exact
    # dequantization rounded once (times a power of two: not rounded at all).
    for mine, theirs in zip(_fp8_pack(t, meta, b), ref[0][1:]):
        assert np.array_equal(mine if ue8m0 else mine.astype(np.float32).astype(np.float64),
                              theirs)
    assert t["layers.0.fc1_scales"].dtype == np.float32
    # The pack keeps the codes and scales: the package dequantizes them to the same bits.
    p = "layers.0."
    for fc, n, k, parts in ((1, 2 * I, H, (0, 1)), (2, H, I, (2,))):
        codes = torch.from_numpy(t[p + f"fc{fc}_experts_weights"].reshape(E, n, k))
        scales = torch.from_numpy(t[p + f"fc{fc}_scales"])
        for e in range(E):
            mine = dequantize.convert({"weight": codes[e].view(torch.float8_e4m3fn),
                                       "weight_scale_inv": scales[e]})["weight"]
            theirs = torch.cat([dequantize.convert({"weight": src[(0, e, i)][0],
                                                    "weight_scale_inv": src[(0, e, i)][1]})[
                                                        "weight"] for i in parts])
            assert torch.equal(mine, theirs.float()), (fc, e)
    x = rng.standard_normal((5, H)).astype(np.float32).astype(np.float64)
    assert rel_norm(run_model(cli, tmp_path, out, 0, x), hf_block(cfg, x, *ref[0])) <= 1e-5


# ---------------------------------------------------------------------------------------------
# gpt-oss MXFP4, transformers' convert_moe_packed_tensors
# ---------------------------------------------------------------------------------------------

def test_gpt_oss_mxfp4_matches_transformers_dequantization(cli, tmp_path, rng):
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    cfg = gpt_oss_config(layers=1)
    tensors, ref = gpt_oss_model(cfg, rng)
    out, t, _ = convert_exact(cli, tmp_path, cfg, tensors, "mxfp4")
    src, p = "model.layers.0.mlp.experts.", "layers.0."
    for fc, name, n, k in ((1, "gate_up_proj", 2 * I, H), (2, "down_proj", H, I)):
        # transformers' default dtype bf16 holds every E2M1 value times a power of two exactly;
        # it returns [E, K, N] (the layout gpt-oss multiplies by).
        theirs = mx.convert_moe_packed_tensors(
            torch.from_numpy(tensors[src + name + "_blocks"]),
            torch.from_numpy(tensors[src + name + "_scales"])).transpose(1, 2)
        assert theirs.dtype == torch.bfloat16 and tuple(theirs.shape) == (E, n, k)
        mine = mxfp4_decode(t[p + f"fc{fc}_experts_weights"], t[p + f"fc{fc}_scales"])
        assert np.array_equal(mine, theirs.double().numpy()), f"fc{fc}"
        # The pack's K-packed bytes are the checkpoint's blocks: the package reads them the same.
        again = mx.convert_moe_packed_tensors(
            torch.from_numpy(t[p + f"fc{fc}_experts_weights"].reshape(E, n, k // 32, 16)),
            torch.from_numpy(t[p + f"fc{fc}_scales"].reshape(E, n, k // 32))).transpose(1, 2)
        assert torch.equal(again, theirs), f"fc{fc}"
    x = rng.standard_normal((5, H)).astype(np.float32).astype(np.float64)
    assert rel_norm(run_model(cli, tmp_path, out, 0, x), gpt_oss_block(cfg, x, *ref[0])) <= 1e-5
