"""`qmoe convert` of Qwen2-MoE, Llama-4, DeepSeek-V3 and gpt-oss float checkpoints written by
transformers, shared experts included:
a tiny, randomly initialised model of each (nothing downloaded) is saved with save_pretrained,
converted, and every MoE layer of the pack, run by `qmoe run --model` on random inputs, is
compared with the transformers MoE block on the same inputs.

Layouts followed (public), as transformers' modeling files define and save them:
- Qwen2-MoE (modeling_qwen2_moe.py): Qwen3-MoE's router and experts (mlp.gate.weight,
  mlp.experts.J.{gate,up,down}_proj.weight) plus mlp.shared_expert.{gate,up,down}_proj.weight of
  shared_expert_intermediate_size rows, added with weight sigmoid(x . mlp.shared_expert_gate.weight).
- Llama-4 (modeling_llama4.py, Llama4TextMoe): feed_forward.router.weight [E, H],
  feed_forward.experts.gate_up_proj [E, H, 2I] (gate columns, then up), down_proj [E, I, H]
  (y = x W), top-k of the logits scaling the expert's input by sigmoid(logit),
  feed_forward.shared_expert.{gate,up,down}_proj.weight added with weight 1; the MoE layers are
  moe_layers (or every interleave_moe_layer_step-th).
- DeepSeek-V3 (modeling_deepseek_v3.py): mlp.gate.weight and mlp.gate.e_score_correction_bias,
  mlp.experts.J.{gate,up,down}_proj.weight, mlp.shared_experts.{gate,up,down}_proj.weight of
  n_shared_experts * moe_intermediate_size rows, added with weight 1.
- gpt-oss unquantized (modeling_gpt_oss.py): mlp.experts.gate_up_proj [E, H, 2I] with gate and up
  columns alternating, gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias [E, H],
  mlp.router.{weight, bias}.

The pack quantizes the experts (int8, blocks of 32): its output must match the block's within
twice the int8 budget, as test_convert's float checkpoints do; a wrong layout (gate and up
swapped, a transposition, a shared slice) is off by O(1). A GPTQ Qwen2-MoE checkpoint built with
test_convert's numpy builders checks the quantized shared expert bit for bit."""

import json

import numpy as np
import pytest

import test_convert as tc
from ortqmoe import bf16, bf16_to_f32, read_safetensors, rel_norm
from test_convert import INT8_BUDGET, _expect_failure, convert_ok, run_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers not installed")

H, I, E = 64, 32, 8
BASE = dict(vocab_size=128, hidden_size=H, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64)


def tiny(kind, layers=3, **extra):
    """(config, model class) of a tiny model whose MoE layers are 1 and 2 (gpt-oss: all)."""
    t, common = transformers, dict(BASE, num_hidden_layers=layers)
    if kind == "qwen2_moe":
        kw = dict(moe_intermediate_size=I, shared_expert_intermediate_size=2 * I,
                  intermediate_size=4 * I, num_experts=E, num_experts_per_tok=2,
                  norm_topk_prob=False, mlp_only_layers=[0])
        kw.update(extra)
        return t.Qwen2MoeConfig(**kw, **common), t.Qwen2MoeForCausalLM
    if kind == "deepseek_v3":
        kw = dict(moe_intermediate_size=I, intermediate_size=4 * I, n_routed_experts=E,
                  n_shared_experts=2, num_experts_per_tok=2, n_group=4, topk_group=2,
                  first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                  q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                  v_head_dim=16)
        kw.update(extra)
        return t.DeepseekV3Config(**kw, **common), t.DeepseekV3ForCausalLM
    if kind == "llama4":
        kw = dict(intermediate_size=I, intermediate_size_mlp=4 * I, num_local_experts=E,
                  num_experts_per_tok=2, head_dim=16, moe_layers=[1, 2])
        kw.update(extra)
        return t.Llama4TextConfig(**kw, **common), t.Llama4ForCausalLM
    return t.GptOssConfig(intermediate_size=I, num_local_experts=E, num_experts_per_tok=2,
                          head_dim=16, sliding_window=8, swiglu_limit=0.5,
                          rope_parameters=dict(rope_type="default", rope_theta=1e4),
                          **common), t.GptOssForCausalLM


