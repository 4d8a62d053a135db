"""Behaviour of the qmoe command-line tool: info, the self-checking default run, make-layer, and the
errors it reports for bad layer and input files (exit code 2, a message naming the problem)."""

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from ortqmoe import (Layer, QuantFc, dequantize_int, encode_header, make_layer, read_safetensors,
                     reference_forward, rel_norm, run_cli, write_input_file, write_layer_file,
                     write_safetensors)

FORMATS = ["int2", "int3", "int4", "int8", "nvfp4", "mxfp4", "fp8", "fp8_block"]
README = Path(__file__).resolve().parents[2] / "README.md"
BAD_INPUT_EXIT = 2
IO_EXIT = 3  # a file that cannot be read or written


def _words(text):
    return set(re.findall(r"[A-Za-z0-9_]+", text))


# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------

def test_info_lists_formats_and_backend(cli):
    r = run_cli(cli, ["info"])
    assert r.returncode == 0, r.stderr
    words = _words(r.stdout)
    missing = [f for f in FORMATS if f not in words]
    assert not missing, f"`qmoe info` does not list {missing}:\n{r.stdout}"
    assert "cpu" in {w.lower() for w in words}, f"no cpu backend in `qmoe info`:\n{r.stdout}"


def _readme_formats_table():
    assert README.is_file(), f"{README} does not exist"
    text = README.read_text()
    m = re.search(r"<!-- formats-table -->\n(.*?)<!-- /formats-table -->", text, re.S)
    assert m, f"{README} has no <!-- formats-table --> ... <!-- /formats-table --> block"
    return m.group(1)


def test_formats_markdown_matches_readme(cli):
    r = run_cli(cli, ["info", "--formats-markdown"])
    assert r.returncode == 0, r.stderr
    table = r.stdout
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert len(rows) >= 2 + len(FORMATS), f"expected a table with a row per format:\n{table}"
    for f in FORMATS:
        assert any(re.search(rf"\|\s*`?{f}`?\s*\|", row) for row in rows), f"no row for {f}"
    assert _readme_formats_table().strip() == table.strip(), (
        "README.md's formats table differs from `qmoe info --formats-markdown`; regenerate it")


# ---------------------------------------------------------------------------------------------
# default run: self-check against the oracle
# ---------------------------------------------------------------------------------------------

FLOAT = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _line(text, pattern):
    for line in text.splitlines():
        if re.search(pattern, line, re.I):
            return line
    return None


def test_run_without_arguments_checks_against_oracle(cli):
    r = run_cli(cli, ["run"], timeout=300)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    out = r.stdout
    t = _line(out, r"\btime\b")
    assert t and re.search(rf"{FLOAT}\s*(ns|us|µs|ms|s)\b", t), f"no time line:\n{out}"
    err = _line(out, r"\berror\b")
    assert err, f"no error line:\n{out}"
    m = re.search(rf"error[^0-9.+\-]*({FLOAT}).*budget[^0-9.+\-]*({FLOAT})", err, re.I)
    assert m, f"error line does not give the error and its budget: {err!r}"
    error, budget = float(m.group(1)), float(m.group(2))
    assert 0 <= error <= budget, err
    assert budget <= 0.5
    b = _line(out, r"^weights\b|\btouched\b")
    assert b, f"no line with the bytes of weights touched:\n{out}"
    m = re.search(rf"({FLOAT})\s*(B|bytes?|KiB|MiB|GiB|kB|KB|MB|GB)\b", b)
    assert m and float(m.group(1)) > 0, f"no byte count in {b!r}"


# ---------------------------------------------------------------------------------------------
# make-layer round trip
# ---------------------------------------------------------------------------------------------

# The smallest preset (make-layer takes no shape options): 128 experts of 2048 x 768, ~320 MB.
MAKE_LAYER_PRESET = "qwen3-30b-a3b"


