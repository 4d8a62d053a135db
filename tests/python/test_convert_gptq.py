"""`qmoe convert --from gptq` with act-order (desc_act) checkpoints: built here with numpy,
converted, and checked against GPTQ's dequantization and the float MoE block on those weights.

Layout followed (public): GPTQ as AutoGPTQ / GPTQModel pack it (QuantLinear.pack) and transformers'
GPTQ integration reads it (test_convert.py draws it): qweight int32 [K/p, N] packed along K (code
j of a word in bits [bits*j, bits*j + bits), little end first), qzeros int32 [K/g, N/p] packed
along N, scales fp16 [K/g, N], g_idx int32 [K]; v1 stores zero - 1. With desc_act, GPTQ's
quantizer (AutoGPTQ's GPTQ.fasterquant) visits the columns in the order `perm` of decreasing
Hessian diagonal, cuts that order into groups of g and writes g_idx = (arange(K) // g)[invperm],
so that g_idx[perm[i]] = i // g, the codes staying in the original column order:
W[n, k] = scales[g_idx[k], n] * (q[k, n] - zero[g_idx[k], n]).

qmoe reorders the intermediate index so that down_proj's groups are contiguous (exact; the pack's
FC2 column j is the source's column argsort(g_idx, stable)[j], FC1's rows follow) and requantizes
gate/up when their g_idx permutes the hidden size (the layer input, whose order is fixed).
"""

import json

import numpy as np
import pytest

from ortqmoe import read_safetensors, rel_norm
from test_convert import (E, H, I, INT4_BUDGET, INT8_BUDGET, _expect_failure, convert_ok,
                          dense_tensors, gptq_proj, hf_block, mixtral_config, moe_layers, names,
                          pack_fc, quantized_model, qwen_config, run_model, write_checkpoint)


def act_order_g_idx(rng, k, g):
    """g_idx of a column order `perm` cut into groups of g, as GPTQ's quantizer writes it."""
    perm = rng.permutation(k)
    g_idx = np.empty(k, np.int32)
    g_idx[perm] = np.arange(k) // g
    return g_idx


