"""bench/gpu_check.sh --dry-run: the GPU check's sequence and summary on CPU, so that a script error
shows here and never on the GPU host's scarce minutes."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_walks_every_check_and_writes_the_summary(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PY=sys.executable, OMP_NUM_THREADS='2')
    p = subprocess.run(['bash', 'bench/gpu_check.sh', '--dry-run'], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = (tmp_path / 'gpu_check.md').read_text()
    rows = {m.group(1): m.group(2).split(' | ') for m in re.finditer(r'^\| ([^|]+?) \| (.*) \|$', summary, re.M)}
    for label in ['124M compile', '1.3B compile', 'largest: gpt_1p3b.py', 'offload']:
        assert label in rows, summary
    for strategy in ('ddp', 'ddp+ac', 'fsdp'):  # each memory run ran the strategy and micro-batch asked for
        for mb in (2, 4, 8):
            plan, micro_batch = rows[f'mem {strategy} mb{mb}'][:2]
            assert plan.strip() == strategy and micro_batch.strip() == str(mb), summary
    assert rows['offload'][0].strip() == 'fsdp+offload'
    assert 'failed' not in summary and 'skipped' not in summary
    assert len(list((tmp_path / 'logs').glob('*.log'))) == 13  # every run's output kept