def _attrs_from_metadata(md):
    attrs = {}
    for key, v in md.items():
        if key.startswith("qmoe."):
            continue
        try:
            attrs[key] = int(v)
        except ValueError:
            try:
                attrs[key] = float(v)
            except ValueError:
                attrs[key] = v
    return attrs


class LazyDeq:
    """fp64 weights of one FC, dequantized one expert at a time on first use."""

    def __init__(self, tensors, i, bits, block, k):
        self.t, self.i, self.bits, self.block, self.k = tensors, i, bits, block, k
        self.cache = {}
        self.shape = tensors[f"fc{i}_experts_weights"].shape[:2] + (k,)

    def __getitem__(self, e):
        if e not in self.cache:
            zp = self.t.get(f"fc{self.i}_zero_points")
            self.cache[e] = dequantize_int(
                self.t[f"fc{self.i}_experts_weights"][e:e + 1],
                self.t[f"fc{self.i}_scales"][e:e + 1], None if zp is None else zp[e:e + 1],
                self.bits, self.block, self.k)[0]
        return self.cache[e]


def test_make_layer_round_trip(cli, tmp_path, rng):
    layer_path, input_path = tmp_path / "made.layer.safetensors", tmp_path / "made.in.safetensors"
    r = run_cli(cli, ["make-layer", "--preset", MAKE_LAYER_PRESET, "--layer-out", layer_path,
                      "--input-out", input_path], timeout=300)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"

    # Its own files run and pass the check against the oracle.
    r = run_cli(cli, ["run", "--layer", layer_path, "--input", input_path, "--repeat", "1"],
                timeout=300)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert re.search(r"\bPASS\b", r.stdout), r.stdout

    # The file holds ORT's tensors and attributes; on our own input qmoe computes what they say.
    tensors, md = read_safetensors(layer_path)
    assert md.get("qmoe.format_version") == "1", md
    attrs = _attrs_from_metadata(md)
    for name in ("fc1_experts_weights", "fc1_scales", "fc2_experts_weights", "fc2_scales"):
        assert name in tensors, f"{name} missing from {sorted(tensors)}"
    experts, hidden = tensors["fc2_experts_weights"].shape[:2]
    assert attrs.get("quant_type", "int") == "int", attrs
    bits = int(attrs.get("expert_weight_bits", 4))
    block = int(attrs.get("block_size", 0))
    inter = tensors["fc2_experts_weights"].shape[2] * 8 // bits
    assert tensors["fc1_experts_weights"].shape[0] == experts
    fc1 = QuantFc(bits, block, None, None, None, LazyDeq(tensors, 1, bits, block, hidden),
                  tensors.get("fc1_experts_bias"))
    fc2 = QuantFc(bits, block, None, None, None, LazyDeq(tensors, 2, bits, block, inter),
                  tensors.get("fc2_experts_bias"))
    layer = Layer(attrs, fc1, fc2)
    x = rng.standard_normal((2, hidden)).astype(np.float32)
    logits = rng.standard_normal((2, experts)).astype(np.float32)
    mine, out = tmp_path / "x.safetensors", tmp_path / "y.safetensors"
    write_input_file(mine, x, logits)
    r = run_cli(cli, ["run", "--layer", layer_path, "--input", mine, "--output", out, "--no-check",
                      "--repeat", "1"], timeout=300)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    y = read_safetensors(out)[0]["output"]
    ref = reference_forward(layer, x, logits, md.get("qmoe.ort_semantics", "cuda"))
    assert rel_norm(y, ref) <= 1e-5


# ---------------------------------------------------------------------------------------------
# bad files
# ---------------------------------------------------------------------------------------------

H, I, E, T = 96, 64, 8, 5