def moe_blocks(model):
    """{layer index: MoE block} of a transformers decoder."""
    out = {}
    for i, layer in enumerate(model.model.layers):
        block = getattr(layer, "feed_forward", None) or layer.mlp
        if type(block).__name__ in ("Qwen2MoeSparseMoeBlock", "Llama4TextMoe", "DeepseekV3MoE",
                                    "GptOssMLP"):
            out[i] = block
    return out


@torch.no_grad()
def build(kind, seed, dtype=torch.float32, **extra):
    """A tiny model with visible weights: routers spread so that routing is decided (random init
    leaves near-ties any rounding flips), experts and biases of unit-scale outputs."""
    torch.manual_seed(seed)
    cfg, cls = tiny(kind, **extra)
    model = cls(cfg).eval()
    for block in moe_blocks(model).values():
        for name, p in block.named_parameters():
            routing = name.startswith(("gate.", "router.", "shared_expert_gate."))
            p.normal_(0, 0.5 if routing else 1 / np.sqrt(p.shape[-1] if p.dim() > 1 else H))
        for name, b in block.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.1)
    return model.to(dtype)


def save(model, path):
    model.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg.get("quantization_config") is None
    return cfg


@torch.no_grad()
def block_output(block, x):
    """The block's output on x [T, H] in fp32 (the weights widened exactly from the source)."""
    y = block.float()(torch.from_numpy(x).float()[None])
    return (y[0] if isinstance(y, tuple) else y).reshape(x.shape).double().numpy()


def check_pack(cli, tmp_path, model, pack, rng):
    """Every MoE layer of the pack against the model's block."""
    blocks = moe_blocks(model)
    _, meta = read_safetensors(pack)
    assert meta["qmoe.layers"] == ",".join(map(str, blocks))
    for layer, block in blocks.items():
        x = rng.standard_normal((6, H)).astype(np.float32).astype(np.float64)
        y = run_model(cli, tmp_path, pack, layer, x)
        err = rel_norm(y, block_output(block, x))
        assert err <= 2 * INT8_BUDGET, f"layer {layer}: {err}"
    return meta


def convert_model(cli, tmp_path, kind, seed, src="fp32", **extra):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[src]
    model = build(kind, seed % 2**31, dtype, **extra)
    save(model, tmp_path / "ckpt")
    out = tmp_path / "pack.safetensors"
    r = convert_ok(cli, tmp_path / "ckpt", out, src, "--format", "int8", "--block", "32")
    return model, out, r


@pytest.mark.parametrize("src", ["fp32", "bf16"])
def test_qwen2_moe_shared_expert_split_matches_transformers(cli, tmp_path, rng, seed, src):
    """shared_expert_intermediate_size 2I: two shared experts of I rows, each weighted by
    sigmoid(shared_expert_gate), the gate repeated as their router columns."""
    model, out, _ = convert_model(cli, tmp_path, "qwen2_moe", seed, src)
    meta = check_pack(cli, tmp_path, model, out, rng)
    t, _ = read_safetensors(out)
    for layer, block in moe_blocks(model).items():
        p = f"layers.{layer}."
        assert meta[p + "num_shared_experts"] == "2" and meta[p + "qmoe.shared_weight"] == "sigmoid"
        assert t[p + "fc1_experts_weights"].shape[0] == E + 2
        gate = block.shared_expert_gate.weight.detach().float().numpy()
        router = t[p + "router_weight"]
        assert router.shape == (E + 2, H)
        assert np.array_equal(router[:E], block.gate.weight.detach().float().numpy())
        assert np.array_equal(router[E:], np.repeat(gate, 2, axis=0))


def test_qwen2_moe_shared_expert_of_the_routed_size(cli, tmp_path, rng, seed):
    model, out, _ = convert_model(cli, tmp_path, "qwen2_moe", seed,
                                  shared_expert_intermediate_size=I, norm_topk_prob=True)
    meta = check_pack(cli, tmp_path, model, out, rng)
    assert meta["layers.1.num_shared_experts"] == "1"


