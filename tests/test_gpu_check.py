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


def test_summary_row_of_a_gpu_run():
    # what the dry run cannot show: MFU and the overhead are set on a GPU
    sys.path.insert(0, str(ROOT / 'bench'))
    import gpu_check
    plan = dict(plan='ddp', ac=False, micro_batch=16, pred_gib=80.0, pred_host_gib=3.0, pred_tokens_per_sec=5e4,
                probe_gib=70.0, probe_alloc_gib=65.0, overhead_gib=0.75)
    run = dict(label='1.3B compile', note='', tokens_per_sec=4.2e4, mfu=0.385, mem_gib=66.0, reserved_gib=71.0,
               host_gib=9.0, wall=80.0, plan=plan)
    failed = dict(label='offload', note='(2.7B)', error='timed out after 80 s', wall=80.0)
    table = gpu_check.summary([run, failed]).splitlines()
    assert table[2] == ('| 1.3B compile | ddp | 16 | 42,000 | 50,000 | 38.5% | 80.0 | 65.0 / 70.0 | 66.0 / 71.0 '
                        '| 0.75 | 3.0 / 9.0 | 80 |  |')
    assert table[3].startswith('| offload |') and '**timed out after 80 s** (2.7B)' in table[3]
    assert len({line.count('|') for line in table}) == 1  # every row has the header's columns
