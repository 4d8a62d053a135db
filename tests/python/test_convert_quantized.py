"""`qmoe convert --from awq|compressed-tensors`: quantized checkpoints built here with numpy from
the formats' published layouts, converted, and compared bit for bit with their dequantization.

Layouts followed (public):
- AWQ, AutoAWQ's WQLinear_GEMM (awq/modules/linear/gemm.py, version "gemm") as transformers' AWQ
  integration reads it: qweight int32 [K, N/8], qzeros int32 [K/g, N/8], scales fp16 [K/g, N];
  nibble i (bits [4i, 4i+4)) of word c holds column 8c + o(i), o = (0, 2, 4, 6, 1, 3, 5, 7);
  W[n, k] = (q - z) * s. quantization_config {"quant_method": "awq", "bits": 4, "group_size",
  "zero_point": true, "version": "gemm"}.
- compressed-tensors "pack-quantized" (compressed_tensors/compressors/pack_quantized: pack_to_int32,
  PackedQuantizationCompressor): weight_packed int32 [N, K*b/32] holding the codes q + 2^(b-1) as a
  little-endian bitstream along K, weight_scale [N, K/g] (or [N, 1]), weight_zero_point packed the
  same way along N (int32 [ceil(N*b/32), K/g], asymmetric only), weight_shape int64 [2];
  W = (q - zp) * scale. quantization_config {"quant_method": "compressed-tensors", "format":
  "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {...}}}}.
"""

import json

import numpy as np
import pytest

from ortqmoe import BF16, Tagged, bf16, bf16_to_f32, read_safetensors, rel_norm, run_cli
from test_convert import (E, H, I, _expect_failure, check_exact, convert_ok, hf_block,
                          mixtral_config, moe_layers, names, quantized_model, qwen_config,
                          run_model, write_checkpoint)