class GoodFiles:
    """A valid layer file and input file; run() runs them or a variant of one of them."""

    def __init__(self, cli, tmp_path, rng):
        self.cli, self.tmp_path = cli, tmp_path
        self.layer = make_layer(rng, H, I, E, bits=4, block_size=32, k=2)
        self.layer_path = tmp_path / "layer.safetensors"
        self.input_path = tmp_path / "input.safetensors"
        write_layer_file(self.layer_path, self.layer, "cpu")
        self.x = rng.standard_normal((T, H)).astype(np.float32)
        self.logits = rng.standard_normal((T, E)).astype(np.float32)
        write_input_file(self.input_path, self.x, self.logits)

    def run(self, layer_path=None, input_path=None):
        return run_cli(self.cli, ["run", "--layer", layer_path or self.layer_path,
                                  "--input", input_path or self.input_path,
                                  "--output", self.tmp_path / "out.safetensors", "--no-check"])


@pytest.fixture
def good(cli, tmp_path, rng):
    return GoodFiles(cli, tmp_path, rng)


def test_good_files_run(good):
    r = good.run()
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"


def _split(blob):
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _rewrite(src, dst, edit):
    header, data = _split(Path(src).read_bytes())
    data = edit(header, data)
    Path(dst).write_bytes(encode_header(header) + data)


def _expect_bad(r, *patterns, exit_code=BAD_INPUT_EXIT):
    assert r.returncode == exit_code, (
        f"exit code {r.returncode}, expected {exit_code}\n"
        f"stdout: {r.stdout}\nstderr: {r.stderr}")
    err = r.stderr
    for p in patterns:
        assert re.search(p, err, re.I), f"stderr does not match {p!r}:\n{err}"


def test_truncated_file(good, tmp_path):
    bad = tmp_path / "truncated.safetensors"
    blob = good.layer_path.read_bytes()
    bad.write_bytes(blob[:len(blob) - 100])
    _expect_bad(good.run(layer_path=bad), re.escape(bad.name), r"truncat|past the end|data section")


def test_file_shorter_than_length_prefix(good, tmp_path):
    bad = tmp_path / "tiny.safetensors"
    bad.write_bytes(b"\x10\x00\x00")
    _expect_bad(good.run(layer_path=bad), re.escape(bad.name), r"\b8\b|header length|bytes")


def test_header_length_past_end_of_file(good, tmp_path):
    bad = tmp_path / "long_header.safetensors"
    blob = good.layer_path.read_bytes()
    bad.write_bytes(struct.pack("<Q", len(blob) + 1000) + blob[8:])
    _expect_bad(good.run(layer_path=bad), re.escape(bad.name), r"header length")


def test_overlapping_data_offsets(good, tmp_path):
    bad = tmp_path / "overlap.safetensors"

    def edit(header, data):
        a = header["fc1_scales"]["data_offsets"]
        b = header["fc2_scales"]["data_offsets"]
        size = b[1] - b[0]
        header["fc2_scales"]["data_offsets"] = [a[0], a[0] + size]  # now inside fc1_scales
        return data
    _rewrite(good.layer_path, bad, edit)
    _expect_bad(good.run(layer_path=bad), re.escape(bad.name), r"overlap", "fc2_scales")


def test_data_offsets_size_does_not_match_shape(good, tmp_path):
    bad = tmp_path / "size.safetensors"

    def edit(header, data):
        header["fc1_scales"]["shape"][-1] -= 1  # offsets still span the old size
        return data
    _rewrite(good.layer_path, bad, edit)
    _expect_bad(good.run(layer_path=bad), re.escape(bad.name), "fc1_scales", r"bytes|size")


def test_data_offsets_past_end(good, tmp_path):
    bad = tmp_path / "past_end.safetensors"

    def edit(header, data):
        name = max((n for n in header if n != "__metadata__"),
                   key=lambda n: header[n]["data_offsets"][1])
        header[name]["data_offsets"][1] += 8
        return data
    _rewrite(good.layer_path, bad, edit)
    _expect_bad(good.run(layer_path=bad), re.escape(bad.name), r"data_offsets|truncat|past")


