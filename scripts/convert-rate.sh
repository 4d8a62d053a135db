#!/usr/bin/env bash
# Measures `qmoe convert`'s rate on Qwen3-30B-A3B-shaped synthetic checkpoints (issue: >= 1 GB/s
# of checkpoint on 16 cores): a GPTQ int4 checkpoint of LAYERS MoE layers (0.3 GB a layer; 48 is
# the model's size) converted exactly to int4 b128 with zero points, and a bf16 one of BF16_LAYERS
# layers (1.2 GB a layer) quantized to int4 b128. Prints each conversion's summary (its rate line)
# and the wall time. Needs numpy; pytest is stubbed where it is not installed (only the
# checkpoint writer of tests/python/test_convert.py is used).
#   scripts/convert-rate.sh QMOE_CLI WORKDIR [LAYERS [BF16_LAYERS]]
set -euo pipefail
cli="$1"
work="$2"
layers="${3:-48}"
bf16_layers="${4:-8}"
here="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$work"

write_checkpoint() {  # DIR LAYERS [gptq]
  python3 - "$@" <<EOF
import sys, types
sys.path.insert(0, "$here/tests/python")
try:
    import pytest  # noqa: F401
except ImportError:  # the writer does not need it; the module's decorators do
    class _Any:
        def __getattr__(self, name):
            return _Any()
        def __call__(self, *a, **k):
            return a[0] if len(a) == 1 and callable(a[0]) and not k else _Any()
    sys.modules["pytest"] = _Any()
from pathlib import Path
import test_convert
test_convert.write_large_qwen3(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["gptq"])
EOF
}

echo "cores: $(nproc)"
for kind in gptq bf16; do
  n="$layers"
  [ "$kind" = bf16 ] && n="$bf16_layers"
  [ "$n" -gt 0 ] || continue
  src="$work/$kind"
  t0=$(date +%s.%N)
  if [ "$kind" = gptq ]; then write_checkpoint "$src" "$n" gptq; else write_checkpoint "$src" "$n"; fi
  t1=$(date +%s.%N)
  echo "== $kind: $n layers, $(du -sb "$src" | cut -f1) bytes, written in $(awk "BEGIN {print $t1 - $t0}") s"
  args=(--from "$kind" "$src" -o "$work/$kind.pack.safetensors")  # bf16: int4 b128 by default
  t0=$(date +%s.%N)
  "$cli" convert "${args[@]}"
  t1=$(date +%s.%N)
  echo "== $kind -> int4: wall $(awk "BEGIN {print $t1 - $t0}") s"
  rm -rf "$src" "$work/$kind.pack.safetensors"
done
