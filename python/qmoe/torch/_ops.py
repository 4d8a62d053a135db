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
torch.compile functionalizes. (custom_op takes no keyword-only tensors, so out is positional.)"""

import itertools
import threading
from typing import Optional

import torch

from .. import _qmoe
from ..layer import Layer

# handle -> Layer. Handles are never reused within a process, so a stale one fails loudly.
_LAYERS = {}
_NEXT = itertools.count(1)
_LOCK = threading.Lock()

_DTYPES = {torch.float32: int(_qmoe.DType.f32.value), torch.float16: int(_qmoe.DType.f16.value),
           torch.bfloat16: int(_qmoe.DType.bf16.value)}
_ACT_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def register_layer(layer):
    """Makes a qmoe.Layer callable from the op; returns its handle."""
    if not isinstance(layer, Layer):
        raise TypeError(f"register_layer: expected a qmoe.Layer, got {type(layer).__name__}")
    with _LOCK:
        handle = next(_NEXT)
        _LAYERS[handle] = layer
    return handle


def unregister_layer(handle):
    with _LOCK:
        _LAYERS.pop(handle, None)


def get_layer(handle):
    layer = _LAYERS.get(handle)
    if layer is None:
        raise ValueError(f"layer: no qmoe layer registered under handle {handle} "
                         "(qmoe.torch.register_layer returns handles; QMoE modules hold one)")
    return layer


def _layer_device(layer):
    if layer.backend == _qmoe.Backend.cuda:
        return torch.device("cuda", layer.device)
    return torch.device("cpu")


def _check(x, router_logits, layer, router_weights, out=None):
    """Checks shapes, dtypes, devices and contiguity; returns (layer, tokens). Runs under fake
    tensors too, so it reads only metadata."""
    lay = get_layer(layer)
    spec = lay.spec
    h, e = spec.hidden, spec.num_experts
    act = _ACT_TORCH[spec.act_dtype.name]
    if x.dim() not in (2, 3) or x.shape[-1] != h:
        raise ValueError(f"x: expected shape [tokens, {h}] or [batch, seq, {h}], "
                         f"got {list(x.shape)}")
    if x.dtype != act:
        raise TypeError(f"x: expected dtype {act} (the layer's act_dtype), got {x.dtype}")
    tokens = x.numel() // h
    want = _layer_device(lay)
    named = [("x", x), ("router_logits", router_logits)]
    if router_weights is not None:
        named.append(("router_weights", router_weights))
    if out is not None:
        named.append(("out", out))
    for name, t in named:
        if t.device.type != want.type or (want.type == "cuda" and t.device.index != want.index):
            raise ValueError(f"{name}: expected a tensor on {want} (where the layer was "
                             f"prepared), got one on {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor, got strides "
                             f"{list(t.stride())} for shape {list(t.shape)}; call .contiguous()")
    routing = [(n, t) for n, t in named if n in ("router_logits", "router_weights")]
    for name, t in routing:
        if t.dtype not in (act, torch.float32):
            raise TypeError(f"{name}: expected dtype {act} or torch.float32, got {t.dtype}")
        if t.dim() != 2 or t.shape[0] != tokens or t.shape[1] != e:
            raise ValueError(f"{name}: expected shape [{tokens}, {e}], got {list(t.shape)}")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype):
        raise ValueError(f"out: expected dtype {x.dtype} and shape {list(x.shape)}, got "
                         f"{out.dtype} {list(out.shape)}")
    return lay, tokens


def _run(x, router_logits, layer, router_weights, out):
    lay, tokens = _check(x, router_logits, layer, router_weights, out)
    if tokens == 0:
        return
    nbytes = lay.workspace_size(tokens)
    # From torch's caching allocator (a graph's private pool while capturing): no cudaMalloc,
    # no synchronization; 512-byte aligned, more than qmoe's 256.
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=x.device)
    stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0
    rw_ptr, rw_dtype = 0, 0
    if router_weights is not None:
        rw_ptr, rw_dtype = router_weights.data_ptr(), _DTYPES[router_weights.dtype]
    lay._impl._run_ptr(tokens, x.data_ptr(), _DTYPES[x.dtype], router_logits.data_ptr(),
                       _DTYPES[router_logits.dtype], rw_ptr, rw_dtype, out.data_ptr(),
                       ws.data_ptr(), nbytes, stream)


@torch.library.custom_op("qmoe::moe_forward", mutates_args=())
def moe_forward(x: torch.Tensor, router_logits: torch.Tensor, layer: int,
                router_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run(x, router_logits, layer, router_weights, out)
    return out


@moe_forward.register_fake
def _moe_forward_fake(x, router_logits, layer, router_weights=None):
    _check(x, router_logits, layer, router_weights)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("qmoe::moe_forward_out", mutates_args=("out",))
def moe_forward_out(x: torch.Tensor, router_logits: torch.Tensor, layer: int,
                    out: torch.Tensor, router_weights: Optional[torch.Tensor] = None) -> None:
    _run(x, router_logits, layer, router_weights, out)


@moe_forward_out.register_fake
def _moe_forward_out_fake(x, router_logits, layer, out, router_weights=None):
    _check(x, router_logits, layer, router_weights, out)
