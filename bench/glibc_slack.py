"""
How far a CPU step's peak RSS runs above the planner's prediction (live bytes) under glibc's own
allocator, against the 64 KiB mmap threshold that a rank near its memory sets
(hardware.return_freed_host_memory), in one run: each case in a fresh process per setting
(tests/peak_step.py: float32, fused AdamW, one thread, 4 × 256 wide, 256 tokens, vocabulary 8192),
4 real steps, the peak RSS above the process before the model after each step.
hetgpt.planner.memory.GLIBC_SLACK must hold the largest ratio seen (exit 1 if not).

  python bench/glibc_slack.py
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from hetgpt.planner.memory import GLIBC_SLACK  # noqa: E402

CASES = [('ddp', 2), ('ddp', 8), ('ddp+ac', 8), ('ddp+ac', 16)]
env = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_')}
worst = 0
for strategy, b in CASES:
    line = []
    for setting in ('glibc', '64k'):
        p = subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'peak_step.py'), strategy,
                            str(b), 'gpt2', 'steps=4', f'allocator={setting}'],
                           capture_output=True, text=True, env=env, timeout=600)
        if p.returncode:
            sys.exit(p.stderr[-3000:])
        r = json.loads(p.stdout.splitlines()[-1])
        ratio = r['measured'] / r['predicted']
        worst = max(worst, ratio) if setting == 'glibc' else worst
        line.append(f"{setting}: peaks {', '.join(f'{x / 2**20:.0f}' for x in r['peaks'])} MiB, "
                    f"{ratio:.2f}× the prediction ({r['predicted'] / 2**20:.0f} MiB)")
    print(f"{strategy} b={b}: " + '; '.join(line), flush=True)
print(f"largest under glibc: {worst:.2f}× (GLIBC_SLACK {GLIBC_SLACK:g})")
sys.exit(0 if worst <= GLIBC_SLACK else 1)
