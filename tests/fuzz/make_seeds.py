"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): tiny valid layer files in
every weight format and routing family the layer file describes, plus a few safetensors files of
other shapes (no tensors, metadata only, odd dtypes). Deterministic; rerun it after a change to the
layer file format and commit the result."""

import json
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

from ortqmoe import BF16, make_layer, write_layer_file, write_safetensors  # noqa: E402


def main():
    rng = np.random.default_rng(7)
    layers = HERE / "corpus" / "fuzz_layer_file"
    headers = HERE / "corpus" / "fuzz_safetensors"
    for d in (layers, headers):
        d.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            f.unlink()
    cases = {
        "int4_b16": dict(bits=4, block_size=16, k=2),
        "int8_zp": dict(bits=8, block_size=16, zero_points=True, k=1),
        "int2_channel": dict(bits=2, k=2, activation="silu", bias=False),
        "int3_fc3": dict(bits=3, block_size=16, swiglu_fusion=0, k=2),
        "mxfp4": dict(quant="mxfp4", k=2),
        "nvfp4": dict(quant="nvfp4", k=1, bias=False),
        "int4_bf16": dict(bits=4, block_size=16, k=2, act_dtype=BF16),
    }
    for name, kw in cases.items():
        layer = make_layer(rng, 64, 32, 4, **kw)
        write_layer_file(layers / f"{name}.safetensors", layer)
    write_safetensors(headers / "empty.safetensors", {})
    write_safetensors(headers / "metadata_only.safetensors", {}, {"a": "1", "qmoe.x": "y"})
    write_safetensors(headers / "mixed.safetensors",
                      {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                       "b": np.arange(5, dtype=np.uint8), "c": np.zeros((0, 4), np.int64),
                       "d": np.ones(3, np.float16)})
    # An empty tensor whose offsets fall inside another tensor's range: valid (it occupies no
    # bytes), and a case the ordinary writer never produces.
    text = json.dumps({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                       "b": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]}}).encode()
    text += b" " * (-len(text) % 8)
    (headers / "empty_inside_other.safetensors").write_bytes(
        struct.pack("<Q", len(text)) + text + bytes(8))
    for f in sorted(layers.iterdir())[:3]:
        (headers / f.name).write_bytes(f.read_bytes())
    print(f"{len(list(layers.iterdir()))} layer files, {len(list(headers.iterdir()))} headers")


if __name__ == "__main__":
    main()
