#!/usr/bin/env bash
# Builds the GPU suite and the CLI here (sm_90a, into build-gpu) and packs them into the git-ignored
# .gl/, so that a GPU machine runs them without building (QMOE_QUICK_PREBUILT=1 gpu-quick.sh).
# The GPU machine must have the same CUDA toolkit (the binaries link its runtime).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DQMOE_CUDA_LINEINFO=ON >/dev/null
nice -n 5 cmake --build build-gpu -j "${JOBS:-2}" --target qmoe_gpu_tests qmoe_cli
# Both binaries in one xz archive with a dictionary that spans them: their device code is the same
# library's, so the second copy costs almost nothing (a 64 MiB limit on what a run ships). xz -9's
# 64 MiB dictionary is shorter than one binary (72-76 MB) and packed the two in 25.1 MB, where
# one took 12.6; the 512 MiB dictionary of scripts/pack-builds.sh (which packs several builds
# this way) spans them. Single-threaded: threads would cut the input into blocks.
rm -rf build-gpu/pack && mkdir -p build-gpu/pack/tests build-gpu/pack/tools .gl
strip -o build-gpu/pack/tests/qmoe_gpu_tests build-gpu/tests/qmoe_gpu_tests
strip -o build-gpu/pack/tools/qmoe build-gpu/tools/qmoe
tar -C build-gpu/pack -cf - tests tools | xz -T1 --lzma2=preset=9e,dict=512MiB >.gl/bins.tar.xz
git rev-parse --short HEAD >.gl/commit
git status --short >>.gl/commit
ls -la .gl
