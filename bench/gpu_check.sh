#!/usr/bin/env bash
# The GPU checks, as one script for one H100/H200-class GPU, in under 8 minutes:
#  1. tokens/s and MFU of 124M and 1.3B (bf16, torch.compile) through train.py
#  2. the planner's predicted against measured peak memory at three micro-batch sizes
#  3. the plan and tokens/s of the largest configs/ model that one GPU trains through the planner
# Copy what it prints into bench/RESULTS.md with the date and machine. Without a GPU it says so, exits 0.
#   bash bench/gpu_check.sh            (PY=.venv/bin/python bash bench/gpu_check.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "no CUDA GPU here: nothing to check (the GPU figures in bench/RESULTS.md come from a GPU host)"
    exit 0
fi
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
run() { echo; echo "== $*"; timeout 240 $PY bench/throughput.py "$@" || echo "(failed or timed out)"; }

echo; echo "## 1. throughput, bf16, compile"
run configs/gpt2_124m.py --compile=True --batch_size=64 --block_size=1024 --steps=15 --warmup=5
run configs/gpt_1p3b.py --compile=True --batch_size=16 --steps=8 --warmup=4

echo; echo "## 2. predicted against measured peak memory (plan=ddp, no compile)"
for mb in 2 4 8; do
    run configs/gpt_1p3b.py --plan=ddp --compile=False --micro_batch_size=$mb --batch_size=$mb --steps=2 --warmup=1
done

echo; echo "## 3. the largest config one GPU trains through the planner"
$PY plan.py configs/gpt_13b.py --gpus 1xH200 --host_mem "$(awk '/MemTotal/ {print int($2/1048576)}' /proc/meminfo)"
run configs/gpt_13b.py --batch_size=8 --steps=2 --warmup=1
