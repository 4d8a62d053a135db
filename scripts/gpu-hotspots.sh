#!/usr/bin/env bash
# Where a kernel spends its time, per SASS instruction: Nsight Compute's warp-state samples and
# executed-instruction counts for one launch, summarized as the hottest instructions and the
# opcode mix, after the launch's stall reasons, occupancy and shared-memory bank conflicts. Usage:
# scripts/gpu-hotspots.sh KERNEL_REGEX TOKENS [LAUNCH_SKIP]. Needs build-gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
kernel="$1"; tokens="$2"; skip="${3:-20}"
# QMOE_HOT_CMD replaces the profiled `qmoe` command line (default: run --tokens TOKENS --no-check),
# e.g. a `qmoe bench --shape ... --no-graph --warmup 0 --repeat 1` call for shapes no preset has.
read -ra cmd <<<"${QMOE_HOT_CMD:-run --tokens $tokens --no-check}"
rep="$(mktemp -d)/hot"
ncu --clock-control none --set full --import-source yes -k "regex:$kernel" --launch-skip "$skip" \
  --launch-count 1 -f -o "$rep" build-gpu/tools/qmoe "${cmd[@]}" >/dev/null 2>&1
ncu --import "$rep.ncu-rep" --page source --print-source sass --csv >"$rep.csv" 2>&1
ncu --import "$rep.ncu-rep" --page raw --csv >"$rep.raw.csv" 2>&1
# Why warps wait (stall reasons, per issued instruction), how full the SMs are and the shared
# memory's bank conflicts, from the raw metrics of the same launch.
python3 - "$rep.raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr_i = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if hdr_i is None or len(rows) < hdr_i + 3:
    print("no raw metrics"); sys.exit()
hdr, vals = rows[hdr_i], rows[hdr_i + 2]
def val(j):
    try: return float(vals[j].replace(",", ""))
    except ValueError: return None
stalls = []
for j, name in enumerate(hdr):
    if name.startswith("smsp__average_warps_issue_stalled_") and name.endswith("_per_issue_active.ratio"):
        v = val(j)
        if v: stalls.append((v, name[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")]))
print("-- stall reasons (warps stalled per issued instruction)")
print("  " + "  ".join(f"{n} {v:.2f}" for v, n in sorted(stalls, reverse=True)[:10]))
keys = ("sm__warps_active.avg.pct_of_peak", "smsp__issue_active.avg.pct_of_peak",
        "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
        "smsp__inst_executed.sum", "launch__occupancy_limit_registers",
        "launch__occupancy_limit_shared_mem")
print("-- " + "  ".join(f"{hdr[j]} {vals[j]}" for j in range(len(hdr)) if hdr[j] in keys))
PY
python3 - "$rep.csv" "$kernel" "$tokens" <<'PY'
import csv, sys, collections
path, kernel, tokens = sys.argv[1:4]
rows = list(csv.reader(open(path, errors="replace")))
hdr_i = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
if hdr_i is None:
    print("no source table; first lines:"); print("\n".join(",".join(r) for r in rows[:15])); sys.exit()
hdr = rows[hdr_i]
def col(*names):
    for n in names:
        for j, c in enumerate(hdr):
            if n in c: return j
    return None
src, stall, exe = col("Source"), col("Warp Stall Sampling (All"), col("Instructions Executed")
data = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
num = lambda r, j: float(r[j].replace(",", "") or 0) if j is not None else 0.0
tot_s = sum(num(r, stall) for r in data) or 1
tot_e = sum(num(r, exe) for r in data)
print(f"== {kernel} at {tokens} tokens: {len(data)} SASS lines, {tot_e:.0f} warp instructions executed, {tot_s:.0f} stall samples")
print("-- hottest instructions (share of stall samples, executed count, SASS)")
for r in sorted(data, key=lambda r: -num(r, stall))[:30]:
    print(f"{100*num(r, stall)/tot_s:6.2f}% {num(r, exe):10.0f}  {r[src].strip()[:110]}")
print("-- most executed instructions (executed count, share of stall samples, SASS)")
for r in sorted(data, key=lambda r: -num(r, exe))[:40]:
    print(f"{num(r, exe):10.0f} {100*num(r, stall)/tot_s:6.2f}%  {r[src].strip()[:110]}")
print("-- executed by code region (64 SASS lines each, in code order; regions over 1% of the total)")
for b in range(0, len(data), 64):
    part = data[b:b + 64]
    n = sum(num(r, exe) for r in part)
    if n > 0.01 * tot_e:
        sm = sum(num(r, stall) for r in part)
        ops_b = collections.Counter(r[src].strip().lstrip("@!P0123456789 ").split(" ")[0].split(".")[0] for r in part if num(r, exe) > 0)
        print(f"  lines {b:5d}-{b + 63:5d}: {100 * n / tot_e:5.1f}% executed, {100 * sm / tot_s:5.1f}% stalls; " + " ".join(f"{k}:{v}" for k, v in ops_b.most_common(6)))
ops = collections.Counter()
for r in data:
    ops[r[src].strip().split(" ")[0].split(".")[0] if not r[src].strip().startswith("@") else r[src].strip().split(" ")[1].split(".")[0]] += num(r, exe)
print("-- opcode mix (executed)")
print("  ".join(f"{k} {v:.0f}" for k, v in ops.most_common(25)))
PY
