"""transformers MoE models with qmoe blocks: tiny, randomly initialised Qwen3-MoE, Mixtral, OLMoE
built from a local config, nothing downloaded. Its logits with qmoe INT8 / INT4 blocks must match
the same model whose expert weights were replaced by their dequantized values, in plain torch:
on the CPU in fp32, on the GPU in bf16."""

import copy
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
if os.environ.get("QMOE_REQUIRE_PYTHON"):
    import qmoe
    import qmoe.torch as qt
else:
    qmoe = pytest.importorskip("qmoe", reason="qmoe Python module not built (PYTHONPATH=build/python)")
    import qmoe.torch as qt

HAVE_GPU = torch.cuda.is_available() and qmoe.backend_available(qmoe.Backend.cuda)

# In bf16 the model has one MoE layer, the last (layer 0 dense): its inputs are then the same
# bits on both sides and routing sees the same logits (after a first MoE layer
# the two sides' hidden states differ by bf16 rounding, and a flipped expert in a later layer
# costs ~0.06 of the logits, seen in 1 seed of 16).
# Relative-norm budgets of the logits against the dequantized plain-torch model. fp32: both sides
# compute on the same exactly dequantized weights, so only summation order differs. bf16: both
# round activations to bf16 at different points (qmoe keeps fp32 inside an expert); measured
# 5.4..5.9e-3 on the CPU backend over 16 seeds, INT8 and INT4.
BUDGET = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def tiny_config(kind, last_layer_moe_only=False):
    common = dict(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=64)
    if kind == "qwen3_moe":
        return transformers.Qwen3MoeConfig(moe_intermediate_size=64, intermediate_size=128,
                                           num_experts=8, num_experts_per_tok=2,
                                           norm_topk_prob=True,
                                           mlp_only_layers=[0] if last_layer_moe_only else [],
                                           **common)
    common.pop("head_dim")
    if kind == "olmoe":  # routing weights not renormalized
        return transformers.OlmoeConfig(intermediate_size=64, num_experts=8,
                                        num_experts_per_tok=2, norm_topk_prob=False, **common)
    return transformers.MixtralConfig(intermediate_size=64, num_local_experts=8,
                                      num_experts_per_tok=2, **common)


def build(kind, seed, last_layer_moe_only=False):
    torch.manual_seed(seed)
    cfg = tiny_config(kind, last_layer_moe_only)
    cls = {"qwen3_moe": transformers.Qwen3MoeForCausalLM,
           "mixtral": transformers.MixtralForCausalLM,
           "olmoe": transformers.OlmoeForCausalLM}[kind]
    model = cls(cfg).eval()
    # Random init gives tiny router weights (all experts near-equal): spread them so routing is
    # decided, not a near-tie that any rounding flips.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight") or name.endswith("gate_up_proj") or \
                    name.endswith("down_proj"):
                p.normal_(0, 0.5 if name.endswith("gate.weight") else 0.05)
    return model


def dequantize_experts(model, fmt, block):
    """The model with every expert weight replaced by dequant(quant(w)) (the reference)."""
    ref = copy.deepcopy(model)
    f = qmoe.fc_format(fmt, block)
    with torch.no_grad():
        for name, block_mod in ref.named_modules():
            if type(block_mod).__name__ not in qt.ADAPTERS:
                continue
            ex = block_mod.experts
            for pname in ("gate_up_proj", "down_proj"):
                p = getattr(ex, pname)
                w = p.detach().float().cpu().numpy()
                d = qmoe.dequantize_fc(qmoe.quantize_fc(w, f), f, *w.shape)
                p.copy_(torch.from_numpy(d))
    return ref


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _routing_of(config):
    e = next(getattr(config, n) for n in ("num_local_experts", "num_experts", "n_routed_experts")
             if getattr(config, n, None))
    return e, config.num_experts_per_tok


