"""`qmoe convert`: Hugging Face MoE checkpoints built here with numpy, converted, and checked.

Checkpoint layouts followed (public):
- Hugging Face sharded safetensors: model.safetensors.index.json {"weight_map": {tensor: shard}}.
- Qwen3-MoE (transformers modeling_qwen3_moe.py): model.layers.L.mlp.gate.weight [E, H],
  model.layers.L.mlp.experts.J.{gate,up,down}_proj.weight; config moe_intermediate_size,
  num_experts, num_experts_per_tok, norm_topk_prob, decoder_sparse_step, mlp_only_layers.
- Mixtral (modeling_mixtral.py): model.layers.L.block_sparse_moe.gate.weight,
  ...experts.J.{w1,w3,w2}.weight (w1 gate, w3 up, w2 down); intermediate_size, num_local_experts.
- GPTQ as AutoGPTQ / GPTQModel pack it (QuantLinear.pack) and transformers' GPTQ integration reads
  it: qweight int32 [K/p, N] (p = 32/bits codes per int32, code of row p*r + j in bits
  [bits*j, bits*j + bits) of qweight[r, n]), qzeros int32 [K/g, N/p] packed the same way along N,
  scales fp16 [K/g, N], g_idx int32 [K]; W[n, k] = scales[k/g, n] * (q - zero) with
  zero = stored + 1 for checkpoint_format "gptq" (v1) and zero = stored for "gptq_v2".
"""

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from ortqmoe import _sparse_mixer as sparse_mixer
from ortqmoe import (BF16, bf16, bf16_to_f32, dequantize_int, read_safetensors, rel_norm,
                     run_cli, write_safetensors)

H, I, E, K_TOP = 64, 64, 8, 2
INT4_BUDGET, INT8_BUDGET = 0.15, 0.0088  # README's error budgets (docs/formats.md)


# ---------------------------------------------------------------------------------------------
# Checkpoint builders
# ---------------------------------------------------------------------------------------------

def qwen_config(layers=2, norm=True, **extra):
    c = {"model_type": "qwen3_moe", "hidden_size": H, "moe_intermediate_size": I,
         "intermediate_size": 4 * H, "num_experts": E, "num_experts_per_tok": K_TOP,
         "norm_topk_prob": norm, "num_hidden_layers": layers, "decoder_sparse_step": 1,
         "mlp_only_layers": [], "hidden_act": "silu", "torch_dtype": "bfloat16"}
    c.update(extra)
    return c


def mixtral_config(layers=2, **extra):
    c = {"model_type": "mixtral", "hidden_size": H, "intermediate_size": I,
         "num_local_experts": E, "num_experts_per_tok": K_TOP, "num_hidden_layers": layers,
         "hidden_act": "silu", "torch_dtype": "bfloat16"}
    c.update(extra)
    return c


def phimoe_config(layers=2, **extra):
    """Phi-3.5-MoE (modeling_phimoe.py): Mixtral's names and sizes, the sparse mixer."""
    return mixtral_config(layers, model_type="phimoe", router_jitter_noise=0.01, **extra)


def base_config(arch, **kw):
    return {"qwen3_moe": qwen_config, "mixtral": mixtral_config, "phimoe": phimoe_config}[arch](
        **kw)


def names(cfg, layer, e):
    """Checkpoint prefixes of (router, gate, up, down)."""
    if cfg["model_type"] in ("qwen3_moe", "deepseek_v3"):
        p = f"model.layers.{layer}.mlp."
        ep = f"{p}experts.{e}."
        return p + "gate.weight", ep + "gate_proj", ep + "up_proj", ep + "down_proj"
    p = f"model.layers.{layer}.block_sparse_moe."
    ep = f"{p}experts.{e}."
    return p + "gate.weight", ep + "w1", ep + "w3", ep + "w2"


