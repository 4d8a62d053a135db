#!/usr/bin/env bash
# Builds qmoe for sm_90a with every core on a GPU machine and runs the GPU-labelled suite, the
# whole CPU suite and the CLI there. Logs go to $OUT (or ./gpu-check-out). Needs no network: the
# machine must already have cmake, ninja, nvcc, GoogleTest, CLI11 and nlohmann-json.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check-out}"
mkdir -p "$out"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
{
  echo "commit: $commit"
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -1
} 2>&1 | tee "$out/env.txt"

status=0
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
ctest --test-dir build-gpu -L gpu --output-on-failure -j 4 2>&1 | tee "$out/ctest-gpu.log" | tail -5
ctest --test-dir build-gpu -L cpu --output-on-failure -j "$(nproc)" 2>&1 | tee "$out/ctest-cpu.log" | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
build-gpu/tools/qmoe info 2>&1 | tee "$out/info.txt"
build-gpu/tools/qmoe run 2>&1 | tee "$out/run.txt" || status=1
exit $status
