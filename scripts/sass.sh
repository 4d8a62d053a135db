#!/usr/bin/env bash
# The SASS of a binary or object file, on any machine: the toolkit's cuobjdump where it has one,
# else NVIDIA's cuobjdump and nvdisasm from PyPI (pinned below, unpacked once into the git-ignored
# .sass-tools/; they read sm_90a code built by nvcc 13.0). With only a file it prints the SASS;
# with more arguments they go to scripts/sass-loops.py, which counts each kernel's mma loops:
#   scripts/sass.sh build-gpu/tools/qmoe > sass.txt
#   scripts/sass.sh build-gpu/src/CMakeFiles/qmoe.dir/cuda/decode/decode_b4.cu.o --match decode
# (cuobjdump -sass of the whole CLI takes about a minute and 500 MB of text.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/sass.sh FILE [sass-loops.py options]"; exit 2; }
file="$1"
shift
[ -f "$file" ] || { echo "sass.sh: $file: no such file"; exit 2; }

version=13.2.51
tools=.sass-tools/nvidia/cu13/bin
if command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null; then
  dump=(cuobjdump)
else
  if [ ! -x "$tools/cuobjdump" ] || [ ! -x "$tools/nvdisasm" ]; then
    mkdir -p .sass-tools/wheels
    python3 -m pip download -q --no-deps -d .sass-tools/wheels \
      "nvidia-cuda-cuobjdump==$version" "nvidia-cuda-nvdisasm==$version"
    for w in .sass-tools/wheels/*.whl; do python3 -m zipfile -e "$w" .sass-tools; done
    chmod +x "$tools/cuobjdump" "$tools/nvdisasm"
  fi
  dump=(env PATH="$PWD/$tools:$PATH" "$tools/cuobjdump")
fi

if [ $# -eq 0 ]; then
  "${dump[@]}" -sass "$file"
else
  "${dump[@]}" -sass "$file" | python3 scripts/sass-loops.py - "$@"
fi
