"""More transformers MoE models with qmoe blocks: gpt-oss, DeepSeek-V3, GLM-4-MoE, Phi-3.5-MoE,
Llama-4 and Qwen2-MoE, each tiny and randomly initialised from a local config (nothing
downloaded), one MoE layer after a dense one where the model allows it. Logits with qmoe INT8 /
INT4 blocks must match the same model with every quantized weight (routed and shared experts)
replaced by its dequantized value, in plain torch, within test_torch_models' budgets: fp32 and
bf16 on the CPU (measured up to 4e-7 over seeds 0..2 and 7e-3 over 0..5), bf16 on the GPU."""

import copy
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
if os.environ.get("QMOE_REQUIRE_PYTHON"):
    import qmoe
    import qmoe.torch as qt
else:
    qmoe = pytest.importorskip("qmoe",
                               reason="qmoe Python module not built (PYTHONPATH=build/python)")
    import qmoe.torch as qt

from test_torch_models import BUDGET, HAVE_GPU, rel, untied_rel  # noqa: E402

H, I, E = 64, 64, 8
BASE = dict(vocab_size=128, hidden_size=H, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64)
# Every layer of these is an MoE layer (the others have a dense first layer).
ALL_MOE = {"gpt_oss", "phimoe"}


# gpt-oss: swiglu_limit 0.3 (the model has 7) so that the clamps act on these small weights.
def config(kind, layers=2):
    t = transformers
    COMMON = dict(BASE, num_hidden_layers=layers)
    if kind == "gpt_oss":
        return t.GptOssConfig(intermediate_size=I, num_local_experts=E, num_experts_per_tok=2,
                              head_dim=16, sliding_window=8, swiglu_limit=0.3,
                              rope_parameters=dict(rope_type="default", rope_theta=1e4),
                              **COMMON), t.GptOssForCausalLM
    if kind in ("deepseek_v3", "glm4_moe"):
        moe = dict(moe_intermediate_size=I, intermediate_size=2 * I, n_routed_experts=E,
                   n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                   first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5)
        if kind == "glm4_moe":
            return t.Glm4MoeConfig(head_dim=16, **moe, **COMMON), t.Glm4MoeForCausalLM
        return t.DeepseekV3Config(q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=8,
                                  qk_nope_head_dim=8, v_head_dim=16, **moe, **COMMON), \
            t.DeepseekV3ForCausalLM
    if kind == "phimoe":
        return t.PhimoeConfig(intermediate_size=I, num_local_experts=E, num_experts_per_tok=2,
                              **COMMON), t.PhimoeForCausalLM
    if kind == "llama4":
        return t.Llama4TextConfig(intermediate_size=I, intermediate_size_mlp=2 * I,
                                  num_local_experts=E, num_experts_per_tok=1, head_dim=16,
                                  moe_layers=[1], **COMMON), t.Llama4ForCausalLM
    return t.Qwen2MoeConfig(moe_intermediate_size=I, shared_expert_intermediate_size=2 * I,
                            intermediate_size=2 * I, num_experts=E, num_experts_per_tok=2,
                            mlp_only_layers=[0], **COMMON), t.Qwen2MoeForCausalLM


KINDS = ["gpt_oss", "deepseek_v3", "glm4_moe", "phimoe", "llama4", "qwen2_moe"]
# Expert weights stored y = x W (the input dimension first): quantized along it, so the reference
# dequantizes their transpose.
TRANSPOSED = {"GptOssMLP", "Llama4TextMoe"}


def spread(block):
    """Spreads a block's router (random init leaves near-ties that any rounding flips) and gives
    its experts, their biases and DeepSeek's correction bias visible values."""
    for pname, p in block.named_parameters():
        p.normal_(0, 0.05 if "experts" in pname or "shared" in pname else 0.5)
    for bname, b in block.named_buffers():
        if bname.endswith("e_score_correction_bias"):
            b.normal_(0, 0.1)


def adapted_blocks(model):
    return [m for m in model.modules() if type(m).__name__ in qt.ADAPTERS]


def build(kind, seed, layers=2):
    torch.manual_seed(seed)
    cfg, cls = config(kind, layers)
    model = cls(cfg).eval()
    with torch.no_grad():
        for block in adapted_blocks(model):
            spread(block)
    return model


def _dequantize(p, f, transposed):
    w = p.detach().float().cpu()
    w = w.transpose(-1, -2) if transposed else w
    w3 = w if w.dim() == 3 else w[None]
    d = torch.from_numpy(qmoe.dequantize_fc(qmoe.quantize_fc(w3.numpy(), f), f, *w3.shape))
    d = d.reshape(w.shape)
    p.copy_(d.transpose(-1, -2) if transposed else d)


