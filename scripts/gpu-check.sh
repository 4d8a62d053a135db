#!/usr/bin/env bash
# Builds qmoe for sm_90a with every core on a GPU machine, then runs: the GPU suite (ctest -L gpu),
# a subset of it under compute-sanitizer memcheck and racecheck, the whole CPU suite, `qmoe info`
# and `qmoe run` on the default preset at 1, 8, 64 and 4096 tokens. Logs go to $OUT (or
# ./gpu-check-out): summary.txt, env.txt and every log in gpu-check-logs.tar.gz; the exit status is
# non-zero if anything failed. Needs no network: the machine
# must already have cmake, ninja, nvcc, GoogleTest, CLI11 and nlohmann-json.
#   QMOE_GPU_CHECK_SKIP_SANITIZER=1  skips the sanitizer runs.
#   QMOE_GPU_JOBS=n                   GPU test processes side by side (default 4).
set -uo pipefail
cd "$(dirname "$0")/.."
dest="${OUT:-gpu-check-out}"
mkdir -p "$dest"
out="$(mktemp -d)"
trap 'cp "$out/summary.txt" "$out/env.txt" "$dest/" 2>/dev/null; tar czf "$dest/gpu-check-logs.tar.gz" -C "$out" .' EXIT
{
  echo "tree digest: $(scripts/tree-digest.sh) (scripts/tree-digest.sh at a commit gives the same)"
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -1
} 2>&1 | tee "$out/env.txt"

status=0
step() { echo "== $1: $2" | tee -a "$out/summary.txt"; [ "$2" = ok ] || status=1; }

t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DQMOE_CUDA_LINEINFO=ON >"$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -60 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"

t0=$(date +%s)
# Four test processes share the GPU (QMOE_GPU_JOBS): faster, and a load like a busy server's,
# under which a test's own ordering mistakes show (four suites side by side found the tests'
# legacy-stream race, bench/results/2026-12-06-h100-finalize-counters-and-tests-race.md).
ctest --test-dir build-gpu -L gpu --output-on-failure -j "${QMOE_GPU_JOBS:-4}" >"$out/ctest-gpu.log" 2>&1
rc=$?
tail -4 "$out/ctest-gpu.log"
grep -E "Failed|\*\*\*" "$out/ctest-gpu.log" | head -40
step "gpu suite ($(( $(date +%s) - t0 )) s)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"

if [ "${QMOE_GPU_CHECK_SKIP_SANITIZER:-0}" != 1 ]; then
  tests=build-gpu/tests/qmoe_gpu_tests
  memcheck_filter='GpuDecodeFp4.WindowEdge:GpuDecodeFp4.ShapesAndMixes:GpuDecodeFp4.SharedMemoryTradesKeepTheBits:GpuDequant.Fp4FromThePackedCopy:GpuDecode.RowsPerPassKeepTheBits:GpuDecode.WindowEdgesAndShapes:GpuDecode.TilesPerBlockChoices:GpuDecode.RoutingOptions:GpuLayer.OddShapes:GpuLayer.RoutingMethods:GpuContract.*:GpuDequant.Fp4AndFp8Layouts:GpuGemm.*:DeviceRouting.*'
  racecheck_filter='GpuDecode.WindowEdgesAndShapes:GpuDecode.TilesPerBlockChoices:GpuLayer.OddShapes:GpuLayer.ExpertsAndTopK:GpuContract.GraphReplayEqualsEager:GpuGemm.*:DeviceRouting.TokenCountsMatchHost:DeviceRouting.ExpertCountsAndTopKMatchHost:DeviceRouting.PlanMatchesHostOnEveryPath'
  t0=$(date +%s)
  compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 \
    "$tests" --gtest_filter="$memcheck_filter" >"$out/memcheck.log" 2>&1
  rc=$?
  tail -3 "$out/memcheck.log"
  step "memcheck ($(( $(date +%s) - t0 )) s)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
  t0=$(date +%s)
  compute-sanitizer --tool racecheck --error-exitcode 3 \
    "$tests" --gtest_filter="$racecheck_filter" >"$out/racecheck.log" 2>&1
  rc=$?
  tail -3 "$out/racecheck.log"
  step "racecheck ($(( $(date +%s) - t0 )) s)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
fi

ctest --test-dir build-gpu -L cpu --output-on-failure -j "$(nproc)" >"$out/ctest-cpu.log" 2>&1
rc=$?
tail -3 "$out/ctest-cpu.log"
step "cpu suite" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"

build-gpu/tools/qmoe info >"$out/info.txt" 2>&1
for t in 1 8 64 4096; do
  check=""
  [ "$t" -gt 64 ] && check="--no-check"
  build-gpu/tools/qmoe run --tokens "$t" $check >"$out/run-$t.txt" 2>&1
  rc=$?
  echo "-- qmoe run --tokens $t $check"; grep -E "^(time|stages|rate|check|weights)" "$out/run-$t.txt"
  step "qmoe run --tokens $t" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
done
# Decode benchmark: graph replays, cold L2, the read ceiling measured in the same process.
for fmt in "" "--format int8" "--format int2 --block 64"; do
  build-gpu/tools/qmoe bench --presets qwen3-30b-a3b $fmt --csv "$dest/bench.csv" \
    >>"$out/bench.txt" 2>&1
  rc=$?
  step "qmoe bench ${fmt:-int4}" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
done
# The INT2 decode target's shape (H 2560, I 640, E 512, k 10, block 64).
build-gpu/tools/qmoe bench --presets qwen3-30b-a3b --shape 2560,640,512,10 --format int2 \
  --block 64 --tokens 1,8,64 --csv "$dest/bench.csv" >>"$out/bench.txt" 2>&1
rc=$?
step "qmoe bench int2 E512" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
# Mixtral-8x7B at a few tokens: 8 experts and a long FC2 (K 14336), where the decode kernel's
# tiles per block and rows per pass matter most.
build-gpu/tools/qmoe bench --presets mixtral-8x7b --tokens 1,2,4,8 --csv "$dest/bench.csv" \
  >>"$out/bench.txt" 2>&1
rc=$?
step "qmoe bench mixtral-8x7b" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
# FP4: Qwen3.6-35B-A3B in NVFP4 (the 4-token target) and gpt-oss-20b in MXFP4 (its checkpoint's
# format), every token count of the decode window; f16 activations too.
for args in "--presets qwen3.6-35b-a3b --format nvfp4" "--presets gpt-oss-20b" \
  "--presets qwen3.6-35b-a3b --format mxfp4" "--presets qwen3.6-35b-a3b --format nvfp4 --dtype f16"; do
  build-gpu/tools/qmoe bench $args --csv "$dest/bench.csv" >>"$out/bench.txt" 2>&1
  rc=$?
  step "qmoe bench $args" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
done
cat "$out/bench.txt"
exit $status
