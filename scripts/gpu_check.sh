#!/usr/bin/env bash
# One short run (< 3 minutes) of the GPU probe on a machine with an NVIDIA
# GPU: NVML per-call latency, driver sample-buffer period and depth, the
# buffer clock's calibrated offset to CLOCK_MONOTONIC and its error, the
# sampler's achieved rate, and a torch.cuda matmul loop's step time with the
# sampler off, at 10 Hz and at the maximum rate. Needs nvidia-ml-py >= 12.535
# (torch with CUDA for the matmul part; without it that part says "not run").
# Then the CUDA driver probe against the real libcuda (scripts/gpu_check_cuda.py,
# < 2 minutes; needs root and bcc for the uprobe part).
# Figures go to stdout and, when $OUT is set, to $OUT/gpu_check.{json,txt}.
# Changes no GPU setting.
#   scripts/gpu_check.sh            real GPU
#   scripts/gpu_check.sh --fake     against stallscope/testing/fake_nvml (no GPU)
#   scripts/gpu_check.sh --prepare  copy this interpreter's nvidia-ml-py
#                                   (pynvml.py + dist-info, ~0.4 MB) into
#                                   build/gpu_check_deps/, for a GPU machine
#                                   that has no bindings and no network; the
#                                   check puts that directory first on its path
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
DEPS=build/gpu_check_deps
if [ "${1:-}" = "--prepare" ]; then
  rm -rf "$DEPS" && mkdir -p "$DEPS"
  "$PY" - "$DEPS" <<'PYEOF'
import shutil, sys
from importlib import metadata
from pathlib import Path
dest = Path(sys.argv[1])
dist = metadata.distribution("nvidia-ml-py")
for f in dist.files:
    src = Path(f.locate())
    if f.name == "pynvml.py" or ".dist-info" in str(f.parent):
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / f)
print(f"gpu_check: nvidia-ml-py {dist.version} copied to {dest}")
PYEOF
  exit 0
fi
if [ -d "$DEPS" ]; then
  export PYTHONPATH="$PWD/$DEPS${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c 'import pynvml' 2>/dev/null; then
  echo "gpu_check: $PY cannot import pynvml: pip install 'nvidia-ml-py>=12.535'" >&2
  exit 2
fi
args=("$@")
# The CUDA driver probe's part (issue 31): the real libcuda's exported
# variants, whether uprobes attach there, N driver calls counted exactly,
# sync rows beside NVML samples. Skipped with --fake (no driver); it says
# "not run" and why for whatever it cannot do (no bcc, not root, no GPU).
cuda_check() {
  [ "${1:-}" = "--fake" ] && return 0
  local cuda_args=()
  [ -n "${OUT:-}" ] && cuda_args+=(--out "$OUT/gpu_check_cuda.json")
  timeout 120 "$PY" scripts/gpu_check_cuda.py "${cuda_args[@]}"
}
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  args+=(--out "$OUT/gpu_check.json")
  set +e
  timeout 175 "$PY" scripts/gpu_check.py "${args[@]}" 2>&1 | tee "$OUT/gpu_check.txt"
  rc=${PIPESTATUS[0]}
  cuda_check "${1:-}" 2>&1 | tee "$OUT/gpu_check_cuda.txt"
  rc_cuda=${PIPESTATUS[0]}
  exit $((rc > rc_cuda ? rc : rc_cuda))
fi
set +e
timeout 175 "$PY" scripts/gpu_check.py "${args[@]}"
rc=$?
cuda_check "${1:-}"
rc_cuda=$?
exit $((rc > rc_cuda ? rc : rc_cuda))
