#!/usr/bin/env bash
# Builds qmoe and runs every test: the GoogleTest suite and the Python suites (CLI behaviour,
# onnxruntime conformance; the qmoe Python package, torch operator and transformers models
# against the module built into build/python) through ctest, then the CPU suite again under
# AddressSanitizer and UndefinedBehaviorSanitizer, the concurrency tests under ThreadSanitizer,
# and the fuzz targets from their seed corpora. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs="$(nproc)"

# The python3 on PATH is the one install-deps.sh gave the test packages to.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" \
  -DQMOE_PYTHON=ON
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQMOE_SANITIZE=ON \
  -DQMOE_CUDA=OFF
cmake --build build-sanitize --target qmoe_tests -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize -L cpu --output-on-failure -j "$jobs"

# The concurrency tests (one prepared layer run from several threads, the CPU worker pool's
# concurrent callers) under ThreadSanitizer, which fails them on any data race. CPU only, and
# only those tests: the rest of the suite is single-threaded at the API and covered above.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQMOE_TSAN=ON -DQMOE_CUDA=OFF
cmake --build build-tsan --target qmoe_tests -j "$jobs"
# setarch -R where the kernel lets us: ThreadSanitizer's shadow memory needs an address layout that
# randomization with many entropy bits (recent kernels) can break; containers may forbid it.
tsan_run=(build-tsan/tests/qmoe_tests --gtest_filter='Concurrency.*')
if setarch "$(uname -m)" -R true 2>/dev/null; then tsan_run=(setarch "$(uname -m)" -R "${tsan_run[@]}"); fi
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "${tsan_run[@]}"

# The libFuzzer targets (safetensors header, layer file) from their seed corpora, 20 s each: every
# input must give an error or a finite run, never a crash, a sanitizer report or a hang.
QMOE_FUZZ_SECONDS="${QMOE_FUZZ_SECONDS:-20}" scripts/fuzz.sh
