# Sourced by scripts/gpu-ab.sh, gpu-ab-trees.sh and gpu-ablations.sh (not run on its own).
#   ab_times LABEL BIN [VAR=value ...]
# times `BIN bench` on $QMOE_AB_PRESET (default qwen3-30b-a3b; graph replays, cold L2, no oracle
# check) for each format of $formats (';'-separated bench flags) at the token counts of $tokens,
# with the environment settings given, and prints one line per format: the label, the flags and
# the median us per token count; each line is appended to $log too when that is set.
ab_times() {
  local label="$1" bin="$2" csv f
  shift 2
  csv="$(mktemp)"
  IFS=';' read -ra fmts <<<"$formats"
  for f in "${fmts[@]}"; do
    rm -f "$csv"
    # shellcheck disable=SC2086
    env "$@" "$bin" bench --presets "${QMOE_AB_PRESET:-qwen3-30b-a3b}" $f --tokens "$tokens" \
      --no-check --csv "$csv" >/dev/null 2>&1 ||
      { echo "$label | $f | FAILED" | tee -a "${log:-/dev/null}"; continue; }
    python3 - "$csv" "$label" "$f" <<'PY' | tee -a "${log:-/dev/null}"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cells = "  ".join(f"{r['tokens']}:{float(r['us_median']):.1f}" for r in rows)
print(f"{sys.argv[2]:<48} | {sys.argv[3]:<24} | {cells}", flush=True)
PY
  done
  rm -f "$csv"
}

#   build_cli SOURCE BUILD_DIR [CMAKE_ARG ...]
# configures SOURCE for sm_90a into BUILD_DIR (Release, CUDA on, the extra cmake arguments) and
# builds the qmoe CLI with every core; logs go to BUILD_DIR.configure.log and .build.log, whose
# tails it prints on failure (non-zero status).
build_cli() {
  local src="$1" dir="$2"
  shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DQMOE_CUDA_LINEINFO=ON "$@" >"$dir.configure.log" 2>&1 &&
    cmake --build "$dir" -j "$(nproc)" --target qmoe_cli >"$dir.build.log" 2>&1 ||
    { tail -40 "$dir.configure.log" "$dir.build.log"; return 1; }
}
