"""Behaviour of `qmoe bench` on the CPU backend (its CSV: columns, values consistent with the
layer's shape and with each other, the header written once when appending; the errors it reports
for bad options) and of scripts/plot_bench.py, which plots that CSV."""

import csv
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ortqmoe import run_cli

PLOT = Path(__file__).resolve().parents[2] / "scripts" / "plot_bench.py"
BAD_USAGE_EXIT = 2
IO_EXIT = 3
UNSUPPORTED_EXIT = 4

COLUMNS = ["preset", "format", "dtype", "tokens", "experts_touched", "bytes_touched", "us_median",
           "us_p10", "us_p90", "gbps", "pct_of_read_ceiling", "tflops", "read_ceiling_gbps",
           "error", "backend", "device", "graph", "l2", "hidden", "inter", "experts", "top_k",
           "shared", "path", "commit", "settings", "time_utc"]

# The smallest preset: Qwen3-30B-A3B, H 2048, I 768, 128 experts,
# top-8, SwiGLU fused into FC1, INT4 in blocks of 128 by default. Synthesizing it takes ~5 s on two
# cores, so the runs below keep to a few short cases.
PRESET = "qwen3-30b-a3b"
H, I, E, TOP_K = 2048, 768, 128, 8
INT4_WEIGHT_BYTES = (2 * I * H + H * I) // 2  # one expert's packed 4-bit FC1 and FC2 weights


def _rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def _close(a, b, rel, abs_tol=0.0):
    return abs(a - b) <= max(rel * abs(b), abs_tol)


def test_bench_cpu_csv(cli, tmp_path, seed):
    out = tmp_path / "bench.csv"
    base = ["bench", "--backend", "cpu", "--presets", PRESET, "--seed", seed, "--csv", out]
    r = run_cli(cli, base + ["--tokens", "1,2", "--repeat", "2", "--warmup", "1"], timeout=180)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    fields, rows = _rows(out)
    missing = [c for c in COLUMNS if c not in fields]
    assert not missing, f"CSV lacks columns {missing}: {fields}"
    assert [int(row["tokens"]) for row in rows] == [1, 2], rows

    for row in rows:
        t = int(row["tokens"])
        case = f"tokens {t}: {row}"
        assert row["preset"] == PRESET and row["backend"] == "cpu", case
        assert row["dtype"] == "bf16" and "int4" in row["format"], case
        assert row["graph"] == "no" and row["l2"] == "warm", case
        # The CPU has no read ceiling: those columns stay empty rather than holding a made-up 0.
        assert row["pct_of_read_ceiling"] == "" and row["read_ceiling_gbps"] == "", case

        touched = int(row["experts_touched"])
        assert TOP_K <= touched <= min(E, t * TOP_K), case
        if t == 1:
            assert touched == TOP_K, case  # one token's top-8 are 8 distinct experts
        per_expert = int(row["bytes_touched"]) / touched
        # Packed weights plus scales (one f32 per 128 weights adds 1/16 of the packed bytes).
        assert INT4_WEIGHT_BYTES <= per_expert <= 1.1 * INT4_WEIGHT_BYTES, case

        p10, med, p90 = float(row["us_p10"]), float(row["us_median"]), float(row["us_p90"])
        assert 0 < p10 <= med <= p90, case
        assert _close(float(row["gbps"]), int(row["bytes_touched"]) / med / 1e3, 0.01,
                      abs_tol=2e-3), case
        flops = t * TOP_K * (2 * H * 2 * I + 2 * I * H)
        assert _close(float(row["tflops"]), flops / med / 1e6, 0.01, abs_tol=2e-5), case

        assert row["check"] == "pass", case
        assert 0 <= float(row["error"]) <= float(row["budget"]) <= 1e-2, case
        assert f"{t:8d}" in r.stdout, f"no table row for {t} tokens:\n{r.stdout}"

    # A second run appends its rows under the same header; --no-check leaves the error empty.
    r = run_cli(cli, base + ["--tokens", "1", "--repeat", "1", "--warmup", "0", "--no-check"],
                timeout=180)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    text = out.read_text()
    assert text.count("us_median") == 1, f"header written more than once:\n{text}"
    _, rows = _rows(out)
    assert len(rows) == 3, text
    assert rows[2]["error"] == "" and rows[2]["check"] == "skipped", rows[2]


def test_bench_shape_override(cli, tmp_path, seed):
    """--shape runs a preset's routing and activation at another size (here the INT2 shape of the
    decode targets, scaled down in H and I to stay fast on the CPU): E and k are honoured."""
    out = tmp_path / "bench.csv"
    r = run_cli(cli, ["bench", "--backend", "cpu", "--presets", PRESET, "--shape", "256,64,512,10",
                      "--format", "int2", "--block", "64", "--tokens", "1", "--repeat", "1",
                      "--seed", seed, "--csv", out], timeout=120)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    _, rows = _rows(out)
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["preset"] == PRESET + "@256x64x512k10", row
    assert int(row["experts_touched"]) == 10, row  # one token, top-10 of 512
    assert "int2 b64" in row["format"] and row["check"] == "pass", row
    assert (row["hidden"], row["inter"], row["experts"], row["top_k"]) == ("256", "64", "512", "10")
    bad = run_cli(cli, ["bench", "--backend", "cpu", "--shape", "256,64,8,10", "--tokens", "1",
                        "--csv", tmp_path / "bad.csv"])
    assert bad.returncode == BAD_USAGE_EXIT and "--shape" in bad.stderr, bad.stderr