def act_order_model(cfg, rng, bits, group, sym, v2, fc1_act_order=False, fc2_g_idx=None,
                    overflow=None):
    """A GPTQ desc_act checkpoint. down_proj's g_idx is act-ordered (fc2_g_idx(rng, k, g) when
    given); gate/up's are act-ordered when fc1_act_order, else k // g (static groups). The
    projection at `overflow` ((layer, expert, i)) has a v1 zero of 0, which no qmoe format holds.
    Returns (cfg, tensors, ref, g_idx): g_idx[(layer, expert, i)] of each projection."""
    g_idx = {}

    def proj(r, n, k, at):
        g = k if group <= 0 else group
        if at[2] == 2:
            gi = (fc2_g_idx or act_order_g_idx)(r, k, g)
        elif fc1_act_order:
            gi = act_order_g_idx(r, k, g)
        else:
            gi = (np.arange(k) // g).astype(np.int32)
        g_idx[at] = gi
        return gptq_proj(r, n, k, bits, group, sym, v2, at == overflow, g_idx=gi)

    quant = {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym,
             "desc_act": True, "static_groups": not fc1_act_order,
             "checkpoint_format": "gptq_v2" if v2 else "gptq"}
    cfg, tensors, ref = quantized_model(cfg, rng, proj, quant)
    tensors.update(dense_tensors(cfg, rng))
    return cfg, tensors, ref, g_idx


def reordered(g_idx, layer, e):
    """The pack's order of expert e's intermediate index: FC2 column j is source column p[j]."""
    return np.argsort(g_idx[(layer, e, 2)], kind="stable")


def pack_fcs(t, meta, layer):
    """FC1 split into (gate rows, up rows) and FC2, each [E, n, k] f64."""
    fc1 = pack_fc(t, meta, layer, 1, 2 * I, H)
    return fc1[:, 0::2], fc1[:, 1::2], pack_fc(t, meta, layer, 2, H, I)


@pytest.mark.parametrize("arch,bits,group,sym,v2", [
    ("qwen3_moe", 4, 32, True, False),
    ("qwen3_moe", 4, 64, False, False),
    ("mixtral", 4, 32, False, True),
    ("qwen3_moe", 8, 32, False, True),
    ("mixtral", 8, 32, True, False),
    ("mixtral", 8, 64, True, False),
    ("mixtral", 4, -1, False, True),  # per channel: g_idx all 0
])
def test_gptq_act_order_down_proj_reorders_exactly(cli, tmp_path, rng, arch, bits, group, sym, v2):
    base = qwen_config() if arch == "qwen3_moe" else mixtral_config()
    cfg, tensors, ref, g_idx = act_order_model(base, rng, bits, group, sym, v2)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "gptq")
    assert "exact" in r.stdout and "requantized" not in r.stdout, r.stdout
    several = 0 < group < I  # I = 64: one group of 64 (or per channel) has nothing to reorder
    assert ("reordered" in r.stdout) == several, r.stdout
    t, meta = read_safetensors(out)
    for layer, (_, gate, up, down) in ref.items():
        assert int(meta[f"layers.{layer}.block_size"]) == max(group, 0)
        pg, pu, pd = pack_fcs(t, meta, layer)
        for e in range(E):
            p = reordered(g_idx, layer, e)
            if several:  # the test can fail: a real permutation, different per expert
                assert not np.array_equal(p, np.arange(I))
            # The pack's FC2 groups are contiguous blocks of g: column j of the pack is source
            # column p[j], and FC1's rows follow the same order.
            assert np.array_equal(pd[e], down[e][:, p]), (layer, e)
            assert np.array_equal(pg[e], gate[e][p]), (layer, e)
            assert np.array_equal(pu[e], up[e][p]), (layer, e)
    # The reordered layer computes the same function as the source's float MoE block.
    for layer in moe_layers(cfg):
        x = rng.standard_normal((6, H)).astype(np.float32).astype(np.float64)
        y = run_model(cli, tmp_path, out, layer, x)
        want = hf_block(cfg, x, *ref[layer])
        assert rel_norm(y, want) <= 1e-5, rel_norm(y, want)


@pytest.mark.parametrize("bits,sym,budget", [(4, False, INT4_BUDGET), (8, True, INT8_BUDGET)])
def test_gptq_act_order_gate_up_requantized_and_reported(cli, tmp_path, rng, record_max, bits,
                                                         sym, budget):
    cfg, tensors, ref, g_idx = act_order_model(qwen_config(layers=1), rng, bits, 32, sym, True,
                                               fc1_act_order=True)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "gptq")
    assert f"requantized {E} expert" in r.stdout, r.stdout
    assert "act-order" in r.stdout and "(act-order g_idx)" in r.stdout, r.stdout
    assert "zero points" not in r.stdout, r.stdout  # the only cause here is act-order
    t, meta = read_safetensors(out)
    _, gate, up, down = ref[0]
    pg, pu, pd = pack_fcs(t, meta, 0)
    worst = 0
    for e in range(E):
        p = reordered(g_idx, 0, e)
        assert np.array_equal(pd[e], down[e][:, p]), e  # FC2 still exact
        err = rel_norm(np.stack([pg[e], pu[e]]), np.stack([gate[e][p], up[e][p]]))
        assert 0 < err <= budget, (e, err)
        worst = max(worst, err)
    reported = float(r.stdout.split("worst relative-norm error ")[1].split(";")[0])
    assert abs(worst - reported) <= 1e-3 * reported, (worst, reported)
    record_max(f"gptq act-order int{bits} FC1 requantized", worst)
    x = rng.standard_normal((8, H)).astype(np.float32).astype(np.float64)
    err = rel_norm(run_model(cli, tmp_path, out, 0, x), hf_block(cfg, x, *ref[0]))
    record_max(f"gptq act-order int{bits} layer output", err)
    # The budget bounds weights; the output of a few random experts errs more (up to 0.10 for
    # int4 and 0.0087 for int8 measured over 25 seeds), so it is allowed twice the weight budget.
    assert err <= 2 * budget, err