def dequantize_block(block, f):
    """Replaces every weight qmoe quantizes by dequant(quant(w)): the fused routed experts and
    the shared-expert MLPs (biases and routers stay as they are)."""
    transposed = type(block).__name__ in TRANSPOSED
    for pname in ("gate_up_proj", "down_proj"):
        _dequantize(getattr(block.experts, pname), f, transposed)
    for attr in ("shared_expert", "shared_experts"):
        mlp = getattr(block, attr, None)
        for lin in ("gate_proj", "up_proj", "down_proj") if mlp is not None else ():
            _dequantize(getattr(mlp, lin).weight, f, False)


def dequantize_experts(model, fmt, block_size):
    """A copy of the model with every adapted block dequantized (the reference)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for block in adapted_blocks(ref):
            dequantize_block(block, qmoe.fc_format(fmt, block_size))
    return ref


def quantized_vs_dequantized(model, fmt, block, ids, untie=False):
    """rel. error of the logits of `model` with qmoe blocks against its dequantized copy; with
    `untie`, over the tokens whose routing has no exact tie (untied_rel: bf16 logits)."""
    ref = dequantize_experts(model, fmt, block)
    names = qt.replace_moe_blocks(model, format=fmt, block_size=block)
    assert names and all(isinstance(model.get_submodule(n), qt.QMoEBlock) for n in names)
    return untied_rel(model, ref, ids) if untie else rel(model(ids).logits, ref(ids).logits)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt,block", [("int8", 64), ("int4", 32)])
@torch.no_grad()
def test_tiny_model_cpu_fp32(seed, kind, fmt, block):
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(seed % 2**31))
    assert quantized_vs_dequantized(build(kind, seed % 2**31), fmt, block, ids) < \
        BUDGET[torch.float32]


# kind -> (shared experts the layer holds (the shared MLP of S = m * I rows cut into m), weight)
FOLDED = {"deepseek_v3": (1, qmoe.SharedWeight.one), "glm4_moe": (1, qmoe.SharedWeight.one),
          "llama4": (1, qmoe.SharedWeight.one), "qwen2_moe": (2, qmoe.SharedWeight.sigmoid)}


@pytest.mark.parametrize("kind", sorted(FOLDED))
@torch.no_grad()
def test_shared_experts_join_the_routed_layer(seed, kind):
    """One qmoe call per block: the shared MLP is the layer's last m experts (the other tests
    check its numbers). Where cutting it would change FC2's quantization groups (one group per
    row, m > 1), it stays a second layer, checked here against the dequantized model."""
    m, rule = FOLDED[kind]
    model = build(kind, 0)
    qt.replace_moe_blocks(model, format="int4", block_size=32)
    for b in (b for b in model.modules() if isinstance(b, qt.QMoEBlock)):
        r = b.moe.layer.spec.routing
        assert b.shared is None and b.shared_columns == m
        assert (r.num_shared, r.shared_weight, b.moe.layer.spec.num_experts) == (m, rule, E + m)
    model = build(kind, seed % 2**31)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(seed % 2**31))
    assert quantized_vs_dequantized(model, "int8", 0, ids) < BUDGET[torch.float32]
    for b in (b for b in model.modules() if isinstance(b, qt.QMoEBlock)):
        assert (b.shared is None) == (m == 1)


@pytest.mark.parametrize("kind", ["gpt_oss", "deepseek_v3", "llama4"])
@torch.no_grad()
def test_quantization_is_visible(seed, kind):
    """The comparison can fail: against the unquantized model, INT4 logits differ measurably."""
    model = build(kind, seed % 2**31)
    ref = copy.deepcopy(model)
    qt.replace_moe_blocks(model, format="int4", block_size=32)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(seed % 2**31))
    assert rel(model(ids).logits, ref(ids).logits) > 10 * BUDGET[torch.float32]


def bf16_model(kind, seed):
    """One MoE layer (the last): its inputs are then the same bits on both sides (see
    test_torch_models). Both sides quantize the same bf16 weights."""
    return build(kind, seed % 2**31, 1 if kind in ALL_MOE else 2).to(torch.bfloat16)


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_tiny_model_cpu_bf16(seed, kind):
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(seed % 2**31))
    assert quantized_vs_dequantized(bf16_model(kind, seed), "int4", 32, ids, untie=True) < \
        BUDGET[torch.bfloat16]


@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device and a CUDA build of qmoe")
@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_tiny_model_gpu_bf16(seed, kind):
    ids = torch.randint(0, 128, (1, 16), device="cuda")
    assert quantized_vs_dequantized(bf16_model(kind, seed).cuda(), "int4", 32, ids,
                                    untie=True) < BUDGET[torch.bfloat16]


# Blocks transformers defines as one of the above under another name (a subclass adding nothing
# or the same code): block name -> (model module, config class).
SAME_BLOCKS = {
    "FlexOlmoSparseMoeBlock": ("flex_olmo", "FlexOlmoConfig"),
    "Qwen3VLMoeTextSparseMoeBlock": ("qwen3_vl_moe", "Qwen3VLMoeTextConfig"),
    "Qwen3OmniMoeThinkerTextSparseMoeBlock": ("qwen3_omni_moe", "Qwen3OmniMoeTextConfig"),
    "Qwen3NextSparseMoeBlock": ("qwen3_next", "Qwen3NextConfig"),
    "Dots1MoE": ("dots1", "Dots1Config"),
    "Glm4MoeLiteMoE": ("glm4_moe_lite", "Glm4MoeLiteConfig"),
    "Glm4vMoeTextMoE": ("glm4v_moe", "Glm4vMoeTextConfig"),
    "SolarOpenMoE": ("solar_open", "SolarOpenConfig"),
    "MiniMaxSparseMoeBlock": ("minimax", "MiniMaxConfig"),
}


@pytest.mark.parametrize("name", sorted(SAME_BLOCKS))
@torch.no_grad()
def test_same_block_families_cpu_fp32(seed, name):
    """Block level: each config class names its fields its own way, so every spelling is given
    (a config keeps the ones it does not know as plain attributes)."""
    import importlib
    mod, cfg_name = SAME_BLOCKS[name]
    modeling = importlib.import_module(f"transformers.models.{mod}.modeling_{mod}")
    config_mod = importlib.import_module(f"transformers.models.{mod}.configuration_{mod}")
    n = dict(num_experts=E, num_local_experts=E, n_routed_experts=E)
    i = dict(moe_intermediate_size=I, intermediate_size=I, shared_expert_intermediate_size=2 * I)
    cfg = getattr(config_mod, cfg_name)(hidden_size=H, num_experts_per_tok=2, n_shared_experts=1,
                                        n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                        hidden_act="silu", **n, **i)
    torch.manual_seed(seed % 2**31)
    block = getattr(modeling, name)(cfg).eval()
    spread(block)
    x = torch.randn(2, 10, H)
    for fmt, bs in (("int8", 64), ("int4", 32)):
        ref = copy.deepcopy(block)
        dequantize_block(ref, qmoe.fc_format(fmt, bs))
        want = ref(x)
        got = qt.quantize_moe_block(block, format=fmt, block_size=bs)(x)
        assert rel(got, want) < BUDGET[torch.float32], fmt


def test_phimoe_training_mode_is_refused():
    model = build("phimoe", 0).train()
    block = next(m for m in model.modules() if type(m).__name__ == "PhimoeSparseMoeBlock")
    with pytest.raises(ValueError, match="PhimoeSparseMoeBlock: .*training mode"):
        qt.quantize_moe_block(block)


@torch.no_grad()
def test_refused_blocks_are_named_with_the_reason():
    cfg = transformers.DeepseekV2Config(moe_intermediate_size=I, intermediate_size=2 * I,
                                        n_routed_experts=E, num_experts_per_tok=2,
                                        first_k_dense_replace=1, q_lora_rank=None,
                                        kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                        v_head_dim=16, **dict(BASE, num_hidden_layers=2))
    model = transformers.DeepseekV2ForCausalLM(cfg).eval()
    block = model.model.layers[1].mlp
    with pytest.raises(ValueError, match="DeepseekV2Moe is not supported: .*group"):
        qt.quantize_moe_block(block)
    with pytest.raises(ValueError, match=r"model.layers.1.mlp \(DeepseekV2Moe\) is not supported"):
        qt.replace_moe_blocks(model)
    assert model.model.layers[1].mlp is block  # nothing replaced
    ernie = transformers.Ernie4_5_MoeConfig(hidden_size=H, moe_intermediate_size=I,
                                            moe_num_experts=E, moe_k=2)
    from transformers.models.ernie4_5_moe import modeling_ernie4_5_moe as m
    with pytest.raises(ValueError, match="Ernie4_5_MoeSparseMoeBlock is not supported: .*bias"):
        qt.quantize_moe_block(m.Ernie4_5_MoeSparseMoeBlock(ernie))
