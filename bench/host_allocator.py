"""
What glibc's fixed 64 KiB mmap threshold (hardware.return_freed_host_memory, which train.py sets)
costs a CPU training step, against glibc's default (a dynamic threshold, up to 32 MiB), in one run:
each setting in its own process, alternately (default, fixed, default, fixed, ...), with the same
model, data and dtype; the step is forward + backward + clipping + fused AdamW, as train.py's.
Prints each setting's median step time (wall and CPU) and peak RSS above the process before the
model (model states included), and the ratios.

  python bench/host_allocator.py configs/gpt_tiny.py                                # 4×128
  python bench/host_allocator.py configs/gpt_tiny.py --n_embd=256 --steps=8
  python bench/host_allocator.py configs/gpt_tiny.py --dtype=bfloat16 --compile=True

Options of its own: --steps (timed steps per process, after 2 untimed), --rounds (processes per
setting), --dtype (float32; bfloat16: float32 weights under autocast, as train.py's DDP),
--compile (the blocks and the loss's kernel, as train.py). Threads: OMP_NUM_THREADS, else torch's.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from hetgpt.planner import costs  # noqa: E402
from hetgpt import hardware
import model  # noqa: E402
from hetgpt.knobs import configure  # noqa: E402

cfg = configure(dict(n_layer=4, n_head=4, n_embd=128, block_size=256, vocab_size=50304, dropout=0.0,
                     bias=True, init_std=0.02, batch_size=8, dtype='float32', compile=False, steps=10,
                     rounds=2, setting=''), strict_files=False)

if not cfg['setting']:  # the parent: the settings' processes in turn, then the ratios
    runs = {'default': [], 'fixed': []}
    env = {k: v for k, v in os.environ.items() if k != 'MALLOC_MMAP_THRESHOLD_'}  # (glibc's own)
    for _ in range(cfg['rounds']):
        for setting in runs:
            p = subprocess.run([sys.executable, __file__] + sys.argv[1:] + [f'--setting={setting}'],
                               capture_output=True, text=True, env=env)
            if p.returncode:
                sys.exit(p.stderr[-3000:])
            runs[setting].append(json.loads(p.stdout.splitlines()[-1]))
            print(setting, runs[setting][-1], flush=True)
    step, cpu = ({s: statistics.median(r[k] for r in rs) for s, rs in runs.items()} for k in ('step_s', 'cpu_s'))
    peak = {s: max(r['peak_mib'] for r in rs) for s, rs in runs.items()}
    d, f = 'default', 'fixed'
    print(f"fixed 64 KiB / default: step time {step[f] / step[d]:.2f}× ({step[f]:.3f} vs {step[d]:.3f} s), CPU time "
          f"{cpu[f] / cpu[d]:.2f}× ({cpu[f]:.3f} vs {cpu[d]:.3f} s), peak RSS "
          f"{peak[f] / peak[d]:.2f}× ({peak[f]:.0f} vs {peak[d]:.0f} MiB); {cfg['n_layer']}×{cfg['n_embd']}, "
          f"{cfg['batch_size']}×{cfg['block_size']} tokens, {cfg['dtype']}, "
          f"{'compiled' if cfg['compile'] else 'eager'}, {torch.get_num_threads()} thread(s)")
    sys.exit()

# a child: one setting, from the start (before any big allocation)
assert cfg['setting'] == 'default' or hardware.return_freed_host_memory()
hardware.reset_peak_rss()
base = hardware.peak_rss()  # the process before the model: peaks are counted above it
torch.manual_seed(0)
net = model.GPT(model.config_from(cfg))
if cfg['compile']:
    for block in net.transformer.h:
        block.compile()
    net.loss_kernel = torch.compile(net.loss_kernel)
optimizers = model.make_optimizer(net, costs.train_knobs())
autocast = torch.autocast('cpu', dtype=torch.bfloat16, cache_enabled=False, enabled=cfg['dtype'] == 'bfloat16')
idx = torch.randint(0, cfg['vocab_size'], (cfg['batch_size'], cfg['block_size']))
times, cpu = [], []  # wall seconds; this process's CPU seconds (user + system: the kernel's page
for i in range(cfg['steps'] + 2):  # zeroing is system time), which other processes' load skews less
    if i == 2:
        hardware.reset_peak_rss()
    t, c = time.perf_counter(), time.process_time()
    with autocast:
        loss = net(idx, idx, reduction='sum')[1]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
print(json.dumps(dict(step_s=statistics.median(times[2:]), cpu_s=statistics.median(cpu[2:]),
                      peak_mib=(hardware.peak_rss() - base) / 2**20)))
