#!/usr/bin/env python3
"""Plots the CSV `qmoe bench` writes, roofline style: tokens per call on a log2 axis; left, the GB/s
of expert weights achieved, with each device's measured read ceiling as a horizontal line; right,
microseconds per call (median, with the p10..p90 band). One series per (preset, format), and per
dtype, backend, device, L2 mode or timing mode when the file holds more than one of those.

    python3 scripts/plot_bench.py bench-results.csv [-o bench.png]

Needs matplotlib (python3 -m pip install matplotlib). When the file holds a case more than once
(runs appended to the same CSV), the last row wins."""

import argparse
import csv
import sys
from collections import OrderedDict
from pathlib import Path

REQUIRED = ["preset", "format", "tokens", "gbps", "us_median", "us_p10", "us_p90",
            "read_ceiling_gbps"]
# Columns that split series when they vary within the file.
VARIANTS = ["dtype", "backend", "device", "l2", "graph"]


def fail(message):
    print(f"plot_bench.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def number(row, column, line):
    text = row.get(column, "")
    try:
        return float(text)
    except ValueError:
        fail(f"line {line}: column {column}: expected a number, got {text!r}")


def read_rows(path):
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                fail(f"{path}: not a `qmoe bench` CSV (missing columns: {', '.join(missing)})")
            rows = list(reader)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    if not rows:
        fail(f"{path}: no rows")
    return rows


def series(rows):
    """(label -> {tokens: row}), and the read ceilings (device -> GB/s)."""
    varying = [c for c in VARIANTS if len({r.get(c, "") for r in rows}) > 1]
    out = OrderedDict()
    ceilings = OrderedDict()
    for line, r in enumerate(rows, start=2):
        parts = [r["preset"], r["format"]] + [r.get(c, "") for c in varying]
        label = ", ".join(p for p in parts if p)
        tokens = int(number(r, "tokens", line))
        out.setdefault(label, {})[tokens] = {
            "gbps": number(r, "gbps", line),
            "us": number(r, "us_median", line),
            "p10": number(r, "us_p10", line),
            "p90": number(r, "us_p90", line),
        }
        if r["read_ceiling_gbps"]:
            ceilings[r.get("device", "") or "device"] = number(r, "read_ceiling_gbps", line)
    return out, ceilings


def plot(rows, png):
    try:
        import matplotlib
    except ImportError:
        print("plot_bench.py: matplotlib is not installed; install it with "
              "`python3 -m pip install matplotlib` and run again", file=sys.stderr)
        sys.exit(2)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, ScalarFormatter

    data, ceilings = series(rows)
    fig, (bw, lat) = plt.subplots(1, 2, figsize=(14, 5.5))
    for label, points in data.items():
        t = sorted(points)
        line, = bw.plot(t, [points[x]["gbps"] for x in t], marker="o", label=label)
        lat.plot(t, [points[x]["us"] for x in t], marker="o", color=line.get_color(), label=label)
        lat.fill_between(t, [points[x]["p10"] for x in t], [points[x]["p90"] for x in t],
                         color=line.get_color(), alpha=0.2, linewidth=0)
    for i, (device, gbps) in enumerate(ceilings.items()):
        bw.axhline(gbps, color="black", linestyle=("--", ":", "-.")[i % 3], linewidth=1,
                   label=f"read ceiling {device}: {gbps:.0f} GB/s")
    bw.set_title("weights read: achieved GB/s")
    bw.set_ylabel("GB/s of expert weights touched")
    bw.set_ylim(bottom=0)
    lat.set_title("time per call (median, p10..p90)")
    lat.set_ylabel("us per call")
    lat.set_yscale("log")
    lat.yaxis.set_major_formatter(ScalarFormatter())
    lat.yaxis.set_minor_formatter(ScalarFormatter())
    all_tokens = sorted({t for points in data.values() for t in points})
    for ax in (bw, lat):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(all_tokens))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("tokens per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


def main():
    p = argparse.ArgumentParser(description="Roofline-style plot of `qmoe bench` results.")
    p.add_argument("csv", type=Path, help="CSV written by `qmoe bench --csv`")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="PNG to write (default: the CSV's name with .png)")
    a = p.parse_args()
    plot(read_rows(a.csv), a.output or a.csv.with_suffix(".png"))


if __name__ == "__main__":
    main()
