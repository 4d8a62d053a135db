#!/usr/bin/env bash
# A/B sweep of one environment knob over `qmoe bench` (graph replays, cold L2): for each value,
# runs the bench with VAR=value and prints one line per case (value, tokens, us, % of the read
# ceiling, path). Needs a GPU build in build-gpu (scripts/gpu-check.sh makes one).
#   scripts/gpu-sweep.sh QMOE_DECODE_TPB 1,4,8,16 --presets qwen3-30b-a3b [more bench flags]
set -euo pipefail
cd "$(dirname "$0")/.."
var="$1"
values="$2"
shift 2
csv="$(mktemp)"
for v in ${values//,/ }; do
  rm -f "$csv"
  env "$var=$v" build-gpu/tools/qmoe bench --no-check --csv "$csv" "$@" >/dev/null
  python3 - "$csv" "$var=$v" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f"{sys.argv[2]:>20}  {r['format'][:12]:>12}  T={r['tokens']:>3}  {float(r['us_median']):8.1f} us  "
          f"{float(r['pct_of_read_ceiling']):5.1f}%  {r.get('path', '')}")
PY
done