def test_bench_cuda_csv(cli, tmp_path, seed):
    """On a GPU machine: graph replays with a cold L2, then eager calls with a warm one."""
    out = tmp_path / "bench.csv"
    base = ["bench", "--backend", "cuda", "--presets", PRESET, "--seed", seed, "--csv", out,
            "--tokens", "1,16", "--repeat", "20", "--warmup", "2"]
    r = run_cli(cli, base, timeout=300)
    if r.returncode == UNSUPPORTED_EXIT and "unsupported" in r.stderr:
        pytest.skip(f"no CUDA backend here: {r.stderr.strip()}")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    r = run_cli(cli, base + ["--no-graph", "--warm-l2"], timeout=300)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    _, rows = _rows(out)
    assert [(row["tokens"], row["graph"], row["l2"]) for row in rows] == [
        ("1", "yes", "cold-read"), ("16", "yes", "cold-read"), ("1", "no", "warm"),
        ("16", "no", "warm")]
    for row in rows:
        case = str(row)
        assert row["backend"] == "cuda" and row["device"], case
        ceiling = float(row["read_ceiling_gbps"])
        assert 500 < ceiling < 20000, case  # HBM of any Hopper part
        gbps, pct = float(row["gbps"]), float(row["pct_of_read_ceiling"])
        assert _close(pct, gbps / ceiling * 100, 0.01, abs_tol=0.01), case
        # Cold-L2 calls cannot read their weights faster than the device reads memory.
        if row["l2"].startswith("cold"):
            assert 0 < pct <= 105, case  # 5% for the noise of two measurements
        p10, med, p90 = float(row["us_p10"]), float(row["us_median"]), float(row["us_p90"])
        assert 0 < p10 <= med <= p90, case
        assert row["check"] == "pass" and float(row["error"]) <= float(row["budget"]), case


@pytest.mark.parametrize("args, words", [
    (["--tokens", "0"], ["--tokens", "0"]),
    (["--tokens", "1,0,4"], ["--tokens", "0"]),
    (["--tokens", "two"], ["--tokens"]),
    (["--presets", "no-such-model"], ["--presets", "no-such-model", PRESET]),
    (["--presets", f"{PRESET},no-such-model"], ["--presets", "no-such-model"]),
    (["--dtype", "f64"], ["--dtype", "f64"]),
    (["--backend", "tpu"], ["--backend", "tpu"]),
    (["--repeat", "-1"], ["--repeat"]),
    (["--format", "int5"], ["--format", "int5"]),
    (["--cold-l2", "--warm-l2"], ["--cold-l2", "--warm-l2"]),
    (["--cold-l2"], ["--cold-l2", "CUDA"]),
])
def test_bench_rejects_bad_options(cli, tmp_path, args, words):
    out = tmp_path / "bench.csv"
    backend = [] if "--backend" in args else ["--backend", "cpu"]
    r = run_cli(cli, ["bench", "--csv", out] + backend + args)
    assert r.returncode == BAD_USAGE_EXIT, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "error" in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, f"{args}: the message does not name {w!r}: {r.stderr}"
    assert not out.exists(), f"{args}: a CSV was written before the options were checked"


def test_bench_refuses_csv_with_other_columns(cli, tmp_path):
    out = tmp_path / "other.csv"
    out.write_text("a,b\n1,2\n")
    r = run_cli(cli, ["bench", "--backend", "cpu", "--tokens", "1", "--csv", out])
    assert r.returncode == BAD_USAGE_EXIT, f"{r.stdout}\n{r.stderr}"
    assert "--csv" in r.stderr and str(out) in r.stderr, r.stderr
    assert out.read_text() == "a,b\n1,2\n", "the foreign CSV was modified"


# ---------------------------------------------------------------------------------------------
# scripts/plot_bench.py
# ---------------------------------------------------------------------------------------------

def _write_bench_csv(path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for fmt, scale in [("fc1 int4 b128, fc2 int4 b128", 1.0), ("fc1 int8 b128, fc2 int8 b128",
                                                                  1.8)]:
            for t in [1, 2, 4, 8]:
                us = scale * (20 + 2 * t)
                row = dict.fromkeys(COLUMNS, "")
                row.update(preset=PRESET, format=fmt, dtype="bf16", tokens=t, us_median=us,
                           us_p10=0.9 * us, us_p90=1.2 * us, gbps=100 * t, read_ceiling_gbps=4000,
                           backend="cuda", device="GPU", graph="yes", l2="cold")
                w.writerow(row)


def _plot(args, env=None):
    return subprocess.run([sys.executable, str(PLOT)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    data, png = tmp_path / "b.csv", tmp_path / "b.png"
    _write_bench_csv(data)
    r = _plot([data, "-o", png])
    assert r.returncode == 0, r.stderr
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 400 and height > 200, (width, height)


def test_plot_without_matplotlib_says_so(tmp_path):
    # A package that fails to import stands in for a missing matplotlib.
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    data = tmp_path / "b.csv"
    _write_bench_csv(data)
    env = dict(os.environ, PYTHONPATH=str(shim.parent))
    r = _plot([data, "-o", tmp_path / "b.png"], env=env)
    assert r.returncode == 2, f"{r.stdout}\n{r.stderr}"
    assert "matplotlib" in r.stderr and "pip install" in r.stderr, r.stderr
    assert not (tmp_path / "b.png").exists()


def test_plot_rejects_other_csv(tmp_path):
    data = tmp_path / "x.csv"
    data.write_text("a,b\n1,2\n")
    r = _plot([data])
    assert r.returncode == 2, r.stderr
    assert "missing columns" in r.stderr and "tokens" in r.stderr, r.stderr
