#!/usr/bin/env bash
# Kernel timeline of graph replays with Nsight Systems: for `qmoe bench` at each token count of
# QMOE_TIMELINE_TOKENS (default "1 8"), the kernels of the last timed replays with their start
# relative to the replay's first kernel, duration and the gap before each -- where the layer's time
# goes between launches, which per-kernel profilers (each kernel alone) cannot show. Needs a build
# in build-gpu (gpu-check.sh makes it), or the CLI in QMOE_TIMELINE_BIN; extra arguments go to
# `qmoe bench`.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v nsys >/dev/null || { echo "gpu-timeline: nsys not found"; exit 0; }
tmp="$(mktemp -d)"
for t in ${QMOE_TIMELINE_TOKENS:-1 8}; do
  echo "=== qmoe bench --tokens $t $*"
  nsys profile --cuda-graph-trace=node -t cuda -o "$tmp/tl$t" --force-overwrite true \
    "${QMOE_TIMELINE_BIN:-build-gpu/tools/qmoe}" bench --presets qwen3-30b-a3b --tokens "$t" --no-check "$@" \
    >"$tmp/bench$t.txt" 2>&1 || { tail -5 "$tmp/bench$t.txt"; continue; }
  grep -E "^ +[0-9]+ " "$tmp/bench$t.txt"
  nsys stats -q -r cuda_gpu_trace -f csv -o "$tmp/tr$t" "$tmp/tl$t.nsys-rep" >/dev/null 2>&1
  python3 - "$tmp/tr${t}_cuda_gpu_trace.csv" <<'PY'
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def name(r):
    n = r.get("Name", "")
    m = re.search(r"(\w+_kernel|\w+Kernel|memset|memcpy)", n, re.I)
    return (m.group(1) if m else n)[:28]
ev = [(int(r["Start (ns)"]), int(r["Duration (ns)"]), name(r)) for r in rows]
ev.sort()
# A replay starts at the first kernel after an L2 flush: the bench's read pass (read_sum_kernel,
# the default) or its memset (--l2-flush write).
def is_flush(n):
    return "memset" in n.lower() or "read_sum" in n
starts = [i + 1 for i, e in enumerate(ev) if is_flush(e[2]) and i + 1 < len(ev)]
for s in starts[-3:]:
    end = next((j for j in range(s, len(ev)) if is_flush(ev[j][2])), len(ev))
    t0 = ev[s][0]
    prev_end = t0
    print(f"  replay: {(ev[end-1][0] + ev[end-1][1] - t0) / 1000:.2f} us from first start to last end")
    for st, d, n in ev[s:end]:
        print(f"    {n:28s} start {(st - t0) / 1000:7.2f}  dur {d / 1000:6.2f}  gap {(st - prev_end) / 1000:6.2f}")
        prev_end = max(prev_end, st + d)
PY
done
rm -rf "$tmp"