def test_header_not_json(good, tmp_path):
    bad = tmp_path / "notjson.safetensors"
    text = b"{not json" + b" " * 7
    bad.write_bytes(struct.pack("<Q", len(text)) + text)
    _expect_bad(good.run(layer_path=bad), re.escape(bad.name), r"json")


def test_missing_file(good, tmp_path):
    r = good.run(layer_path=tmp_path / "does_not_exist.safetensors")
    _expect_bad(r, "does_not_exist.safetensors", exit_code=IO_EXIT)


@pytest.mark.parametrize("name", ["fc1_experts_weights", "fc1_scales", "fc2_experts_weights",
                                  "fc2_scales"])
def test_missing_required_tensor(good, tmp_path, name):
    tensors, md = read_safetensors(good.layer_path)
    del tensors[name]
    bad = tmp_path / f"no_{name}.safetensors"
    write_safetensors(bad, tensors, md)
    _expect_bad(good.run(layer_path=bad), name)


@pytest.mark.parametrize("k", [0, E + 1])
def test_bad_k(good, tmp_path, k):
    tensors, md = read_safetensors(good.layer_path)
    md["k"] = str(k)
    bad = tmp_path / f"k{k}.safetensors"
    write_safetensors(bad, tensors, md)
    _expect_bad(good.run(layer_path=bad), r"\bk\b", rf"\b{k}\b")


def test_block_size_not_dividing_k(good, tmp_path):
    # Tensors shaped for block 32 over H = 96; metadata claims 64, which does not divide 96.
    tensors, md = read_safetensors(good.layer_path)
    md["block_size"] = "64"
    bad = tmp_path / "block.safetensors"
    write_safetensors(bad, tensors, md)
    _expect_bad(good.run(layer_path=bad), r"block_size", r"\b64\b")


def test_unknown_metadata_key(good, tmp_path):
    tensors, md = read_safetensors(good.layer_path)
    md["swiglu_fusionn"] = "1"
    bad = tmp_path / "typo.safetensors"
    write_safetensors(bad, tensors, md)
    _expect_bad(good.run(layer_path=bad), "swiglu_fusionn")


def test_nan_in_input(good, tmp_path):
    x = good.x.copy()
    x[2, 7] = np.nan
    bad = tmp_path / "nan.safetensors"
    write_input_file(bad, x, good.logits)
    _expect_bad(good.run(input_path=bad), r"\binput\b", r"nan")


def test_nan_in_router_logits(good, tmp_path):
    logits = good.logits.copy()
    logits[1, 3] = np.nan
    bad = tmp_path / "nan_logits.safetensors"
    write_input_file(bad, good.x, logits)
    _expect_bad(good.run(input_path=bad), r"router_probs|logit", r"nan")


def test_zero_tokens(good, tmp_path):
    """ORT accepts a call of zero tokens, and so does qmoe: an empty output file."""
    empty = tmp_path / "empty.safetensors"
    write_input_file(empty, np.zeros((0, H), np.float32), np.zeros((0, E), np.float32))
    r = good.run(input_path=empty)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    tensors, _ = read_safetensors(tmp_path / "out.safetensors")
    assert tensors["output"].shape == (0, H)
    # Shapes are still checked: zero tokens of the wrong width are refused.
    bad = tmp_path / "empty_bad.safetensors"
    write_input_file(bad, np.zeros((0, H + 1), np.float32), np.zeros((0, E), np.float32))
    _expect_bad(good.run(input_path=bad), r"\binput\b", rf"\b{H}\b")


def test_input_hidden_mismatch(good, tmp_path):
    bad = tmp_path / "hidden.safetensors"
    write_input_file(bad, np.zeros((T, H + 1), np.float32), good.logits)
    _expect_bad(good.run(input_path=bad), r"\binput\b", rf"\b{H}\b")


def test_missing_router_probs(good, tmp_path):
    bad = tmp_path / "no_router.safetensors"
    write_safetensors(bad, {"input": good.x})
    _expect_bad(good.run(input_path=bad), "router_probs")
