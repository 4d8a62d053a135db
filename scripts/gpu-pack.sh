#!/usr/bin/env bash
# Builds the GPU suite and the CLI here (sm_90a, into build-gpu) and gzips them into the git-ignored
# .gl/, so that a GPU machine runs them without building (QMOE_QUICK_PREBUILT=1 gpu-quick.sh).
# The GPU machine must have the same CUDA toolkit (the binaries link its runtime).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
nice -n 5 cmake --build build-gpu -j "${JOBS:-2}" --target qmoe_gpu_tests qmoe_cli
mkdir -p .gl
gzip -c build-gpu/tests/qmoe_gpu_tests >.gl/qmoe_gpu_tests.gz
gzip -c build-gpu/tools/qmoe >.gl/qmoe.gz
git rev-parse --short HEAD >.gl/commit
git status --short >>.gl/commit
ls -la .gl
