"""torch.ops.qmoe: the MoE operator, registered from Python with torch.library.

The compiled extension does not link libtorch (whose C++ ABI changes with every release); this
file checks the tensors, allocates the workspace from torch's caching allocator, and hands raw
addresses plus torch's current stream to the C++ layer. Nothing here synchronizes with the host,
so eager calls queue asynchronously and a call can be captured in a CUDA graph.

A prepared layer is referred to by an int handle, a key into _LAYERS below. An int is a schema
type every torch subsystem understands (dynamo specializes on it as a constant, fake tensors and
opcheck pass it through, a graph replay never sees it) and it needs no torch.classes registration.

    torch.ops.qmoe.moe_forward(x, router_logits, layer, router_weights=None) -> Tensor
    torch.ops.qmoe.moe_forward_out(x, router_logits, layer, out, router_weights=None) -> ()

x [T, H] or [B, S, H] in the layer's act dtype, router_logits [T, E] (act dtype or f32),
router_weights optional [T, E]; all contiguous, on the layer's device. moe_forward_out writes
into out (x's shape and dtype; pass it by name, out=...) and returns nothing, the form
torch.compile functionalizes. Both refuse inputs that need a gradient (inference only)."""

import atexit
import itertools
import threading
import torch

from .. import _qmoe
from ..layer import Layer

# handle -> _Entry. Handles are never reused within a process, so a stale one fails loudly.
_LAYERS = {}
_NEXT = itertools.count(1)
_LOCK = threading.Lock()

_DTYPES = {torch.float32: int(_qmoe.DType.f32.value), torch.float16: int(_qmoe.DType.f16.value),
           torch.bfloat16: int(_qmoe.DType.bf16.value)}
_ACT_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


class _Entry:
    """What a call needs of a registered layer, read once at registration (a layer's spec is
    fixed once prepared), so the per-call path makes no C++ round trip but the run itself."""
    __slots__ = ("layer", "run_ptr", "hidden", "experts", "act", "device", "ws_bytes")

    def __init__(self, layer):
        spec = layer.spec
        self.layer = layer
        self.run_ptr = layer._impl._run_ptr
        self.hidden, self.experts = spec.hidden, spec.num_experts
        self.act = _ACT_TORCH[spec.act_dtype.name]
        self.device = (torch.device("cuda", layer.device) if layer.backend == _qmoe.Backend.cuda
                       else torch.device("cpu"))
        self.ws_bytes = {}  # tokens -> workspace bytes

    def workspace_bytes(self, tokens):
        n = self.ws_bytes.get(tokens)
        if n is None:
            n = self.ws_bytes[tokens] = self.layer.workspace_size(tokens)
        return n


def register_layer(layer):
    """Makes a qmoe.Layer callable from the op; returns its handle."""
    if not isinstance(layer, Layer):
        raise TypeError(f"register_layer: expected a qmoe.Layer, got {type(layer).__name__}")
    entry = _Entry(layer)
    with _LOCK:
        handle = next(_NEXT)
        _LAYERS[handle] = entry
    return handle


def unregister_layer(handle):
    with _LOCK:
        _LAYERS.pop(handle, None)


@atexit.register
def _release_layers():
    """Layers still registered at exit are released before the interpreter tears the extension
    down, so their C++ objects (and device memory) are freed in order and nanobind reports no
    leaked instances."""
    with _LOCK:
        _LAYERS.clear()


def _entry(handle):
    entry = _LAYERS.get(handle)
    if entry is None:
        raise ValueError(f"layer: no qmoe layer registered under handle {handle} "
                         "(qmoe.torch.register_layer returns handles; QMoE modules hold one)")
    return entry


def get_layer(handle):
    """The qmoe.Layer registered under handle."""
    return _entry(handle).layer


