#!/usr/bin/env bash
# Installs what building and testing qmoe needs: a C++17 toolchain, clang (the fuzz targets'
# libFuzzer), CMake, Ninja, GoogleTest,
# CLI11, nlohmann-json (Debian packages) and the Python packages (PyPI, pinned in
# tests/python/requirements.txt): the test packages, nanobind and scikit-build-core (the Python
# module's build), torch and transformers (its operator and model suites). Skips what is there.
# A first install of the Python packages takes about 3 minutes (torch's Linux wheel brings its
# CUDA libraries, about 3 GB; they load fine on machines without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(build-essential clang cmake ninja-build libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
      python3 python3-pip python3-dev)
missing=()
for p in "${debs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

if ! python3 -c "import numpy, onnx, onnxruntime, pytest, nanobind, scikit_build_core, torch, \
transformers" >/dev/null 2>&1; then
  # Debian's own python3 refuses system-wide pip installs (PEP 668); allow them there.
  python3 -m pip install -q -r tests/python/requirements.txt ||
    python3 -m pip install -q --break-system-packages -r tests/python/requirements.txt
fi

# CUTLASS's headers for the CUDA build: pip package nvidia-cutlass at the version
# scripts/requirements-build.txt pins (--no-deps: only its headers are used).
pin="$(sed -n 's/^nvidia-cutlass==//p' scripts/requirements-build.txt)"
if [ "$(python3 -m pip show nvidia-cutlass 2>/dev/null | sed -n 's/^Version: //p')" != "$pin" ]; then
  python3 -m pip install -q --no-deps -r scripts/requirements-build.txt ||
    python3 -m pip install -q --no-deps --break-system-packages -r scripts/requirements-build.txt
fi
