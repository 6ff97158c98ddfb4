#!/usr/bin/env bash
# One short run (< 3 minutes) of the GPU probe on a machine with an NVIDIA
# GPU: NVML per-call latency, driver sample-buffer period and depth, the
# buffer clock's calibrated offset to CLOCK_MONOTONIC and its error, the
# sampler's achieved rate, and a torch.cuda matmul loop's step time with the
# sampler off, at 10 Hz and at the maximum rate. Needs nvidia-ml-py >= 12.535
# (torch with CUDA for the matmul part; without it that part says "not run").
# Figures go to stdout and, when $OUT is set, to $OUT/gpu_check.{json,txt}.
# Changes no GPU setting.
#   scripts/gpu_check.sh            real GPU
#   scripts/gpu_check.sh --fake     against tests/probes/fake_nvml (no GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c 'import pynvml' 2>/dev/null; then
  echo "gpu_check: $PY cannot import pynvml: pip install 'nvidia-ml-py>=12.535'" >&2
  exit 2
fi
args=("$@")
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  args+=(--out "$OUT/gpu_check.json")
  timeout 175 "$PY" scripts/gpu_check.py "${args[@]}" 2>&1 | tee "$OUT/gpu_check.txt"
  exit "${PIPESTATUS[0]}"
fi
exec timeout 175 "$PY" scripts/gpu_check.py "${args[@]}"
