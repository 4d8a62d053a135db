#!/usr/bin/env bash
# What each decode technique buys: builds the CLI once per ablation (src/CMakeLists.txt,
# QMOE_DECODE_ABLATION: no_windows, no_kpair, ring2, ring4, scalar_scales; each removes or
# changes one technique)
# in build-ablate-NAME, and times it with `qmoe bench` like scripts/gpu-ab.sh (formats in
# QMOE_AB_FORMATS, token counts in QMOE_AB_TOKENS), after the normal build in build-gpu as the
# baseline. Lines print as they are measured and go to $OUT/ablations.txt when OUT is set.
#   scripts/gpu-ablations.sh [NAME...]     (default: all five)
set -uo pipefail
cd "$(dirname "$0")/.."
formats="${QMOE_AB_FORMATS:---format int4;--format int2 --block 64}"
tokens="${QMOE_AB_TOKENS:-1,8,64}"
log="${OUT:+$OUT/ablations.txt}"
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(no_windows no_kpair ring2 ring4 scalar_scales)
source scripts/ab-common.sh
echo "tokens $tokens (us, graph replay, cold L2, median of 100)" | tee -a ${log:-/dev/null}
[ -x build-gpu/tools/qmoe ] && ab_times baseline build-gpu/tools/qmoe
for n in "${names[@]}"; do
  dir="build-ablate-$n"
  build_cli . "$dir" -DQMOE_BUILD_TESTS=OFF -DQMOE_DECODE_ABLATION="$n" ||
    { echo "$n: build failed"; continue; }
  ab_times "$n" "$dir/tools/qmoe"
done
