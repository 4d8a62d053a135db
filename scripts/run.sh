#!/usr/bin/env bash
# Builds qmoe and runs its default job: one MoE layer of a real model shape (Qwen3-30B-A3B,
# INT4 block 128, 16 tokens) on the best backend present, checked against the fp64 oracle.
# Extra arguments go to `qmoe run` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_BUILD_TESTS=OFF >/dev/null
cmake --build build --target qmoe_cli -j "$(nproc)"
build/tools/qmoe run "$@"