def test_gptq_act_order_unbalanced_down_proj_groups_are_requantized(cli, tmp_path, rng):
    """A g_idx whose groups are not all of g columns has no contiguous reordering: FC2 is
    requantized (GPTQ's quantizer never writes one; the fallback must still be right)."""
    def unbalanced(r, k, g):
        gi = act_order_g_idx(r, k, g)
        gi[gi == 1] = 0  # group 0 has 2g columns, group 1 none
        return gi

    cfg, tensors, ref, _ = act_order_model(mixtral_config(layers=1), rng, 4, 32, False, True,
                                           fc2_g_idx=unbalanced)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "gptq")
    assert f"requantized {E} expert" in r.stdout and "act-order" in r.stdout, r.stdout
    assert "reordered" not in r.stdout, r.stdout
    t, meta = read_safetensors(out)
    _, gate, up, down = ref[0]
    pg, pu, pd = pack_fcs(t, meta, 0)
    assert np.array_equal(pg, gate) and np.array_equal(pu, up)  # in order, exact
    err = rel_norm(pd, down)
    assert 0 < err <= INT4_BUDGET, err


def test_gptq_act_order_reordered_down_proj_with_a_zero_overflow_is_requantized(cli, tmp_path,
                                                                               rng):
    """An expert whose reordered FC2 has a zero point qmoe cannot hold is requantized from the
    dequantization in the reordered column order, which FC1's rows follow."""
    cfg, tensors, ref, g_idx = act_order_model(qwen_config(layers=1), rng, 4, 32, False, False,
                                               overflow=(0, 2, 2))
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, "gptq")
    assert "requantized 1 expert" in r.stdout and "zero points" in r.stdout, r.stdout
    assert f"act-order: {E} expert(s) had their intermediate index reordered" in r.stdout, r.stdout
    t, meta = read_safetensors(out)
    _, gate, up, down = ref[0]
    pg, pu, pd = pack_fcs(t, meta, 0)
    for e in range(E):
        p = reordered(g_idx, 0, e)
        assert np.array_equal(pg[e], gate[e][p]) and np.array_equal(pu[e], up[e][p]), e
        if e != 2:
            assert np.array_equal(pd[e], down[e][:, p]), e
    err = rel_norm(pd[2], down[2][:, reordered(g_idx, 0, 2)])
    assert 0 < err <= INT4_BUDGET, err
    x = rng.standard_normal((8, H)).astype(np.float32).astype(np.float64)
    assert rel_norm(run_model(cli, tmp_path, out, 0, x), hf_block(cfg, x, *ref[0])) <= INT4_BUDGET


def test_gptq_act_order_hostile(cli, tmp_path, rng):
    cfg, tensors, _, _ = act_order_model(qwen_config(layers=1), rng, 4, 32, False, True)
    _, gate, _, down = names(cfg, 0, 3)
    good = tensors[down + ".g_idx"]
    bad = good.copy()
    bad[5] = 2  # I / 32 = 2 groups: 0 and 1
    tensors[down + ".g_idx"] = bad
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2,
                    ["model.safetensors", down + ".g_idx", "g_idx[5] = 2"], frm="gptq")
    tensors[down + ".g_idx"] = good.astype(np.int64)
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 2, [down + ".g_idx", "expected I32 [64]"],
                    frm="gptq")
    tensors[down + ".g_idx"] = good
    del tensors[gate + ".g_idx"]  # desc_act without the groups: nothing says where they are
    write_checkpoint(tmp_path / "ckpt", cfg, tensors, shards=1)
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4, [gate, "desc_act", "no g_idx"],
                    frm="gptq")
    # Without desc_act, a projection without g_idx has groups k // g.
    cfg["quantization_config"]["desc_act"] = False
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    convert_ok(cli, tmp_path / "ckpt", tmp_path / "pack.safetensors", "gptq")
