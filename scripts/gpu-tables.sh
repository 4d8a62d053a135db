#!/usr/bin/env bash
# The bench rows of the decode and prefill targets (Qwen3-30B-A3B
# INT4 / INT8, Qwen3.6-35B-A3B NVFP4, gpt-oss-20b MXFP4, an INT2 E 512 layer, Mixtral-8x7B,
# DeepSeek-V3 fp8_block with bf16 and with FP8 activations) in one run on a GPU: graph replays,
# cold L2, each case as `qmoe bench` runs it (its header names the commit, device and settings).
# Every row goes to one CSV; a compact table follows (case, tokens, us, % of the read ceiling,
# TFLOP/s, kernel path).
#   scripts/gpu-tables.sh [decode|prefill|all] [CSV]      (default: all, gpu-tables.csv)
#   QMOE_TABLES_BIN=/path/to/qmoe   the CLI to run (default build-gpu/tools/qmoe)
#   QMOE_TABLES_REPEAT=n            timed calls per case (default 50)
# Only the Qwen3-30B-A3B INT4 decode rows are checked against the fp64 oracle (the CPU oracle of a
# 4096-token DeepSeek-V3 layer takes minutes); `qmoe bench` without --no-check checks the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-all}"
csv="${2:-gpu-tables.csv}"
bin="${QMOE_TABLES_BIN:-build-gpu/tools/qmoe}"
repeat="${QMOE_TABLES_REPEAT:-50}"
case "$which" in
  decode | prefill | all) ;;
  *)
    echo "expected decode, prefill or all, got '$which'" >&2
    exit 2
    ;;
esac
[ -x "$bin" ] || {
  echo "no qmoe CLI at $bin (build one: scripts/gpu-check.sh, or set QMOE_TABLES_BIN)" >&2
  exit 2
}
rm -f "$csv"

# run LABEL [VAR=value ...] -- BENCH_ARGS...: one case, its rows appended to the CSV with the label.
# A case that fails (a failed check exits 1 after writing its rows) keeps the rows it wrote and
# does not stop the cases after it; the script's exit status names the failures at the end.
failed=()
run() {
  local label="$1" env_args=()
  shift
  while [ "$1" != "--" ]; do
    env_args+=("$1")
    shift
  done
  shift
  local part
  part="$(mktemp)"
  echo "== $label: ${env_args[*]} qmoe bench $*"
  # The script's own settings are not the layer's: bench would list them among its QMOE_* ones.
  local rc=0
  env -u QMOE_TABLES_BIN -u QMOE_TABLES_REPEAT "${env_args[@]}" "$bin" bench --repeat "$repeat" \
    --csv "$part" "$@" || rc=$?
  [ "$rc" -eq 0 ] || failed+=("$label (exit $rc)")
  python3 - "$part" "$csv" "$label" <<'PY'
import csv, os, sys
part, out, label = sys.argv[1:4]
rows = list(csv.DictReader(open(part))) if os.path.getsize(part) else []
if not rows:
    sys.exit(0)  # the case wrote nothing (it failed before its first row)
new = not os.path.exists(out)
with open(out, "a", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["case"] + list(rows[0].keys()))
    if new:
        w.writeheader()
    for r in rows:
        w.writerow({"case": label, **r})
PY
  rm -f "$part"
}

if [ "$which" != prefill ]; then
  run "qwen3-30b-a3b int4" -- --presets qwen3-30b-a3b --tokens 1,8,64
  run "qwen3-30b-a3b int8" -- --no-check --presets qwen3-30b-a3b --format int8 --tokens 64
  run "qwen3.6-35b-a3b nvfp4" -- --no-check --presets qwen3.6-35b-a3b --format nvfp4 --tokens 4
  run "gpt-oss-20b mxfp4" -- --no-check --presets gpt-oss-20b --tokens 1,8,64
  run "int2 b64 2560x640 E512 k10" -- --no-check --presets qwen3-30b-a3b \
    --shape 2560,640,512,10 --format int2 --block 64 --tokens 8
  run "deepseek-v3 fp8_block" -- --no-check --presets deepseek-v3 --tokens 1,8,64
fi
if [ "$which" != decode ]; then
  run "qwen3-30b-a3b int4" -- --no-check --presets qwen3-30b-a3b --tokens 128,256,512,1024,4096
  run "qwen3-30b-a3b int8" -- --no-check --presets qwen3-30b-a3b --format int8 \
    --tokens 128,512,1024,4096
  run "mixtral-8x7b int4" -- --no-check --presets mixtral-8x7b --tokens 4096
  run "deepseek-v3 fp8_block" -- --no-check --presets deepseek-v3 --tokens 128,512,1024,4096
  run "deepseek-v3 fp8_block, fp8 act" QMOE_ACT_QUANT=fp8_e4m3 -- --no-check \
    --presets deepseek-v3 --tokens 128,512,1024,4096
fi

python3 - "$csv" <<'PY'
import csv, os, sys
rows = list(csv.DictReader(open(sys.argv[1]))) if os.path.exists(sys.argv[1]) else []
num = lambda v, d: f"{float(v):.{d}f}" if v else "-"  # the CPU backend has no read ceiling
print(f"\n{'case':<34} {'tokens':>6} {'us':>10} {'% read':>7} {'TFLOP/s':>8}  path")
for r in rows:
    print(f"{r['case']:<34} {r['tokens']:>6} {num(r['us_median'], 2):>10} "
          f"{num(r['pct_of_read_ceiling'], 1):>7} {num(r['tflops'], 1):>8}  {r.get('path', '')}")
print(f"\nrows: {sys.argv[1]}")
PY
if [ ${#failed[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
