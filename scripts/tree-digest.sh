#!/usr/bin/env bash
# Prints a digest of the source tree (every file under the folders that build and test qmoe), so a
# record made on a machine whose copy has no usable git history can still name the exact tree.
# Run it at a commit here and compare with the digest a GPU run printed.
set -euo pipefail
cd "$(dirname "$0")/.."
find CMakeLists.txt cmake include src tests tools scripts -type f \
  -not -path '*/__pycache__/*' -not -path '*/.*' -not -name '*.pyc' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