def _check(x, router_logits, layer, router_weights, out=None):
    """Checks shapes, dtypes, devices and contiguity; returns (entry, tokens). Runs under fake
    tensors too, so it reads only metadata."""
    ent = _entry(layer)
    h, e, act, want = ent.hidden, ent.experts, ent.act, ent.device
    if x.dim() not in (2, 3) or x.shape[-1] != h:
        raise ValueError(f"x: expected shape [tokens, {h}] or [batch, seq, {h}], "
                         f"got {list(x.shape)}")
    if x.dtype != act:
        raise TypeError(f"x: expected dtype {act} (the layer's act_dtype), got {x.dtype}")
    tokens = x.numel() // h
    named = [("x", x), ("router_logits", router_logits)]
    if router_weights is not None:
        named.append(("router_weights", router_weights))
    if out is not None:
        named.append(("out", out))
    for name, t in named:
        if t.device != want:
            raise ValueError(f"{name}: expected a tensor on {want} (where the layer was "
                             f"prepared), got one on {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor, got strides "
                             f"{list(t.stride())} for shape {list(t.shape)}; call .contiguous()")
    for name, t in named[1:]:
        if name == "out":
            continue
        if t.dtype != act and t.dtype != torch.float32:
            raise TypeError(f"{name}: expected dtype {act} or torch.float32, got {t.dtype}")
        if t.dim() != 2 or t.shape[0] != tokens or t.shape[1] != e:
            raise ValueError(f"{name}: expected shape [{tokens}, {e}], got {list(t.shape)}")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype):
        raise ValueError(f"out: expected dtype {x.dtype} and shape {list(x.shape)}, got "
                         f"{out.dtype} {list(out.shape)}")
    return ent, tokens


def _run(x, router_logits, layer, router_weights, out):
    ent, tokens = _check(x, router_logits, layer, router_weights, out)
    if tokens == 0:
        return
    nbytes = ent.workspace_bytes(tokens)
    # From torch's caching allocator (a graph's private pool while capturing): no cudaMalloc,
    # no synchronization; 512-byte aligned, more than qmoe's 256.
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=x.device)
    stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0
    rw_ptr, rw_dtype = 0, 0
    if router_weights is not None:
        rw_ptr, rw_dtype = router_weights.data_ptr(), _DTYPES[router_weights.dtype]
    ent.run_ptr(tokens, x.data_ptr(), _DTYPES[x.dtype], router_logits.data_ptr(),
                _DTYPES[router_logits.dtype], rw_ptr, rw_dtype, out.data_ptr(), ws.data_ptr(),
                nbytes, stream)


# Registered with torch.library.Library rather than the custom_op decorator: the same schema,
# kernels and fake implementations, with about half the per-call dispatch cost in eager mode.
_LIB = torch.library.Library("qmoe", "DEF")
_LIB.define("moe_forward(Tensor x, Tensor router_logits, int layer, "
            "Tensor? router_weights=None) -> Tensor")
_LIB.define("moe_forward_out(Tensor x, Tensor router_logits, int layer, Tensor(a!) out, "
            "Tensor? router_weights=None) -> ()")


def _moe_forward(x, router_logits, layer, router_weights=None):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run(x, router_logits, layer, router_weights, out)
    return out


def _moe_forward_out(x, router_logits, layer, out, router_weights=None):
    _run(x, router_logits, layer, router_weights, out)


def _moe_forward_fake(x, router_logits, layer, router_weights=None):
    _check(x, router_logits, layer, router_weights)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _moe_forward_out_fake(x, router_logits, layer, out, router_weights=None):
    _check(x, router_logits, layer, router_weights, out)


def _no_grad(name, op):
    """The Autograd-key kernel: qmoe runs inference only, so a call that would need a gradient
    is refused with a clear error (torch would otherwise only warn and return no gradient)."""
    def kernel(*args, **kwargs):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in (*args, *kwargs.values())):
            raise RuntimeError(f"qmoe::{name}: no gradient (qmoe runs inference only); call it "
                               "under torch.no_grad() or torch.inference_mode(), or detach "
                               "the inputs")
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)
    return kernel


for _key in ("CPU", "CUDA"):
    _LIB.impl("moe_forward", _moe_forward, _key)
    _LIB.impl("moe_forward_out", _moe_forward_out, _key)
_LIB.impl("moe_forward", _no_grad("moe_forward", torch.ops.qmoe.moe_forward.default), "Autograd")
_LIB.impl("moe_forward_out", _no_grad("moe_forward_out", torch.ops.qmoe.moe_forward_out.default),
          "Autograd")
torch.library.register_fake("qmoe::moe_forward", _moe_forward_fake, lib=_LIB)
torch.library.register_fake("qmoe::moe_forward_out", _moe_forward_out_fake, lib=_LIB)

moe_forward = torch.ops.qmoe.moe_forward
moe_forward_out = torch.ops.qmoe.moe_forward_out
