"""torch.ops.qmoe.moe_forward / moe_forward_out: against a numpy fp64 reference, opcheck,
torch.compile(fullgraph=True), bad tensors; on the GPU also CUDA graph capture (bitwise equal to
eager) and bf16. GPU tests skip without a CUDA device or in a CPU-only build."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if os.environ.get("QMOE_REQUIRE_PYTHON"):
    import qmoe
    import qmoe.torch as qt
else:
    qmoe = pytest.importorskip("qmoe", reason="qmoe Python module not built (PYTHONPATH=build/python)")
    import qmoe.torch as qt

from test_python_api import E, H, I, K, dequantized, make_inputs, make_weights, numpy_moe, rel

HAVE_GPU = torch.cuda.is_available() and qmoe.backend_available(qmoe.Backend.cuda)
gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device and a CUDA build of qmoe")


def make_module(rng, fmt="int4", block=64, dtype="f32", backend="cpu", normalize=True):
    w1, w2 = make_weights(rng)
    m = qt.QMoE.from_float(w1, w2, top_k=K, format=fmt, block_size=block, normalize=normalize,
                           dtype=dtype, backend=backend)
    ref_w = (dequantized(m.layer.spec.fc1, w1), dequantized(m.layer.spec.fc2, w2))
    return m, ref_w


def inputs(rng, t=6, dtype=torch.float32, device="cpu"):
    x, logits = make_inputs(rng, t)
    return (torch.from_numpy(x).to(device=device, dtype=dtype),
            torch.from_numpy(logits).to(device=device, dtype=dtype))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_op_matches_numpy_fp64(rng, fmt):
    m, (w1, w2) = make_module(rng, fmt)
    x, logits = inputs(rng)
    y = torch.ops.qmoe.moe_forward(x, logits, m.handle)
    assert y.shape == x.shape and y.dtype == torch.float32
    ref = numpy_moe(x.numpy(), logits.numpy(), w1, w2, K, True)
    assert rel(y.numpy(), ref) < 1e-5
    # The module, the out= variant and f32 logits with [B, S, H] input give the same bits.
    out = torch.empty_like(x)
    torch.ops.qmoe.moe_forward_out(x, logits, m.handle, out=out)
    assert torch.equal(out, y)
    assert torch.equal(m(x.view(2, 3, H), logits).view(6, H), y)


def test_router_weights_follow_the_oracle(rng):
    m, _ = make_module(rng, "int8")
    x, logits = inputs(rng)
    rw = torch.rand(6, E)
    y = torch.ops.qmoe.moe_forward(x, logits, m.handle, rw)
    ref = m.layer.reference(x.numpy(), logits.numpy(), rw.numpy())
    assert rel(y.numpy(), ref) < 1e-5
    assert not torch.equal(y, torch.ops.qmoe.moe_forward(x, logits, m.handle))


def test_opcheck(rng):
    m, _ = make_module(rng, "int8")
    x, logits = inputs(rng)
    torch.library.opcheck(torch.ops.qmoe.moe_forward.default, (x, logits, m.handle))
    torch.library.opcheck(torch.ops.qmoe.moe_forward.default,
                          (x, logits, m.handle, torch.rand(6, E)))
    torch.library.opcheck(torch.ops.qmoe.moe_forward_out.default, (x, logits, m.handle),
                          {"out": torch.empty_like(x)})


class _Block(torch.nn.Module):
    """Router + qmoe + residual, as a transformer block uses it."""

    def __init__(self, moe):
        super().__init__()
        self.router = torch.nn.Linear(H, E, bias=False)
        self.moe = moe

    def forward(self, x):
        return x + self.moe(x, self.router(x))


@torch.no_grad()  # the op has no autograd formula: inference only
def test_compile_fullgraph(rng):
    m, _ = make_module(rng, "int4")
    block = _Block(m)
    x, _ = inputs(rng)
    eager = block(x)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(x)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    # Another token count reuses or retraces without a graph break.
    x2, _ = inputs(rng, t=3)
    torch.testing.assert_close(compiled(x2), block(x2), rtol=1e-5, atol=1e-5)


def test_zero_tokens_return_empty(rng):
    m, _ = make_module(rng)
    y = torch.ops.qmoe.moe_forward(torch.empty(0, H), torch.empty(0, E), m.handle)
    assert y.shape == (0, H)


def test_bad_tensors_raise_clear_errors(rng):
    m, _ = make_module(rng)
    x, logits = inputs(rng)
    op = torch.ops.qmoe.moe_forward
    with pytest.raises(TypeError, match=r"x: expected dtype torch.float32 .*got torch.float16"):
        op(x.half(), logits, m.handle)
    with pytest.raises(TypeError, match=r"router_logits: expected dtype .*got torch.float64"):
        op(x, logits.double(), m.handle)
    with pytest.raises(ValueError, match=r"x: expected shape \[tokens, 128\]"):
        op(x[:, :64], logits, m.handle)
    with pytest.raises(ValueError, match=r"router_logits: expected shape \[6, 8\], got \[6, 4\]"):
        op(x, logits[:, :4].contiguous(), m.handle)
    with pytest.raises(ValueError, match=r"x: expected a contiguous tensor"):
        op(torch.randn(H, 6).t(), logits, m.handle)
    with pytest.raises(ValueError, match=r"router_weights: expected a contiguous tensor"):
        op(x, logits, m.handle, torch.rand(E, 6).t())
    with pytest.raises(ValueError, match=r"x: expected a tensor on cpu .*got one on meta"):
        op(x.to("meta"), logits.to("meta"), m.handle)
    with pytest.raises(ValueError, match="no qmoe layer registered under handle 999999"):
        op(x, logits, 999999)
    with pytest.raises(ValueError, match=r"out: expected dtype torch.float32 and shape \[6, 128\]"):
        torch.ops.qmoe.moe_forward_out(x, logits, m.handle, out=torch.empty(6, 64))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="x: expected a tensor on cpu .*got one on cuda"):
            op(x.cuda(), logits.cuda(), m.handle)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("tokens", [1, 8, 40])
def test_cuda_bf16_matches_numpy_fp64(rng, tokens):
    m, (w1, w2) = make_module(rng, "int4", dtype="bf16", backend="cuda")
    x, logits = inputs(rng, t=tokens, dtype=torch.bfloat16, device="cuda")
    y = torch.ops.qmoe.moe_forward(x, logits, m.handle)
    assert y.is_cuda and y.dtype == torch.bfloat16
    ref = numpy_moe(x.float().cpu().numpy(), logits.float().cpu().numpy(), w1, w2, K, True)
    assert rel(y.float().cpu().numpy(), ref) < 2e-2
    m.layer.take_deferred_error()


@gpu
@pytest.mark.parametrize("tokens", [1, 8])
def test_cuda_graph_capture_bitwise_equal_to_eager(rng, tokens):
    m, _ = make_module(rng, "int4", dtype="bf16", backend="cuda")
    x, logits = inputs(rng, t=tokens, dtype=torch.bfloat16, device="cuda")
    eager = torch.ops.qmoe.moe_forward(x, logits, m.handle)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up off the default stream, as capture requires
        torch.ops.qmoe.moe_forward(x, logits, m.handle)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = torch.ops.qmoe.moe_forward(x, logits, m.handle)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    # New inputs in the same buffers: replay follows them.
    x2, l2 = inputs(rng, t=tokens, dtype=torch.bfloat16, device="cuda")
    x.copy_(x2)
    logits.copy_(l2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, torch.ops.qmoe.moe_forward(x, logits, m.handle))


@gpu
@torch.no_grad()
def test_cuda_compile_fullgraph_and_streams(rng):
    m, _ = make_module(rng, "int8", dtype="bf16", backend="cuda")
    block = _Block(m).cuda().to(torch.bfloat16)
    x, _ = inputs(rng, t=8, dtype=torch.bfloat16, device="cuda")
    eager = block(x)
    torch._dynamo.reset()
    got = torch.compile(block, fullgraph=True)(x)
    torch.testing.assert_close(got, eager, rtol=2e-2, atol=2e-2)
    # On a side stream the op follows torch's current stream, with the same bits.
    logits = block.router(x)
    main = m(x, logits)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        side = m(x, logits)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(side, main)


def test_inputs_needing_a_gradient_are_refused(rng):
    m, _ = make_module(rng)
    x, logits = inputs(rng)
    with pytest.raises(RuntimeError, match="qmoe::moe_forward: no gradient"):
        m(x.requires_grad_(), logits)
    with torch.no_grad():
        assert m(x, logits).shape == x.shape
