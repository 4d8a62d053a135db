#!/usr/bin/env bash
# The quick check on a GPU machine, for one change: builds the GPU suite and the CLI for sm_90a with
# every core (into build-gpu, reused when present), runs the GPU tests that match a filter, then
# each bench command given. The full check (every suite, sanitizers, every bench) is gpu-check.sh.
#   scripts/gpu-quick.sh 'GpuDispatch.*:GpuDecode.*' 'bench --presets qwen3-30b-a3b --tokens 1,8'
#   QMOE_QUICK_FILTER  the gtest filter ('-' skips the tests; default: every GPU test)
# Arguments after the filter are qmoe command lines (without the program name), run in order.
# Logs go to $OUT (or ./gpu-quick-out); the exit status is non-zero if anything failed.
# A machine without GoogleTest, CLI11 or nlohmann-json takes them from .deps/*.deb (Debian
# packages fetched with `apt-get download libgtest-dev libgmock-dev libcli11-dev
# nlohmann-json3-dev` into a git-ignored .deps/), unpacked under /tmp, never over the system.
set -uo pipefail
cd "$(dirname "$0")/.."
dest="${OUT:-gpu-quick-out}"
mkdir -p "$dest"
filter="${1:-*}"
shift || true

prefix=()
if [ ! -f /usr/include/gtest/gtest.h ] && compgen -G ".deps/*.deb" >/dev/null; then
  mkdir -p /tmp/qmoe-deps
  for f in .deps/*.deb; do dpkg -x "$f" /tmp/qmoe-deps; done
  prefix=(-DCMAKE_PREFIX_PATH=/tmp/qmoe-deps/usr)
fi

status=0
step() { echo "== $1: $2" | tee -a "$dest/summary.txt"; [ "$2" = ok ] || status=1; }

{
  git rev-parse --short HEAD 2>/dev/null || echo "(no git)"
  git status --short 2>/dev/null | head -20
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  nvcc --version | tail -1
} >"$dest/env.txt" 2>&1
cat "$dest/env.txt"

t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a "${prefix[@]}" >"$dest/configure.log" 2>&1 ||
  { tail -30 "$dest/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target qmoe_gpu_tests qmoe_cli >"$dest/build.log" 2>&1 ||
  { grep -E "error|Error" "$dest/build.log" | head -40; exit 1; }
step "build ($(( $(date +%s) - t0 )) s)" ok

if [ "$filter" != "-" ]; then
  t0=$(date +%s)
  build-gpu/tests/qmoe_gpu_tests --gtest_filter="$filter" >"$dest/gpu-tests.log" 2>&1
  rc=$?
  grep -E "^\[  (FAILED|PASSED) |^\[==========\]|Failure|error:" "$dest/gpu-tests.log" | head -40
  step "gpu tests '$filter' ($(( $(date +%s) - t0 )) s)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
fi

for cmd in "$@"; do
  t0=$(date +%s)
  # shellcheck disable=SC2086
  build-gpu/tools/qmoe $cmd >>"$dest/bench.txt" 2>&1
  rc=$?
  step "qmoe $cmd ($(( $(date +%s) - t0 )) s)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
done
[ -f "$dest/bench.txt" ] && cat "$dest/bench.txt"
exit $status
