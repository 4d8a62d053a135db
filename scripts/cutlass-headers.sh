#!/usr/bin/env bash
# Copies CUTLASS's headers (include/ and tools/util/include/) from the installed pip package
# nvidia-cutlass into .cutlass/ (git-ignored), where CMake looks first: a checkout carrying
# .cutlass/ builds on a machine without network. Usage: scripts/cutlass-headers.sh [source-root]
# (default: the installed package's cutlass_library/source).
set -euo pipefail
cd "$(dirname "$0")/.."
src="${1:-}"
if [ -z "$src" ]; then
  src="$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')" || {
    echo "cutlass-headers.sh: nvidia-cutlass is not installed;" \
         "run: python3 -m pip install --no-deps -r scripts/requirements-build.txt" >&2
    exit 1
  }
fi
for d in include tools/util/include; do
  [ -d "$src/$d" ] || { echo "cutlass-headers.sh: $src/$d: no such directory" >&2; exit 1; }
done
rm -rf .cutlass.tmp
mkdir -p .cutlass.tmp/tools/util
cp -r "$src/include" .cutlass.tmp/include
cp -r "$src/tools/util/include" .cutlass.tmp/tools/util/include
rm -rf .cutlass
mv .cutlass.tmp .cutlass
echo "CUTLASS headers in .cutlass/ ($(du -sh .cutlass | cut -f1))"
