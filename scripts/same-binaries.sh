#!/usr/bin/env bash
# Whether two builds of the qmoe library compiled to the same code: for every object of
# BUILD_A/src/CMakeFiles/qmoe.dir, compares its device SASS (cuobjdump -sass) and its host code
# (objdump -d) with the same object in BUILD_B, after removing what differs between any two
# compilations (source paths, the per-file anonymous-namespace hash, nvcc's temporary file
# names). Prints one line per object and exits non-zero if any differs. Lets a change that must
# not alter compiled code (comments, dead declarations) show that it matches a tree that ran on
# the GPU. Needs cuobjdump (on PATH, or CUOBJDUMP=path) and binutils.
#   scripts/same-binaries.sh build-at-commit-a build-at-commit-b
set -uo pipefail
a="$1/src/CMakeFiles/qmoe.dir"
b="$2/src/CMakeFiles/qmoe.dir"
cuobjdump="${CUOBJDUMP:-cuobjdump}"
norm() {
  sed -E -e '/identifier = /d' -e 's/_GLOBAL__N__[0-9a-f]{8}/_GLOBAL__N__/g' \
    -e 's/tmpxft_[0-9a-f]+_[0-9a-f]+/tmpxft/g'
}
status=0
while IFS= read -r o; do
  [ -f "$b/$o" ] || { echo "$o: missing in $2"; status=1; continue; }
  sass=same
  host=same
  cmp -s <("$cuobjdump" -sass "$a/$o" 2>/dev/null | norm) \
    <("$cuobjdump" -sass "$b/$o" 2>/dev/null | norm) || sass=DIFFERS
  cmp -s <(objdump -d --no-show-raw-insn "$a/$o" | tail -n +3 | norm) \
    <(objdump -d --no-show-raw-insn "$b/$o" | tail -n +3 | norm) || host=DIFFERS
  echo "$o  sass $sass  host $host"
  [ "$sass$host" = samesame ] || status=1
done < <(cd "$a" && find . -name '*.o' | sort)
exit $status