from test_convert_fp8 import e4m3_decode, fp8_fc

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def awq_pack(codes):
    """[rows, N] 4-bit codes -> int32 [rows, N/8]: column 8c + AWQ_ORDER[i] in nibble i of word
    c."""
    codes = np.asarray(codes, np.uint32)
    out = np.zeros((codes.shape[0], codes.shape[1] // 8), np.uint32)
    for i, o in enumerate(AWQ_ORDER):
        out |= codes[:, o::8] << np.uint32(4 * i)
    return out.view(np.int32)


def pack_bits(u, bits, axis):
    """compressed-tensors' pack_to_int32 on unsigned codes: a little-endian bitstream along `axis`
    (32/bits codes a word for 4 and 8 bits)."""
    per = 32 // bits
    u = np.moveaxis(np.asarray(u, np.uint32), axis, -1)
    pad = (-u.shape[-1]) % per
    u = np.concatenate([u, np.zeros(u.shape[:-1] + (pad,), np.uint32)], axis=-1)
    u = u.reshape(u.shape[:-1] + (-1, per))
    out = np.zeros(u.shape[:-1], np.uint32)
    for j in range(per):
        out |= u[..., j] << np.uint32(bits * j)
    return np.moveaxis(out, -1, axis).view(np.int32)


def scales_of(rng, shape, dtype):
    s = rng.uniform(0.5, 2.0, size=shape) * 2.0 ** -6
    if dtype == BF16:
        t = bf16(s)
        return t, bf16_to_f32(t.bits).astype(np.float64)
    a = s.astype(dtype)
    return a, a.astype(np.float64)


def awq_proj(rng, n, k, group, scale_dtype=np.float16):
    """One AWQ projection: (tensors by suffix, exact dequantization f64 [n, k])."""
    g = k if group <= 0 else group
    q = rng.integers(0, 16, size=(k, n))
    z = rng.integers(0, 16, size=(k // g, n))
    s, s64 = scales_of(rng, (k // g, n), scale_dtype)
    deq = (q - np.repeat(z, g, axis=0)) * np.repeat(s64, g, axis=0)
    return {".qweight": awq_pack(q), ".qzeros": awq_pack(z), ".scales": s}, deq.T


def ct_proj(rng, n, k, bits, group, sym, scale_dtype=BF16, packed_zp=True):
    """One compressed-tensors pack-quantized projection: (tensors, exact dequantization [n, k])."""
    g = k if group <= 0 else group
    half = 1 << (bits - 1)
    q = rng.integers(-half, half, size=(n, k))  # signed codes, as compressed-tensors quantizes
    zp = np.zeros((n, k // g), np.int64) if sym else rng.integers(-half, half, size=(n, k // g))
    s, s64 = scales_of(rng, (n, k // g), scale_dtype)
    deq = (q - np.repeat(zp, g, axis=1)) * np.repeat(s64, g, axis=1)
    t = {".weight_packed": pack_bits(q + half, bits, 1), ".weight_scale": s,
         ".weight_shape": np.array([n, k], np.int64)}
    if not sym:
        t[".weight_zero_point"] = (pack_bits(zp + half, bits, 0) if packed_zp
                                   else zp.astype(np.int8))
    return t, deq


def awq_config(group):
    return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None}


def ct_config(bits, group, sym):
    w = {"num_bits": bits, "type": "int", "symmetric": sym, "dynamic": False,
         "strategy": "group" if group > 0 else "channel",
         "group_size": group if group > 0 else None,
         "actorder": None, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head", "re:.*mlp.gate$"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                          "input_activations": None, "output_activations": None}}}


# ---------------------------------------------------------------------------------------------
# AWQ
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,group,scale_dtype", [
    ("qwen3_moe", 32, np.float16),
    ("mixtral", 64, np.float16),
    ("qwen3_moe", -1, np.float16),
    ("mixtral", 16, BF16),
])
def test_awq_converts_bit_exact(cli, tmp_path, rng, arch, group, scale_dtype):
    base = qwen_config() if arch == "qwen3_moe" else mixtral_config()
    cfg, tensors, ref = quantized_model(base, rng, lambda r, n, k, _: awq_proj(r, n, k, group,
                                                                            scale_dtype),
                                        awq_config(group))
    want = "F16" if scale_dtype is np.float16 else "BF16"
    t, meta = check_exact(cli, tmp_path, rng, cfg, tensors, ref, "awq", True, want)
    assert int(meta[f"layers.{moe_layers(cfg)[0]}.block_size"]) == max(group, 0)


def test_awq_packer_matches_compressed_tensors_converter(rng):
    """Cross-check of the AWQ layout with compressed-tensors' AutoAWQ converter, where installed."""
    ct = pytest.importorskip("compressed_tensors.entrypoints.convert.converters.autoawq")
    torch = pytest.importorskip("torch")
    q = rng.integers(0, 16, size=(64, 32))
    z = rng.integers(0, 16, size=(2, 32))
    conv = ct.AutoAWQConverter
    iw, iz = conv.unpack_awq(torch.from_numpy(awq_pack(q)), torch.from_numpy(awq_pack(z)), 4)
    iw, iz = conv.reverse_awq_order(iw, iz, 4)
    assert np.array_equal(iw.numpy() & 15, q) and np.array_equal(iz.numpy() & 15, z)


def test_awq_hostile(cli, tmp_path, rng):
    cfg, tensors, _ = quantized_model(qwen_config(layers=1), rng,
                                      lambda r, n, k, _: awq_proj(r, n, k, 32), awq_config(32))
    _, _, up, _ = names(cfg, 0, 4)
    good = tensors[up + ".qzeros"]
    tensors[up + ".qzeros"] = good[:1]  # one group where config.json's 32 needs two
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2,
                    ["model.safetensors", up + ".qzeros", "[2, 8]", "[1, 8]"], frm="awq")
    tensors[up + ".qzeros"] = good
    del tensors[up + ".scales"]
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [up + ".scales", "missing"], frm="awq")
    # The checkpoint is AWQ: another --from is refused, naming the right one.
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, ["--from awq"], frm="gptq")
    for bad, needle in ((dict(version="gemv"), "version"), (dict(zero_point=False), "zero_point"),
                        (dict(bits=3), "bits"), (dict(group_size=48), "group_size")):
        (tmp_path / "ckpt" / "config.json").write_text(
            json.dumps(dict(cfg, quantization_config=dict(awq_config(32), **bad))))
        _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["config.json", needle], frm="awq")


# ---------------------------------------------------------------------------------------------
# compressed-tensors pack-quantized
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,bits,group,sym,scale_dtype,packed_zp", [
    ("qwen3_moe", 4, 32, True, BF16, True),
    ("qwen3_moe", 4, 64, False, BF16, True),
    ("mixtral", 4, -1, False, np.float16, True),
    ("mixtral", 4, 16, False, np.float32, False),
    ("qwen3_moe", 8, -1, True, BF16, True),
    ("mixtral", 8, 32, False, BF16, True),
])
def test_compressed_tensors_converts_bit_exact(cli, tmp_path, rng, arch, bits, group, sym,
                                               scale_dtype, packed_zp):
    base = qwen_config() if arch == "qwen3_moe" else mixtral_config()
    cfg, tensors, ref = quantized_model(
        base, rng, lambda r, n, k, _: ct_proj(r, n, k, bits, group, sym, scale_dtype, packed_zp),
        ct_config(bits, group, sym))
    want = {BF16: "BF16", np.float16: "F16", np.float32: "F32"}[scale_dtype]
    t, meta = check_exact(cli, tmp_path, rng, cfg, tensors, ref, "compressed-tensors", not sym,
                          want)
    layer = moe_layers(cfg)[0]
    assert int(meta[f"layers.{layer}.expert_weight_bits"]) == bits


def test_compressed_tensors_packer_matches_the_package(rng):
    """Cross-check of the packing with compressed-tensors' own pack_to_int32, where installed."""
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    torch = pytest.importorskip("torch")
    for bits in (4, 8):
        half = 1 << (bits - 1)
        q = rng.integers(-half, half, size=(24, 64)).astype(np.int8)
        for axis in (0, 1):
            theirs = helpers.pack_to_int32(torch.from_numpy(q), bits, packed_dim=axis).numpy()
            assert np.array_equal(pack_bits(q.astype(np.int64) + half, bits, axis), theirs)


def test_compressed_tensors_hostile(cli, tmp_path, rng):
    cfg, tensors, _ = quantized_model(qwen_config(layers=1), rng,
                                      lambda r, n, k, _: ct_proj(r, n, k, 4, 32, False),
                                      ct_config(4, 32, False))
    _, _, _, down = names(cfg, 0, 2)
    tensors[down + ".weight_shape"] = np.array([H, I + 8], np.int64)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2,
                    ["model.safetensors", down + ".weight_shape", "[64, 72]"],
                    frm="compressed-tensors")
    tensors[down + ".weight_shape"] = np.array([H, I], np.int32)  # I32 where I64 is written
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [down + ".weight_shape", "I64 [2]"],
                    frm="compressed-tensors")
    tensors[down + ".weight_shape"] = np.array([H, I], np.int64)
    del tensors[down + ".weight_zero_point"]
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [down + ".weight_zero_point", "missing"],
                    frm="compressed-tensors")
    tensors[down + ".weight_zero_point"] = np.full((H, 2), 9, np.int8)  # unpacked, out of range
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2,
                    [down + ".weight_zero_point", "zero point 9"], frm="compressed-tensors")
    q = ct_config(4, 32, False)
    w = q["config_groups"]["group_0"]
    for change, needle in ((dict(format="nvfp4-pack-quantized"), "nvfp4-pack-quantized"),
                           (dict(input_activations={"num_bits": 8}), "input_activations"),
                           (dict(weights=dict(w["weights"], strategy="tensor")), "strategy"),
                           (dict(weights=dict(w["weights"], actorder="group")), "actorder")):
        bad = dict(q, config_groups={"group_0": dict(w, **change)})
        (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg,
                                                                        quantization_config=bad)))
        _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["config.json", needle],
                        frm="compressed-tensors")
    # Two groups with different schemes: refused.
    w2 = dict(w, weights=dict(w["weights"], num_bits=8), targets=["re:.*down_proj"])
    bad = dict(q, config_groups={"group_0": w, "group_1": w2})
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg, quantization_config=bad)))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["group_1", "one scheme"],
                    frm="compressed-tensors")