def untied_rel(got_model, ref_model, ids):
    """rel() of the two models' logits over the tokens whose router logits, as the reference
    computes them, do not tie at the top-k boundary (the k-th and (k+1)-th largest equal). In
    bf16 such exact ties happen (a logit near 5 has a step of 1/32): qmoe takes the lower expert
    index, torch's topk promises no order, so the two may route that token to different experts,
    a legitimate difference. The routers are found as the Linear layers with E outputs, or the
    router modules of their own (transformers 5's `*Router`, a [E, H] weight); every MoE layer's
    router must be seen, and at least half the tokens must remain."""
    e, k = _routing_of(ref_model.config)
    seen = []

    def hook(m, inp, out):
        bias = getattr(m, "bias", None)
        seen.append(torch.nn.functional.linear(inp[0], m.weight, bias).reshape(-1, e))

    def is_router(m):
        if isinstance(m, torch.nn.Linear):
            return m.out_features == e
        w = getattr(m, "weight", None)
        return (type(m).__name__.endswith("Router") and isinstance(w, torch.Tensor)
                and w.dim() == 2 and w.shape[0] == e)

    routers = [m for m in ref_model.modules() if is_router(m)]
    moe_layers = [m for m in ref_model.modules() if type(m).__name__.endswith("SparseMoeBlock")]
    assert routers and len(routers) >= len(moe_layers), "the routers were not found"
    hooks = [m.register_forward_hook(hook) for m in routers]
    try:
        want = ref_model(ids).logits
    finally:
        for h in hooks:
            h.remove()
    keep = torch.ones(ids.numel(), dtype=torch.bool, device=ids.device)
    for logits in seen:
        top = logits.float().topk(min(k + 1, e), dim=-1).values
        if top.shape[-1] > k:
            keep &= top[:, k - 1] != top[:, k]
    assert int(keep.sum()) * 2 >= ids.numel(), f"{int((~keep).sum())} of {ids.numel()} tied"
    got = got_model(ids).logits
    v = want.shape[-1]
    return rel(got.reshape(-1, v)[keep], want.reshape(-1, v)[keep])


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral", "olmoe"])
@pytest.mark.parametrize("fmt,block", [("int8", 64), ("int4", 32)])
@torch.no_grad()
def test_tiny_model_cpu_fp32(seed, kind, fmt, block):
    model = build(kind, seed % 2**31)
    ref = dequantize_experts(model, fmt, block)
    replaced = qt.replace_moe_blocks(model, format=fmt, block_size=block)
    assert len(replaced) == 2 and all(isinstance(model.get_submodule(n), qt.QMoEBlock)
                                      for n in replaced)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(seed % 2**31))
    got = model(ids).logits
    want = ref(ids).logits
    assert rel(got, want) < BUDGET[torch.float32]


@pytest.mark.parametrize("fmt,block", [("int8", 64), ("int4", 32)])
@torch.no_grad()
def test_tiny_qwen3_moe_cpu_bf16(seed, fmt, block):
    model = build("qwen3_moe", seed % 2**31, last_layer_moe_only=True).to(torch.bfloat16)
    ref = dequantize_experts(model, fmt, block)
    assert len(qt.replace_moe_blocks(model, format=fmt, block_size=block)) == 1
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(seed % 2**31))
    assert untied_rel(model, ref, ids) < BUDGET[torch.bfloat16]


@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device and a CUDA build of qmoe")
@pytest.mark.parametrize("fmt,block", [("int8", 64), ("int4", 32)])
@torch.no_grad()
def test_tiny_qwen3_moe_gpu_bf16(seed, fmt, block):
    # Both sides quantize the same bf16 weights (the reference from a copy made after the cast).
    model = build("qwen3_moe", seed % 2**31, last_layer_moe_only=True).cuda().to(torch.bfloat16)
    ref = dequantize_experts(model, fmt, block)
    replaced = qt.replace_moe_blocks(model, format=fmt, block_size=block)
    ids = torch.randint(0, 256, (1, 16), device="cuda")
    assert untied_rel(model, ref, ids) < BUDGET[torch.bfloat16]
    # One decode step compiles without graph breaks (fullgraph=True raises on one). Compiled and
    # eager layers before the MoE block round differently in bf16, which may flip a near-tie in
    # routing, so the whole step is compared loosely and the block itself closely.
    step = ids[:, -1:]
    compiled = torch.compile(model, fullgraph=True)
    assert rel(compiled(step, use_cache=False).logits, model(step, use_cache=False).logits) < 0.5
    block = model.get_submodule(replaced[0])
    h = torch.randn(1, 1, 128, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(torch.compile(block, fullgraph=True)(h), block(h), rtol=1e-2,
                               atol=1e-2)


def test_unsupported_block_is_named():
    with pytest.raises(ValueError, match="unsupported block Linear; supported: .*Qwen3Moe"):
        qt.quantize_moe_block(torch.nn.Linear(4, 4))