@pytest.mark.parametrize("src", ["fp32", "bf16"])
def test_gpt_oss_float_matches_transformers(cli, tmp_path, rng, seed, src):
    model, out, _ = convert_model(cli, tmp_path, "gpt_oss", seed, src)
    meta = check_pack(cli, tmp_path, model, out, rng)
    assert meta["qmoe.converted_from"] == src
    t, _ = read_safetensors(out)
    block = moe_blocks(model)[0]
    assert np.array_equal(t["layers.0.fc1_experts_bias"],
                          block.experts.gate_up_proj_bias.detach().float().numpy())
    assert np.array_equal(t["layers.0.router_bias"], block.router.bias.detach().float().numpy())


def _multimodal(ckpt, text_cfg):
    """The checkpoint as Llama4ForConditionalGeneration stores it: model_type llama4 with the
    decoder's config in text_config and its tensors under language_model."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(ckpt / "model.safetensors"))
    (ckpt / "model.safetensors").unlink()
    save_file({"language_model." + k: v for k, v in tensors.items()},
              str(ckpt / "model.safetensors"), {"format": "pt"})
    (ckpt / "config.json").write_text(json.dumps(
        {"model_type": "llama4", "text_config": text_cfg, "vision_config": {"hidden_size": 32}}))


@pytest.mark.parametrize("src,multimodal", [("fp32", False), ("bf16", False), ("fp32", True)])
def test_llama4_matches_transformers(cli, tmp_path, rng, seed, src, multimodal):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[src]
    model = build("llama4", seed % 2**31, dtype)
    cfg = save(model, tmp_path / "ckpt")
    if multimodal:
        _multimodal(tmp_path / "ckpt", cfg)
    out = tmp_path / "pack.safetensors"
    convert_ok(cli, tmp_path / "ckpt", out, src, "--format", "int8", "--block", "32")
    meta = check_pack(cli, tmp_path, model, out, rng)
    assert meta["qmoe.model_type"] == ("llama4" if multimodal else "llama4_text")
    assert meta["layers.1.qmoe.routing_method"] == "topk_sigmoid"
    assert meta["layers.1.qmoe.combine"] == "input"
    check_weight_one_shared(out, model, 1)


def check_weight_one_shared(pack, model, count):
    """Weight-1 shared experts: the last `count` experts, their router rows zeros."""
    t, meta = read_safetensors(pack)
    for layer, block in moe_blocks(model).items():
        p = f"layers.{layer}."
        assert meta[p + "num_shared_experts"] == str(count)
        assert meta[p + "qmoe.shared_weight"] == "one"
        router = t[p + "router_weight"]
        assert router.shape == (E + count, H) and not router[E:].any()


@pytest.mark.parametrize("src", ["fp32", "bf16"])
def test_deepseek_v3_shared_experts_match_transformers(cli, tmp_path, rng, seed, src):
    """n_shared_experts 2: one shared MLP of 2I rows, held as two weight-1 experts of I rows;
    the correction bias covers the routed experts only."""
    model, out, _ = convert_model(cli, tmp_path, "deepseek_v3", seed, src)
    check_pack(cli, tmp_path, model, out, rng)
    check_weight_one_shared(out, model, 2)
    t, _ = read_safetensors(out)
    assert t["layers.1.router_correction_bias"].shape == (E,)


def test_refusals_name_the_reason(cli, tmp_path, rng, seed):
    # A shared expert that is not a whole number of routed experts.
    model = build("qwen2_moe", seed % 2**31, shared_expert_intermediate_size=I + 16)
    save(model, tmp_path / "ckpt")
    _expect_failure(cli, tmp_path, tmp_path / "ckpt", 4,
                    ["shared_expert_intermediate_size 48", "moe_intermediate_size 32"],
                    frm="fp32")
    # A missing shared-expert tensor is named, with the file.
    ckpt = tmp_path / "ds"
    save(build("deepseek_v3", seed % 2**31), ckpt)
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(ckpt / "model.safetensors"))
    name = "model.layers.2.mlp.shared_experts.down_proj.weight"
    del tensors[name]
    save_file(tensors, str(ckpt / "model.safetensors"), {"format": "pt"})
    _expect_failure(cli, tmp_path, ckpt, 2, ["model.safetensors", name], frm="fp32")
    # Llama-4 is read from float checkpoints only; a missing router is named where
    # llama4_text keeps it.
    ckpt = tmp_path / "l4"
    cfg = save(build("llama4", seed % 2**31), ckpt)
    tensors = load_file(str(ckpt / "model.safetensors"))
    router = tensors.pop("model.layers.2.feed_forward.router.weight")
    save_file(tensors, str(ckpt / "model.safetensors"), {"format": "pt"})
    _expect_failure(cli, tmp_path, ckpt, 2,
                    ["model.safetensors", "'model.layers.2.feed_forward.router.weight'"],
                    frm="fp32")
    tensors["model.layers.2.feed_forward.router.weight"] = router
    save_file(tensors, str(ckpt / "model.safetensors"), {"format": "pt"})
    (ckpt / "config.json").write_text(json.dumps(dict(cfg, quantization_config={
        "quant_method": "fp8", "weight_block_size": [32, 32]})))
    _expect_failure(cli, tmp_path, ckpt, 4, ["llama4_text", "float checkpoints only"], frm="fp8")


def _qwen2_gptq(rng, shared_inter):
    """A Qwen2-MoE GPTQ checkpoint from test_convert's builders (Qwen3's names for the routed
    experts) plus a GPTQ shared expert of `shared_inter` rows and its float gate. Returns (cfg,
    tensors, routed ref as quantized_model's, (gate [1, H], shared gate, up, down) in f64)."""
    cfg, tensors, ref = tc.gptq_model(tc.qwen_config(layers=1, norm=False), rng, 4, 32, False,
                                      True)
    p = "model.layers.0.mlp."
    shared = []
    for name, n, k in (("gate_proj", shared_inter, tc.H), ("up_proj", shared_inter, tc.H),
                       ("down_proj", tc.H, shared_inter)):
        t, deq = tc.gptq_proj(rng, n, k, 4, 32, False, True)
        tensors.update({f"{p}shared_expert.{name}{s}": v for s, v in t.items()})
        shared.append(deq)
    g = bf16(rng.standard_normal((1, tc.H)) * 0.5)
    tensors[p + "shared_expert_gate.weight"] = g
    cfg = dict(cfg, model_type="qwen2_moe", shared_expert_intermediate_size=shared_inter)
    return cfg, tensors, ref, (bf16_to_f32(g.bits).astype(np.float64),) + tuple(shared)


@pytest.mark.parametrize("m", [1, 3])
def test_qwen2_moe_gptq_shared_expert_converts_bit_exact(cli, tmp_path, rng, m):
    """A quantized shared expert of the routed size is transcoded like a routed one; one of m
    times that size is transcoded whole and cut into m experts (FC1 rows, FC2 columns and their
    groups copied): each cut dequantizes bit for bit to its rows and columns of the source."""
    cfg, tensors, ref, (g, sg, su, sd) = _qwen2_gptq(rng, m * tc.I)
    out, t, meta = tc.convert_exact(cli, tmp_path, cfg, tensors, "gptq")
    assert meta["layers.0.num_shared_experts"] == str(m)
    d1 = tc.pack_fc(t, meta, 0, 1, 2 * tc.I, tc.H)
    d2 = tc.pack_fc(t, meta, 0, 2, tc.H, tc.I)
    assert d1.shape[0] == d2.shape[0] == tc.E + m
    for c in range(m):
        rows = slice(c * tc.I, (c + 1) * tc.I)
        assert np.array_equal(d1[tc.E + c, 0::2], sg[rows])
        assert np.array_equal(d1[tc.E + c, 1::2], su[rows])
        assert np.array_equal(d2[tc.E + c], sd[:, rows])
    x = rng.standard_normal((5, tc.H)).astype(np.float32).astype(np.float64)
    want = tc.hf_block(tc.qwen_config(layers=1, norm=False), x, *ref[0])
    h = x @ sg.T
    want += 1 / (1 + np.exp(-(x @ g.T))) * ((h / (1 + np.exp(-h)) * (x @ su.T)) @ sd.T)
    assert rel_norm(run_model(cli, tmp_path, out, 0, x), want) <= 1e-5
