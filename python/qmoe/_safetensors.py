"""A small safetensors reader and writer for layer files and model packs, in raw bits.

A tensor is (numpy array of its storage type, qmoe dtype name): bf16 is held as uint16 bits,
f8e4m3 / f8e8m0 as uint8 codes, so every value survives bit for bit. The writer follows
docs/layer-file.md: header padded with spaces to a multiple of 8, tensors larger elements first
(each starts at a multiple of its element size), written to a temporary file then renamed."""

import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

# qmoe dtype name -> (safetensors dtype, numpy storage type)
DTYPES = {
    "f64": ("F64", np.dtype("<f8")), "f32": ("F32", np.dtype("<f4")),
    "f16": ("F16", np.dtype("<f2")), "bf16": ("BF16", np.dtype("<u2")),
    "i32": ("I32", np.dtype("<i4")), "u8": ("U8", np.dtype("u1")), "i8": ("I8", np.dtype("i1")),
    "f8e4m3": ("F8_E4M3", np.dtype("u1")), "f8e8m0": ("F8_E8M0", np.dtype("u1")),
}
_FROM_ST = {st: name for name, (st, _) in DTYPES.items()}


def read(path):
    """({name: (array, dtype name)}, metadata) of a safetensors file."""
    path = Path(path)
    blob = path.read_bytes()
    if len(blob) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    try:
        header = json.loads(blob[8:8 + n])
    except ValueError as e:
        raise ValueError(f"{path}: header is not JSON ({e})") from None
    metadata = header.pop("__metadata__", {}) or {}
    base, out = 8 + n, {}
    for name, info in header.items():
        st = info.get("dtype")
        if st not in _FROM_ST:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {st!r}")
        dtype = _FROM_ST[st]
        begin, end = info["data_offsets"]
        storage = DTYPES[dtype][1]
        count = int(np.prod(info["shape"], dtype=np.int64))
        if end - begin != count * storage.itemsize or base + end > len(blob):
            raise ValueError(f"{path}: tensor {name}: data_offsets {info['data_offsets']} do not "
                             f"fit shape {info['shape']} {st} in the file")
        arr = np.frombuffer(blob, storage, count, base + begin).reshape(info["shape"]).copy()
        out[name] = (arr, dtype)
    return out, dict(metadata)


def to_bytes(tensors, metadata):
    """The file's bytes for {name: (array, dtype name)} and string metadata."""
    order = sorted(tensors, key=lambda k: -DTYPES[tensors[k][1]][1].itemsize)
    header, chunks, offset = {}, [], 0
    for name in order:
        arr, dtype = tensors[name]
        st, storage = DTYPES[dtype]
        data = np.ascontiguousarray(arr).astype(storage, copy=False).tobytes()
        header[name] = {"dtype": st, "shape": [int(d) for d in np.shape(arr)],
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write_atomic(path, data):
    """Writes bytes to a temporary file next to path, then renames it into place: a failure
    leaves nothing behind and never a partial file at path."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OSError(f"{path}: cannot write in {path.parent} ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have given
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
