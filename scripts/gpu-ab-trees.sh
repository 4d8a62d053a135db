#!/usr/bin/env bash
# A/B of two source trees on one machine, so that a change is timed against its base in the same
# process conditions: builds the qmoe CLI of BASE (a copy of another commit's tree, made with
# `git archive <commit> | tar x -C BASE`) into build-base, and this tree's into build-gpu if that
# has none, then for each setting (as in gpu-ab.sh; none given: the defaults) times the base and
# this tree in turn with ab_times over QMOE_AB_PRESET, QMOE_AB_FORMATS and QMOE_AB_TOKENS.
#   scripts/gpu-ab-trees.sh ab-base "" "QMOE_DECODE_TPB=1"
set -uo pipefail
cd "$(dirname "$0")/.."
base="$1"
shift
formats="${QMOE_AB_FORMATS:---format int4;--format int8;--format int2 --block 64}"
tokens="${QMOE_AB_TOKENS:-1,8,16,64}"
log="${OUT:+$OUT/ab.txt}"
source scripts/ab-common.sh

[ -x build-gpu/tools/qmoe ] || build_cli . build-gpu || exit 1
build_cli "$base" build-base || exit 1

echo "tokens $tokens (us, graph replay, cold L2, median of 100); base: $base" |
  tee -a ${log:-/dev/null}
[ $# -gt 0 ] || set -- ""
for setting in "$@"; do
  # shellcheck disable=SC2086
  ab_times "base ${setting:-defaults}" build-base/tools/qmoe $setting
  # shellcheck disable=SC2086
  ab_times "this ${setting:-defaults}" build-gpu/tools/qmoe $setting
done
