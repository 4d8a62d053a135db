#!/usr/bin/env bash
# Kernel-level profile of the default preset's decode path with Nsight Compute (speed of light,
# occupancy, launch statistics, clocks), at 1, 8 and 64 tokens, plus the routing kernel's stall
# reasons at one token. Needs a build in build-gpu (gpu-check.sh makes it). Clocks are left alone
# (--clock-control none). Writes $OUT/profile.txt (or ./gpu-check-out/profile.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
dest="${OUT:-gpu-check-out}"
mkdir -p "$dest"
qmoe=build-gpu/tools/qmoe
{
  for t in ${QMOE_PROFILE_TOKENS:-1 8 64}; do
    echo "=== qmoe run --tokens $t (kernels of one call after warm-up)"
    # qmoe run warms up before timing: skip the first calls' kernels, profile one call's worth.
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      --launch-skip 60 --launch-count 5 "$qmoe" run --tokens "$t" --no-check 2>&1 |
      grep -E "^  [a-z_]|Duration|Elapsed Cycles|SM Frequency|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Grid Size|Dynamic Shared|Block Limit (Reg|Shared)"
  done
  echo "=== routing kernel at 1 token: warp states"
  ncu --clock-control none -k regex:fused_routing --launch-skip 20 --launch-count 1 \
    --section WarpStateStats --section SourceCounters "$qmoe" run --tokens 1 --no-check 2>&1 |
    grep -vE "^==PROF==|^\s*$" | tail -60
} >"$dest/profile.txt" 2>&1
head -c 20000 "$dest/profile.txt"
