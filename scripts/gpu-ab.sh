#!/usr/bin/env bash
# A/B table of environment settings over `qmoe bench` (graph replays, cold L2): each argument is
# one setting ("" for the defaults, or "VAR=value VAR2=value"); for each, every format of
# QMOE_AB_FORMATS (';'-separated bench flags, default int4, int8 and int2 b64) runs at the token
# counts of QMOE_AB_TOKENS (default 1,8,16,64) on QMOE_AB_PRESET (default qwen3-30b-a3b). Prints a
# line per setting and format as soon as it is measured (us per token count) and appends it to
# $OUT/ab.txt when OUT is set. Needs a GPU build in build-gpu (scripts/gpu-check.sh makes one).
#   scripts/gpu-ab.sh "" "QMOE_DECODE_TPB=4" "QMOE_DECODE_RING=2 QMOE_DECODE_TPB=8"
set -uo pipefail
cd "$(dirname "$0")/.."
formats="${QMOE_AB_FORMATS:---format int4;--format int8;--format int2 --block 64}"
tokens="${QMOE_AB_TOKENS:-1,8,16,64}"
log="${OUT:+$OUT/ab.txt}"
source scripts/ab-common.sh
echo "tokens $tokens (us, graph replay, cold L2, median of 100)" | tee -a ${log:-/dev/null}
for setting in "$@"; do
  # shellcheck disable=SC2086
  ab_times "${setting:-defaults}" build-gpu/tools/qmoe $setting
done