def moe_layers(cfg):
    if cfg["model_type"] in ("mixtral", "phimoe"):
        return list(range(cfg["num_hidden_layers"]))
    if cfg["model_type"] == "deepseek_v3":
        return [i for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"])
                if i % cfg["moe_layer_freq"] == 0]
    step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers", []))
    return [i for i in range(cfg["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]


def dense_tensors(cfg, rng):
    """Non-MoE tensors a real checkpoint holds, in assorted dtypes (the converter ignores them)."""
    t = {"model.embed_tokens.weight": bf16(rng.standard_normal((32, H))),
         "model.norm.weight": bf16(np.ones(H)),
         "model.rotary_emb.position_ids": np.arange(16, dtype=np.int64),  # I64 metadata
         "lm_head.weight": bf16(rng.standard_normal((32, H)))}
    for layer in range(cfg["num_hidden_layers"]):
        t[f"model.layers.{layer}.self_attn.q_proj.weight"] = bf16(rng.standard_normal((H, H)))
        t[f"model.layers.{layer}.input_layernorm.weight"] = np.ones(H, np.float32)
        if layer not in moe_layers(cfg):
            t[f"model.layers.{layer}.mlp.gate_proj.weight"] = bf16(rng.standard_normal((4 * H, H)))
    return t


def _as(values, dtype):
    """(stored tensor, its exact f64 value) in bf16 (Tagged), fp16 or fp32."""
    if dtype == BF16:
        t = bf16(values)
        return t, bf16_to_f32(t.bits).astype(np.float64)
    a = np.asarray(values).astype(dtype)
    return a, a.astype(np.float64)


def float_model(cfg, rng, dtype=BF16):
    """Float weights: ({tensor: array}, {layer: (router [E, H], gate, up, down as f64 arrays)})."""
    tensors, ref = {}, {}
    for layer in moe_layers(cfg):
        r = bf16(rng.standard_normal((E, H)))
        tensors[names(cfg, layer, 0)[0]] = r
        gates, ups, downs = [], [], []
        for e in range(E):
            _, g, u, d = names(cfg, layer, e)
            for name, shape, out in ((g, (I, H), gates), (u, (I, H), ups), (d, (H, I), downs)):
                w, exact = _as(rng.standard_normal(shape) / math.sqrt(shape[1]), dtype)
                tensors[name + ".weight"] = w
                out.append(exact)
        ref[layer] = (bf16_to_f32(r.bits).astype(np.float64), np.stack(gates), np.stack(ups),
                      np.stack(downs))
    return tensors, ref


def pack_along(codes, bits, axis):
    """GPTQ packing: 32/bits codes per int32 along `axis`, code j in bits [bits*j, bits*j+bits)."""
    per = 32 // bits
    codes = np.moveaxis(np.asarray(codes, np.uint32), axis, 0)
    out = np.zeros((codes.shape[0] // per,) + codes.shape[1:], np.uint32)
    for j in range(per):
        out |= codes[j::per] << np.uint32(bits * j)
    return np.moveaxis(out, 0, axis).view(np.int32)


def gptq_proj(rng, n, k, bits, group, sym, v2, zero_overflow=False, g_idx=None):
    """One GPTQ projection: (tensors by suffix, exact dequantization f64 [n, k]). g_idx: the group
    of each of the K columns (default k // g; act-order permutes it)."""
    g = k if group <= 0 else group
    groups = k // g
    g_idx = (np.arange(k) // g).astype(np.int32) if g_idx is None else g_idx
    top = (1 << bits) - 1
    q = rng.integers(0, top + 1, size=(k, n))
    if sym:
        zero = np.full((groups, n), 1 << (bits - 1))
    else:
        zero = rng.integers(0 if v2 else 1, top + 1, size=(groups, n))
    stored = zero if v2 else zero - 1
    if zero_overflow:  # v1 stores zero 0 as -1, read back as 2^bits: no qmoe format holds it
        stored[0, 0], zero[0, 0] = top, top + 1
    scales = (rng.uniform(0.5, 2.0, size=(groups, n)) * 2.0 ** -6).astype(np.float16)
    deq = (q - zero[g_idx]) * scales.astype(np.float64)[g_idx]
    t = {".qweight": pack_along(q, bits, 0), ".qzeros": pack_along(stored, bits, 1),
         ".scales": scales, ".g_idx": g_idx}
    return t, deq.T


def quantized_model(cfg, rng, proj, quant_config):
    """A bf16 router and every expert projection from `proj(rng, n, k, (layer, expert, i))`
    (i: 0 gate, 1 up, 2 down), which returns (tensors by suffix, exact dequantization [n, k]).
    Returns (cfg with quant_config, tensors, {layer: (router, gate, up, down) as f64})."""
    tensors, ref = {}, {}
    for layer in moe_layers(cfg):
        r = bf16(rng.standard_normal((E, H)))
        tensors[names(cfg, layer, 0)[0]] = r
        mats = [[], [], []]
        for e in range(E):
            _, g, u, d = names(cfg, layer, e)
            for i, (name, n, k) in enumerate(((g, I, H), (u, I, H), (d, H, I))):
                t, deq = proj(rng, n, k, (layer, e, i))
                tensors.update({name + s: v for s, v in t.items()})
                mats[i].append(deq)
        ref[layer] = (bf16_to_f32(r.bits).astype(np.float64),) + tuple(np.stack(m) for m in mats)
    return dict(cfg, quantization_config=quant_config), tensors, ref


def gptq_model(cfg, rng, bits, group, sym, v2, overflow_expert=None):
    over = overflow_expert + (0,) if overflow_expert else None  # that expert's gate_proj
    return quantized_model(
        cfg, rng, lambda r, n, k, at: gptq_proj(r, n, k, bits, group, sym, v2, at == over),
        {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym, "desc_act": False,
         "checkpoint_format": "gptq_v2" if v2 else "gptq"})


def write_checkpoint(path: Path, cfg, tensors, shards=2):
    """config.json plus `shards` safetensors files and their index (one file: model.safetensors)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    items = list(tensors.items())
    if shards == 1:
        write_safetensors(path / "model.safetensors", dict(items), {"format": "pt"})
        return
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = dict(items[s::shards])
        write_safetensors(path / name, part, {"format": "pt"})
        weight_map.update({t: name for t in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def convert(cli, src, out, frm, *flags):
    return run_cli(cli, ["convert", "--from", frm, src, "-o", out, "--threads", 2, *flags])


def convert_ok(cli, src, out, frm, *flags):
    r = convert(cli, src, out, frm, *flags)
    assert r.returncode == 0, f"convert failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def convert_exact(cli, tmp_path, cfg, tensors, frm):
    """Writes the checkpoint, converts it, checks that the summary says exact (nothing
    requantized); returns (pack path, its tensors, its metadata)."""
    write_checkpoint(tmp_path / "ckpt", cfg, tensors)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, frm)
    assert "exact" in r.stdout and "requantized" not in r.stdout, r.stdout
    return (out,) + read_safetensors(out)


# ---------------------------------------------------------------------------------------------
# Reading a pack and the numpy reference of the Hugging Face block
# ---------------------------------------------------------------------------------------------

def pack_fc(tensors, meta, layer, fc, n, k):
    """Dequantizes FC `fc` of a pack layer to f64 [E, n, k] with ortqmoe's independent code."""
    p = f"layers.{layer}."
    bits = int(meta.get(p + f"fc{fc}_expert_weight_bits", meta.get(p + "expert_weight_bits", 4)))
    block = int(meta.get(p + "block_size", 0))
    zp = tensors.get(p + f"fc{fc}_zero_points")
    return dequantize_int(tensors[p + f"fc{fc}_experts_weights"], tensors[p + f"fc{fc}_scales"],
                          zp, bits, block, k).reshape(-1, n, k)


def hf_block(cfg, x, router, gate, up, down):
    """The Hugging Face sparse MoE block in f64: router logits, routing, SwiGLU experts."""
    logits = x @ router.T
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        if cfg["model_type"] == "qwen3_moe":
            p = np.exp(logits[t] - logits[t].max())
            p /= p.sum()
            sel = np.argsort(-p, kind="stable")[:K_TOP]
            w = p[sel]
            if cfg["norm_topk_prob"]:
                w = w / w.sum()
        elif cfg["model_type"] == "phimoe":  # the sparse mixer at inference
            ids, ws = sparse_mixer(logits[t:t + 1], cfg["router_jitter_noise"])
            sel, w = ids[0], ws[0]
        else:  # Mixtral: softmax, top-k, renormalize
            sel = np.argsort(-logits[t], kind="stable")[:K_TOP]
            w = np.exp(logits[t][sel] - logits[t][sel].max())
            w /= w.sum()
        for j, e in zip(sel, w):
            g, u = gate[j] @ x[t], up[j] @ x[t]
            out[t] += e * (down[j] @ (g / (1 + np.exp(-g)) * u))
    return out


def run_model(cli, tmp, pack, layer, x):
    xin, yout = tmp / f"x{layer}.safetensors", tmp / f"y{layer}.safetensors"
    write_safetensors(xin, {"input": x.astype(np.float32)})
    r = run_cli(cli, ["run", "--model", pack, "--layer", layer, "--input", xin, "--output", yout,
                      "--backend", "cpu", "--repeat", 1, "--threads", 2])
    assert r.returncode == 0, f"run --model failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return read_safetensors(yout)[0]["output"].astype(np.float64)


def stored_dtypes(path):
    """{tensor: safetensors dtype name} from a file's header."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return {k: v["dtype"] for k, v in json.loads(blob[8:8 + n]).items() if k != "__metadata__"}


def check_exact(cli, tmp_path, rng, cfg, tensors, ref, frm, zero_points, scale_dtype, fc=None):
    """Converts a quantized checkpoint (with dense tensors added) and checks that every expert
    dequantizes exactly to `ref` and that the pack runs as the Hugging Face block does.
    fc(tensors, layer, fc, n, k) dequantizes an FC of the pack (default: integer formats)."""
    tensors.update(dense_tensors(cfg, rng))
    write_checkpoint(tmp_path / "ckpt", cfg, tensors)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, frm)
    assert "exact" in r.stdout and "requantized" not in r.stdout, r.stdout
    t, meta = read_safetensors(out)
    fc = fc or (lambda t, layer, i, n, k: pack_fc(t, meta, layer, i, n, k))
    assert meta["qmoe.converted_from"] == frm
    assert meta["qmoe.layers"] == ",".join(map(str, moe_layers(cfg)))
    for layer, (router, gate, up, down) in ref.items():
        p = f"layers.{layer}."
        assert (p + "fc1_zero_points" in t) == zero_points
        if scale_dtype:  # None: a format without block scales (fp8)
            assert stored_dtypes(out)[p + "fc1_scales"] == scale_dtype
        fc1 = fc(t, layer, 1, 2 * I, H)
        # FC1 rows interleave gate and up: [g0, u0, g1, u1, ...].
        assert np.array_equal(fc1[:, 0::2], gate), "gate rows differ from the source's dequant"
        assert np.array_equal(fc1[:, 1::2], up), "up rows differ from the source's dequant"
        assert np.array_equal(fc(t, layer, 2, H, I), down), "down rows differ"
        assert np.array_equal(t[p + "router_weight"], router.astype(np.float32))
    # The pack runs: qmoe's output equals the Hugging Face block on the source's weights.
    layer = moe_layers(cfg)[-1]
    x = rng.standard_normal((5, H)).astype(np.float32).astype(np.float64)
    y = run_model(cli, tmp_path, out, layer, x)
    want = hf_block(cfg, x, *ref[layer])
    assert rel_norm(y, want) <= 1e-5, rel_norm(y, want)
    return t, meta


# ---------------------------------------------------------------------------------------------
# GPTQ: exact transcoding
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,bits,group,sym,v2", [
    ("qwen3_moe", 4, 32, True, False),
    ("qwen3_moe", 4, 64, False, False),
    ("qwen3_moe", 4, 32, False, True),
    ("mixtral", 4, -1, False, True),
    ("mixtral", 4, 64, True, True),
    ("qwen3_moe", 8, 32, False, False),
    ("mixtral", 8, -1, True, False),
    ("phimoe", 4, 32, False, True),
])
def test_gptq_converts_bit_exact(cli, tmp_path, rng, arch, bits, group, sym, v2):
    base = base_config(arch)
    cfg, tensors, ref = gptq_model(base, rng, bits, group, sym, v2)
    check_exact(cli, tmp_path, rng, cfg, tensors, ref, "gptq", not sym, "F16")


def test_gptq_v1_zero_overflow_is_requantized_and_reported(cli, tmp_path, rng):
    cfg, tensors, ref = gptq_model(qwen_config(layers=1), rng, 4, 32, False, False,
                                   overflow_expert=(0, 3))
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "gptq")
    assert "requantized 1 expert" in r.stdout, r.stdout
    assert "requantized layer 0 expert 3" in r.stdout, r.stdout
    t, meta = read_safetensors(out)
    _, gate, up, down = ref[0]
    fc1 = pack_fc(t, meta, 0, 1, 2 * I, H)
    others = [e for e in range(E) if e != 3]
    assert np.array_equal(fc1[others][:, 0::2], gate[others])
    err = rel_norm(fc1[3][0::2], gate[3])
    assert 0 < err <= INT4_BUDGET, err
    assert np.array_equal(pack_fc(t, meta, 0, 2, H, I), down)


# ---------------------------------------------------------------------------------------------
# Float checkpoints: quantized with qmoe's quantizers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,src,fmt,flags,budget", [
    ("qwen3_moe", "bf16", "int4", ["--block", "32"], INT4_BUDGET),
    ("mixtral", "bf16", "int8", ["--block", "32", "--zero-points"], INT8_BUDGET),
    ("qwen3_moe", "bf16", "int8", ["--block", "0", "--scale-dtype", "bf16"], INT8_BUDGET),
    ("mixtral", "fp16", "int4", ["--block", "64", "--zero-points", "--fc2-format", "int8",
                            "--fc2-block", "64"],
     INT4_BUDGET),
    ("qwen3_moe", "fp32", "int8", ["--block", "16", "--scale-dtype", "f16"], INT8_BUDGET),
    ("phimoe", "bf16", "int8", ["--block", "32"], INT8_BUDGET),
])
def test_float_quantizes_within_budget(cli, tmp_path, rng, arch, src, fmt, flags, budget):
    base = (qwen_config(layers=3, norm=False, decoder_sparse_step=1, mlp_only_layers=[1])
            if arch == "qwen3_moe" else base_config(arch))
    dtype = {"bf16": BF16, "fp16": np.float16, "fp32": np.float32}[src]
    tensors, ref = float_model(base, rng, dtype)
    tensors.update(dense_tensors(base, rng))
    write_checkpoint(tmp_path / "ckpt", base, tensors, shards=3)
    out = tmp_path / "pack.safetensors"
    convert_ok(cli, tmp_path / "ckpt", out, src, "--format", fmt, *flags)
    t, meta = read_safetensors(out)
    assert meta["qmoe.layers"] == ",".join(map(str, moe_layers(base)))
    for layer, (router, gate, up, down) in ref.items():
        fc1 = pack_fc(t, meta, layer, 1, 2 * I, H)
        for got, want in ((fc1[:, 0::2], gate), (fc1[:, 1::2], up),
                          (pack_fc(t, meta, layer, 2, H, I), down)):
            err = rel_norm(got, want)
            assert err <= budget, f"layer {layer}: {err} > {budget}"
    layer = moe_layers(base)[-1]
    x = rng.standard_normal((6, H)).astype(np.float32).astype(np.float64)
    y = run_model(cli, tmp_path, out, layer, x)
    err = rel_norm(y, hf_block(base, x, *ref[layer]))
    assert err <= 2 * budget, err
    info = run_cli(cli, ["info", out])
    assert info.returncode == 0 and f"fc1 {fmt} " in info.stdout, info.stdout + info.stderr


def test_run_model_synthetic_and_info(cli, tmp_path, rng):
    tensors, _ = float_model(mixtral_config(layers=1), rng)
    write_checkpoint(tmp_path / "ckpt", mixtral_config(layers=1), tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    convert_ok(cli, tmp_path / "ckpt", out, "bf16", "--block", "32")
    r = run_cli(cli, ["run", "--model", out, "--layer", 0, "--tokens", 3, "--backend", "cpu",
                      "--repeat", 1])
    assert r.returncode == 0 and "router logits from the pack" in r.stdout, r.stdout + r.stderr
    r = run_cli(cli, ["run", "--model", out, "--layer", 7])
    assert r.returncode == 2 and "no MoE layer 7" in r.stderr, r.stderr
    r = run_cli(cli, ["info", out])
    assert r.returncode == 0 and "topk_softmax" in r.stdout, r.stdout


def test_pack_opens_with_the_safetensors_package(cli, tmp_path, rng):
    safetensors = pytest.importorskip("safetensors")
    cfg, tensors, _ = gptq_model(qwen_config(layers=1), rng, 4, 64, False, True)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    convert_ok(cli, tmp_path / "ckpt", out, "gptq")
    mine, meta = read_safetensors(out)
    with safetensors.safe_open(str(out), "np") as f:
        assert f.metadata() == meta
        assert sorted(f.keys()) == sorted(mine)
        for name in f.keys():
            assert np.array_equal(f.get_tensor(name), mine[name]), name


# ---------------------------------------------------------------------------------------------
# Hostile checkpoints: a clear error naming the file and the tensor, and nothing written
# ---------------------------------------------------------------------------------------------

def _small_float(tmp_path, rng, shards=2):
    cfg = qwen_config(layers=1)
    tensors, _ = float_model(cfg, rng)
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, cfg, tensors, shards=shards)
    return ckpt, cfg, tensors


def _expect_failure(cli, tmp_path, ckpt, code, needles, frm="bf16"):
    out = tmp_path / "out" / "pack.safetensors"
    out.parent.mkdir(exist_ok=True)
    quantized = frm not in ("bf16", "fp16", "fp32")  # quantized sources keep their format
    r = convert(cli, ckpt, out, frm, *([] if quantized else ["--block", "32"]))
    assert r.returncode == code, f"exit {r.returncode}, expected {code}:\n{r.stdout}\n{r.stderr}"
    for n in needles:
        assert n in r.stderr, f"'{n}' not in: {r.stderr}"
    assert list(out.parent.iterdir()) == [], "a failed conversion left files behind"


def test_hostile_missing_shard(cli, tmp_path, rng):
    ckpt, _, _ = _small_float(tmp_path, rng)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    _expect_failure(cli, tmp_path, ckpt, 3, ["model-00002-of-00002.safetensors", "missing shard"])


def test_hostile_index_points_to_absent_tensor(cli, tmp_path, rng):
    ckpt, _, _ = _small_float(tmp_path, rng)
    idx = json.loads((ckpt / "model.safetensors.index.json").read_text())
    name = "model.layers.0.mlp.experts.5.up_proj.weight"
    other = ("model-00001-of-00002.safetensors" if idx["weight_map"][name].startswith("model-00002")
             else "model-00002-of-00002.safetensors")
    idx["weight_map"][name] = other
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(idx))
    _expect_failure(cli, tmp_path, ckpt, 2, [other, name])


def test_hostile_expert_missing_from_index(cli, tmp_path, rng):
    ckpt, _, _ = _small_float(tmp_path, rng)
    idx = json.loads((ckpt / "model.safetensors.index.json").read_text())
    name = "model.layers.0.mlp.experts.7.gate_proj.weight"
    del idx["weight_map"][name]
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(idx))
    _expect_failure(cli, tmp_path, ckpt, 2, ["model.safetensors.index.json", name])


@pytest.mark.parametrize("kind", ["shape", "dtype"])
def test_hostile_shape_or_dtype_mismatch(cli, tmp_path, rng, kind):
    cfg = qwen_config(layers=1)
    tensors, _ = float_model(cfg, rng)
    name = "model.layers.0.mlp.experts.6.down_proj.weight"
    tensors[name] = (bf16(rng.standard_normal((H, I + 8))) if kind == "shape"
                     else rng.standard_normal((H, I)).astype(np.float32))
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    want = "BF16 [64, 72]" if kind == "shape" else "F32 [64, 64]"
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, ["model.safetensors", name, want])


def test_hostile_wrong_group_size(cli, tmp_path, rng):
    cfg, tensors, _ = gptq_model(qwen_config(layers=1), rng, 4, 32, True, True)
    # Layer 0, expert 1's up_proj quantized with groups of 64 while config.json says 32.
    _, _, up, _ = names(cfg, 0, 1)
    t, _ = gptq_proj(rng, I, H, 4, 64, True, True)
    tensors.update({up + s: v for s, v in t.items()})
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, ["model.safetensors", up + ".scales",
                                                         "[2, 64]", "[1, 64]"], frm="gptq")


def test_hostile_non_finite_weight(cli, tmp_path, rng):
    cfg = qwen_config(layers=1)
    tensors, _ = float_model(cfg, rng)
    name = "model.layers.0.mlp.experts.3.down_proj.weight"
    tensors[name].bits[5, 9] = 0x7FC0  # a bf16 NaN
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [name, "non-finite"])


def test_hostile_truncated_shard(cli, tmp_path, rng):
    ckpt, _, _ = _small_float(tmp_path, rng)
    shard = ckpt / "model-00001-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) - 100])
    _expect_failure(cli, tmp_path, ckpt, 2, ["model-00001-of-00002.safetensors", "tensor '"])


def test_hostile_config_and_arguments(cli, tmp_path, rng):
    ckpt, cfg, _ = _small_float(tmp_path, rng, shards=1)
    # A float checkpoint is not GPTQ.
    _expect_failure(cli, tmp_path, ckpt, 2, ["config.json", "quantization_config"], frm="gptq")
    # The default block (128) does not divide this checkpoint's hidden size: named, before work.
    r = run_cli(cli, ["convert", "--from", "bf16", ckpt, "-o", tmp_path / "p.safetensors"])
    assert r.returncode == 2 and "block" in r.stderr, r.stderr
    # FC blocks a layer's single block_size attribute cannot express: refused before any work.
    r = convert(cli, ckpt, tmp_path / "p.safetensors", "bf16", "--block", "32", "--fc2-block", "64")
    assert r.returncode == 4 and "block" in r.stderr and not (tmp_path / "p.safetensors").exists()
    # An output folder that does not exist is refused before anything is read.
    r = convert(cli, tmp_path / "absent", tmp_path / "no" / "p.safetensors", "bf16")
    assert r.returncode in (2, 3) and "--output" in r.stderr, r.stderr
    # An unknown architecture names model_type.
    (ckpt / "config.json").write_text(json.dumps(dict(cfg, model_type="llama")))
    _expect_failure(cli, tmp_path, ckpt, 4, ["config.json", "model_type 'llama'"])


# ---------------------------------------------------------------------------------------------
# A large synthetic checkpoint for measuring the conversion rate (not a test):
#   python3 tests/python/test_convert.py DIR LAYERS [gptq]  ->  DIR holds a Qwen3-30B-A3B-shaped
#   checkpoint of LAYERS MoE layers, one shard per layer (bf16: 1.2 GB a layer; gptq: int4, groups
#   of 128, asymmetric, gptq_v2, 0.3 GB a layer), then
#   qmoe convert --from bf16|gptq DIR -o pack.safetensors
# ---------------------------------------------------------------------------------------------

def write_large_qwen3(out: Path, layers: int, gptq: bool = False, seed: int = 0):
    import struct
    h, i, e = 2048, 768, 128
    rng = np.random.default_rng(seed)

    def proj(n, k):
        if not gptq:
            return {".weight": bf16(rng.standard_normal((n, k)) / math.sqrt(k))}
        return gptq_proj(rng, n, k, 4, 128, False, True)[0]

    # Eight distinct experts, reused: the converter's work does not depend on the values.
    pool = [[proj(i, h), proj(i, h), proj(h, i)] for _ in range(8)]
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "qwen3_moe", "hidden_size": h, "moe_intermediate_size": i,
           "num_experts": e, "num_experts_per_tok": 8, "norm_topk_prob": True,
           "num_hidden_layers": layers, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "hidden_act": "silu"}
    if gptq:
        cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                      "sym": False, "desc_act": False,
                                      "checkpoint_format": "gptq_v2"}
    (out / "config.json").write_text(json.dumps(cfg))
    st_dtype = {np.dtype(np.uint16): "BF16", np.dtype(np.int32): "I32",
                np.dtype(np.float16): "F16"}
    weight_map = {}
    for layer in range(layers):
        shard = f"model-{layer + 1:05d}-of-{layers:05d}.safetensors"
        items = [(f"model.layers.{layer}.mlp.gate.weight", bf16(rng.standard_normal((e, h))).bits)]
        for j in range(e):
            p = f"model.layers.{layer}.mlp.experts.{j}."
            projs = pool[(j * 7 + layer) % 8]
            for name, tensors in zip(("gate_proj", "up_proj", "down_proj"), projs):
                for suffix, a in tensors.items():
                    if suffix != ".g_idx":
                        items.append((p + name + suffix, a.bits if hasattr(a, "bits") else a))
        header, offset = {}, 0
        for name, a in items:
            header[name] = {"dtype": st_dtype[a.dtype], "shape": list(a.shape),
                            "data_offsets": [offset, offset + a.nbytes]}
            offset += a.nbytes
            weight_map[name] = shard
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(out / shard, "wb") as f:  # streamed: one tensor in memory at a time
            f.write(struct.pack("<Q", len(text)) + text)
            for _, a in items:
                f.write(np.ascontiguousarray(a).tobytes())
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


if __name__ == "__main__":
    import sys
    write_large_qwen3(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["gptq"])
