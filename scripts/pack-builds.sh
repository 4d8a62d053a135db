#!/usr/bin/env bash
# Packs the binaries of several builds (A/B runs: a baseline and its candidates) into one xz
# archive for a GPU machine that runs them without building:
#   scripts/pack-builds.sh .gl/run1/all.tar.xz base=/tmp/base-bins cand=build-gpu
# Each NAME=DIR takes DIR/tools/qmoe (a build tree) or DIR/qmoe (a folder of binaries), and
# qmoe_gpu_tests beside it where present, stripped, as NAME/qmoe and NAME/qmoe_gpu_tests.
# Unpack there with `xz -dc ARCHIVE | tar -C /tmp/b -xf -` (about 1.5 GiB of memory for the
# dictionary).
# Why one archive with a 512 MiB dictionary: the builds' device code is nearly the same, so the
# second and later binaries compress to almost nothing once the dictionary spans them (five
# binaries of 72-76 MB each: 15.7 MB, where an archive each took 12.6 MB apiece), which keeps a
# run's carried files far under its limit. xz runs single-threaded (threads would cut the input
# into blocks and lose that): about 4 minutes for five binaries.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT.tar.xz NAME=DIR..." >&2; exit 2; }
out="$1"
shift
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
for pair in "$@"; do
  name="${pair%%=*}"
  dir="${pair#*=}"
  if [ "$name" = "$pair" ] || [ -z "$name" ]; then
    echo "expected NAME=DIR, got '$pair'" >&2
    exit 2
  fi
  mkdir -p "$stage/$name"
  found=0
  for bin in qmoe qmoe_gpu_tests; do
    for src in "$dir/tools/$bin" "$dir/tests/$bin" "$dir/$bin"; do
      if [ -f "$src" ]; then
        strip -o "$stage/$name/$bin" "$src"
        found=1
        break
      fi
    done
  done
  [ "$found" = 1 ] || { echo "$name: no qmoe or qmoe_gpu_tests under $dir" >&2; exit 2; }
done
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=9e,dict=512MiB >"$out"
ls -la "$out"