def test_quantized_sources_refuse_format_options(cli, tmp_path, rng):
    cfg, tensors, _ = quantized_model(qwen_config(layers=1), rng,
                                      lambda r, n, k, _: awq_proj(r, n, k, 32), awq_config(32))
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    r = run_cli(cli, ["convert", "--from", "awq", tmp_path / "ckpt", "-o",
                      tmp_path / "p.safetensors", "--format", "int8"])
    assert r.returncode == 2 and "awq checkpoint keeps its own format" in r.stderr, r.stderr
    assert not (tmp_path / "p.safetensors").exists()


# ---------------------------------------------------------------------------------------------
# compressed-tensors float-quantized (FP8): weight float8_e4m3fn [N, K], weight_scale by strategy
# (compressed_tensors/compressors/float_quantized: "block" [ceil(N/b), ceil(K/b)] with
# block_structure [b, b], "channel" [N, 1], "tensor" [1]); W = weight * weight_scale.
# ---------------------------------------------------------------------------------------------

FP8_BUDGET = 0.035  # docs/formats.md


def ct_fp8_config(strategy, block=None):
    w = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
         "strategy": strategy, "block_structure": [block, block] if block else None}
    a = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                          "input_activations": a}}}


def ct_fp8_model(cfg, rng, strategy, block=None, differ=None):
    """Gate and up of an expert share a tensor scale unless (layer, expert) == differ."""
    shared = {}

    def proj(r, n, k, at):
        codes = r.integers(0, 256, size=(n, k), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x3C
        if strategy == "block":
            s = (r.uniform(0.5, 2.0, ((n + block - 1) // block, (k + block - 1) // block))
                 * 2.0 ** -8).astype(np.float32)
            full = np.repeat(np.repeat(s.astype(np.float64), block, 0), block, 1)[:n, :k]
            stored = s
        elif strategy == "channel":
            stored = bf16(r.uniform(0.5, 2.0, (n, 1)) * 2.0 ** -8)
            full = np.broadcast_to(bf16_to_f32(stored.bits).astype(np.float64), (n, k))
        else:
            key = at[:2] if at[2] < 2 and at[:2] != differ else at
            v = shared.setdefault(key, r.uniform(0.5, 2.0) * 2.0 ** -8)
            stored = np.array([v], np.float32)
            full = np.float64(stored[0])
        deq = e4m3_decode(codes) * full
        return {".weight": Tagged("F8_E4M3", codes), ".weight_scale": stored}, deq

    return quantized_model(cfg, rng, proj, ct_fp8_config(strategy, block))


def fp8_tensor_fc(t, layer, fc, n, k):
    p = f"layers.{layer}."
    codes = t[p + f"fc{fc}_experts_weights"].reshape(E, n, k)
    return e4m3_decode(codes) * t[p + f"fc{fc}_global_scale"].astype(np.float64).reshape(E, 1, 1)


def test_compressed_tensors_fp8_block_converts_bit_exact(cli, tmp_path, rng):
    cfg, tensors, ref = ct_fp8_model(mixtral_config(), rng, "block", 32)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "compressed-tensors")
    assert "exact" in r.stdout, r.stdout
    t, meta = read_safetensors(out)
    for layer, (_, gate, up, down) in ref.items():
        assert meta[f"layers.{layer}.swiglu_fusion"] == "2"
        fc1 = fp8_fc(t, layer, 1, 2 * I, H, 32)
        assert np.array_equal(fc1[:, :I], gate) and np.array_equal(fc1[:, I:], up)
        assert np.array_equal(fp8_fc(t, layer, 2, H, I, 32), down)


def test_compressed_tensors_fp8_tensor_converts_bit_exact(cli, tmp_path, rng):
    cfg, tensors, ref = ct_fp8_model(qwen_config(), rng, "tensor")
    check_exact(cli, tmp_path, rng, cfg, tensors, ref, "compressed-tensors", False, None,
                fc=fp8_tensor_fc)


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
def test_compressed_tensors_fp8_requantized_and_reported(cli, tmp_path, rng, strategy):
    cfg, tensors, ref = ct_fp8_model(qwen_config(layers=1), rng, strategy, differ=(0, 2))
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "compressed-tensors")
    want = "requantized 1 expert" if strategy == "tensor" else f"requantized {E} expert"
    assert want in r.stdout, r.stdout
    t, meta = read_safetensors(out)
    _, gate, up, down = ref[0]
    if strategy == "tensor":
        fc1 = fp8_tensor_fc(t, 0, 1, 2 * I, H)
        others = [e for e in range(E) if e != 2]
        assert np.array_equal(fc1[others][:, 0::2], gate[others])
        assert np.array_equal(fp8_tensor_fc(t, 0, 2, H, I), down)
        # One of the two may come back exact (its amax sets the new global scale); not both.
        err = max(rel_norm(fc1[2][0::2], gate[2]), rel_norm(fc1[2][1::2], up[2]))
    else:
        assert meta["layers.0.quant_type"] == "fp8" and meta["layers.0.block_size"] == "128"
        fc1 = fp8_fc(t, 0, 1, 2 * I, H, 128)
        err = max(rel_norm(fc1[:, 0::2], gate), rel_norm(fp8_fc(t, 0, 2, H, I, 128), down))
    # Requantized values were on another e4m3 grid already: rounding one grid onto another errs
    # more than quantizing floats (docs/formats.md's budget); up to 0.0373 was measured over
    # random fixtures, so the check allows half the budget again.
    assert 0 < err <= 1.5 * FP8_BUDGET, err
    x = rng.standard_normal((4, H)).astype(np.float32).astype(np.float64)
    assert rel_norm(run_model(cli, tmp_path, out, 0, x), hf_block(cfg, x, *ref[0])) <= 0.07


def test_compressed_tensors_fp8_hostile(cli, tmp_path, rng):
    cfg, tensors, _ = ct_fp8_model(qwen_config(layers=1), rng, "tensor")
    _, g, _, _ = names(cfg, 0, 6)
    tensors[g + ".weight_scale"] = np.array([0.5, 0.25], np.float32)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2,
                    ["model.safetensors", g + ".weight_scale", "one F32"], frm="compressed-tensors")
    q = ct_fp8_config("channel")
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
    first = names(cfg, 0, 0)[1] + ".weight_scale"  # the first projection read
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [first, "expected F32 [64, 1]"],
                    frm="compressed-tensors")
    q = ct_fp8_config("block", 48)  # 48 does not divide the expert width 64
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(dict(cfg, quantization_config=q)))
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, ["multiple of the FP8 block 48"],
                    frm="compressed-tensors")
