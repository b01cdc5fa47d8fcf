#!/usr/bin/env bash
# The GPU checks (bench/gpu_check.py says what they measure and its options), for the GPU host: no
# installs, the python there (python3 when there is no python), ending inside 540 s (--budget).
# With $OUT set it writes exactly three files there, row by row as the runs end: gpu_check.log
# (every run's output), gpu_check.md (the summary table: copy it into bench/RESULTS.md with the
# date and machine) and gpu_check.jsonl (one row per run). A failed or skipped run is marked
# FAILED in all three, and the exit status is then 1.
#   HETGPT_HOST_MEM_GIB=120 bash bench/gpu_check.sh   # on the GPU host (a microVM: MemAvailable
#                                                     # reads far below the 128 GiB it gives)
#   bash bench/gpu_check.sh --dry-run    # on CPU: tiny shapes, eager, the same sequence and files
#   bash bench/gpu_check.sh --help       # the options (--only, --limit, --budget, ...)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python
    elif command -v python >/dev/null; then PY=python
    else PY=python3; fi
fi
case " $* " in
    *" --dry-run "*|*" --help "*|*" -h "*) ;;
    *)
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
        if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
            echo "error: $PY sees no CUDA GPU (torch $($PY -c 'import torch; print(torch.__version__)' 2>&1)):" \
                 "run it on the GPU host, or --dry-run here" >&2
            exit 1
        fi ;;  # (train.py sets the allocator's expandable segments itself)
esac
exec $PY bench/gpu_check.py "$@"
