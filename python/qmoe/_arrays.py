"""Array plumbing shared by the package: which framework an array belongs to, host copies of
weights for prepare, and output/workspace allocation next to a call's input.

Weights are read once on the host at prepare, so any array goes: numpy, torch (any device, any
dtype qmoe knows, float8 and bf16 included), or a (array, dtype name) pair holding raw bytes.
Per-call arrays stay where they are; they cross to C++ through DLPack without a copy."""

import sys

import numpy as np

# torch dtype name -> (qmoe dtype name, integer dtype of the same size holding the raw bits).
_TORCH_RAW = {
    "bfloat16": ("bf16", "int16"),
    "float8_e4m3fn": ("f8e4m3", "uint8"),
    "float8_e8m0fnu": ("f8e8m0", "uint8"),
}

# numpy dtype -> qmoe dtype name.
_NUMPY_DTYPES = {
    np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.float64): "f64",
    np.dtype(np.uint8): "u8", np.dtype(np.int8): "i8", np.dtype(np.int32): "i32",
}


def is_torch(a):
    t = sys.modules.get("torch")
    return t is not None and isinstance(a, t.Tensor)


def is_cupy(a):
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(a, cp.ndarray)


def host_tensor(name, value):
    """(contiguous host numpy array, qmoe dtype name) for a weight tensor given as a numpy array,
    a torch tensor or an (array, dtype name) pair."""
    dtype = ""
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], str):
            raise TypeError(f"{name}: expected an array or an (array, dtype name) pair")
        value, dtype = value
    if is_torch(value):
        tname = str(value.dtype).replace("torch.", "")
        if tname in _TORCH_RAW:
            dtype = dtype or _TORCH_RAW[tname][0]
            import torch
            value = value.view(getattr(torch, _TORCH_RAW[tname][1]))
        value = value.detach().cpu().contiguous().numpy()
    elif is_cupy(value):
        value = value.get()
    arr = np.ascontiguousarray(np.asarray(value))
    if not dtype and arr.dtype not in _NUMPY_DTYPES:
        raise TypeError(f"{name}: unsupported element type {arr.dtype}; expected one of "
                        f"{sorted(_NUMPY_DTYPES.values())} or an (array, dtype name) pair")
    return arr, dtype


def empty_like_framework(x, shape, dtype_of_x=True):
    """An uninitialised array of `shape` in x's framework, on x's device, x's dtype (or uint8)."""
    if is_torch(x):
        import torch
        return torch.empty(shape, dtype=x.dtype if dtype_of_x else torch.uint8, device=x.device)
    if is_cupy(x):
        import cupy
        return cupy.empty(shape, dtype=x.dtype if dtype_of_x else cupy.uint8)
    return np.empty(shape, dtype=np.asarray(x).dtype if dtype_of_x else np.uint8)


def workspace_like(x, nbytes):
    """A byte workspace of at least nbytes next to x, aligned to 256 bytes (qmoe asks 64 on the
    host, 256 on the device). torch and cupy allocators align to 512 already; numpy is sliced."""
    n = max(int(nbytes), 1)
    if is_torch(x) or is_cupy(x):
        return empty_like_framework(x, (n,), dtype_of_x=False)
    raw = np.empty(n + 256, dtype=np.uint8)
    off = (-raw.ctypes.data) % 256
    return raw[off:off + n]


def current_stream(x):
    """The stream handle a call on x should use: torch's or cupy's current stream, else 0."""
    if is_torch(x) and x.is_cuda:
        import torch
        return torch.cuda.current_stream(x.device).cuda_stream
    if is_cupy(x):
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0
