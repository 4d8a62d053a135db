#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: the safetensors header parser, the whole layer-file
# reader and the checkpoint JSON files; AddressSanitizer and UBSan on) with clang into build-fuzz,
# then runs each for QMOE_FUZZ_SECONDS (default 30) from its seed corpus in
# tests/fuzz/corpus/<target>/. New inputs go
# to a scratch copy, never into the repository; a crash, leak, sanitizer report or timeout fails
# the script and leaves the input that caused it in build-fuzz/artifacts/. Prints each target's
# executions and coverage.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${QMOE_FUZZ_SECONDS:-30}"
jobs="$(nproc)"

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DQMOE_FUZZ=ON -DQMOE_CUDA=OFF -DQMOE_BUILD_TESTS=OFF -DQMOE_BUILD_TOOLS=OFF >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_safetensors fuzz_layer_file fuzz_checkpoint_json

mkdir -p build-fuzz/artifacts
# The targets run side by side (each fuzzer is one process): the whole run takes one target's time.
targets=(fuzz_safetensors fuzz_layer_file fuzz_checkpoint_json)
pids=()
for target in "${targets[@]}"; do
  work="build-fuzz/corpus-$target"
  rm -rf "$work"
  cp -r "tests/fuzz/corpus/$target" "$work"
  "build-fuzz/tests/fuzz/$target" "$work" -max_total_time="$seconds" -max_len=65536 \
    -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/artifacts/ >"build-fuzz/$target.log" 2>&1 &
  pids+=("$!")
done
failed=0
for i in "${!targets[@]}"; do
  target="${targets[$i]}"
  log="build-fuzz/$target.log"
  if ! wait "${pids[$i]}"; then
    tail -40 "$log"
    echo "fuzz: $target failed; the input is in build-fuzz/artifacts/" >&2
    failed=1
    continue
  fi
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
  cov="$(grep -o 'cov: [0-9]*' "$log" | tail -1)"
  echo "fuzz: $target ${seconds} s, ${runs:-?} inputs, ${cov:-cov: ?}, no failures"
done
exit "$failed"
