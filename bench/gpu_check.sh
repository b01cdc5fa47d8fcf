#!/usr/bin/env bash
# The GPU checks (bench/gpu_check.py says what they measure), for the GPU host: no installs, the
# python there (python3 when there is no python), under 8 minutes. Copy the summary into
# bench/RESULTS.md with the date and machine; with $OUT set it is also in $OUT/gpu_check.md.
#   bash bench/gpu_check.sh              # on the GPU host: fails (exit 1) if no CUDA GPU is seen
#   bash bench/gpu_check.sh --dry-run    # on CPU: tiny shapes through the same sequence and summary
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python
    elif command -v python >/dev/null; then PY=python
    else PY=python3; fi
fi
if [ "${1:-}" != "--dry-run" ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "error: $PY sees no CUDA GPU (torch $($PY -c 'import torch; print(torch.__version__)' 2>&1)):" \
             "run it on the GPU host, or --dry-run here" >&2
        exit 1
    fi
    export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
fi
exec $PY bench/gpu_check.py "$@"
