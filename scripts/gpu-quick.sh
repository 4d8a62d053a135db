#!/usr/bin/env bash
# The quick check on a GPU machine, for one change: builds the GPU suite and the CLI for sm_90a with
# every core (into build-gpu, reused when present), runs the GPU tests that match a filter, then
# each bench command given. The full check (every suite, sanitizers, every bench) is gpu-check.sh.
#   scripts/gpu-quick.sh 'GpuDispatch.*:GpuDecode.*' 'bench --presets qwen3-30b-a3b --tokens 1,8'
# The first argument is the gtest filter ('-' skips the GPU suite; default: every GPU test); the
# arguments after it are qmoe command lines (without the program name), run in order; leading
# VAR=value words set the environment of that command alone ('QMOE_GEMM=mma bench --tokens 8').
#   QMOE_QUICK_PREBUILT=1 runs the binaries in .gl/ (scripts/gpu-pack.sh) instead of building
#   QMOE_QUICK_PYTHON=1   also builds the Python module (-DQMOE_PYTHON=ON, the machine's python3
#                         with its torch) and runs QMOE_QUICK_PYTEST (default: the package and
#                         torch suites) with PYTHONPATH=build-gpu/python, after the commands
# CUTLASS's headers come from .cutlass/ (scripts/cutlass-headers.sh) where the machine has no
# network.
# Logs go to $OUT (or ./gpu-quick-out); the exit status is non-zero if anything failed.
# A machine without GoogleTest, CLI11 or nlohmann-json takes them from .deps/*.deb (Debian
# packages fetched with `apt-get download libgtest-dev libgmock-dev libcli11-dev
# nlohmann-json3-dev` into a git-ignored .deps/), unpacked under /tmp, never over the system.
set -uo pipefail
cd "$(dirname "$0")/.."
dest="${OUT:-gpu-quick-out}"
mkdir -p "$dest"
filter="${1:-*}"
shift || true

prefix=()
if [ ! -f /usr/include/gtest/gtest.h ] && compgen -G ".deps/*.deb" >/dev/null; then
  mkdir -p /tmp/qmoe-deps
  for f in .deps/*.deb; do dpkg -x "$f" /tmp/qmoe-deps; done
  prefix=(-DCMAKE_PREFIX_PATH=/tmp/qmoe-deps/usr)
fi

status=0
step() { echo "== $1: $2" | tee -a "$dest/summary.txt"; [ "$2" = ok ] || status=1; }

{
  git rev-parse --short HEAD 2>/dev/null || echo "(no git)"
  git status --short 2>/dev/null | head -20
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  nvcc --version | tail -1
} >"$dest/env.txt" 2>&1
cat "$dest/env.txt"

targets=(qmoe_gpu_tests qmoe_cli)
python_on="${QMOE_QUICK_PYTHON:-0}"
if [ "$python_on" = 1 ]; then
  prefix+=(-DQMOE_PYTHON=ON -DPython3_EXECUTABLE="$(command -v python3)")
  targets+=(_qmoe qmoe_python_files)
fi
t0=$(date +%s)
if [ "${QMOE_QUICK_PREBUILT:-0}" = 1 ]; then
  # Binaries built on another machine with the same toolkit (scripts/gpu-pack.sh), gzipped in the
  # git-ignored .gl/: no build here.
  python3 -c "import tarfile; tarfile.open('.gl/bins.tar.xz').extractall('build-gpu')" ||
    { echo "prebuilt binaries missing from .gl/bins.tar.xz"; exit 1; }
  step "prebuilt binaries" ok
else
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQMOE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DQMOE_CUDA_LINEINFO=ON "${prefix[@]}" >"$dest/configure.log" 2>&1 ||
  { tail -30 "$dest/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" >"$dest/build.log" 2>&1 ||
  { grep -E "error|Error" "$dest/build.log" | head -40; tail -20 "$dest/build.log"; exit 1; }
step "build ($(( $(date +%s) - t0 )) s)" ok
fi

if [ "$filter" != "-" ]; then
  t0=$(date +%s)
  build-gpu/tests/qmoe_gpu_tests --gtest_filter="$filter" >"$dest/gpu-tests.log" 2>&1
  rc=$?
  grep -E "^\[  (FAILED|PASSED) |^\[==========\]|Failure|error:" "$dest/gpu-tests.log" | head -40
  step "gpu tests '$filter' ($(( $(date +%s) - t0 )) s)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
fi

for cmd in "$@"; do
  t0=$(date +%s)
  read -ra words <<<"$cmd"
  envs=()
  while [ ${#words[@]} -gt 0 ] && [[ "${words[0]}" == *=* ]]; do envs+=("${words[0]}"); words=("${words[@]:1}"); done
  echo "### ${cmd}" >>"$dest/bench.txt"
  env "${envs[@]}" build-gpu/tools/qmoe "${words[@]}" >>"$dest/bench.txt" 2>&1
  rc=$?
  step "qmoe $cmd ($(( $(date +%s) - t0 )) s)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
done
if [ "$python_on" = 1 ]; then
  t0=$(date +%s)
  # shellcheck disable=SC2086
  PYTHONPATH=build-gpu/python python3 -m pytest -q -rs \
    ${QMOE_QUICK_PYTEST:-tests/python/test_python_api.py tests/python/test_torch_op.py tests/python/test_torch_models.py} \
    >"$dest/pytest.log" 2>&1
  rc=$?
  tail -15 "$dest/pytest.log"
  step "python suites ($(( $(date +%s) - t0 )) s)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)"
fi
[ -f "$dest/bench.txt" ] && cat "$dest/bench.txt"
exit $status
