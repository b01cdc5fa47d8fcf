"""
Where a CPU training step's time and memory go, and what the chunked loss (model.LMHeadLoss) saves
against the textbook loss (the micro-batch's logits, in float32, through F.cross_entropy), both
measured here, in one run. Each loss runs in its own process (peak RSS is per process), with the
same model, data and autocast; the step is forward + backward + fused AdamW.

  python bench/profile_step.py configs/gpt_tiny.py                 # float32
  python bench/profile_step.py configs/gpt_tiny.py --dtype=bfloat16 --steps=6
"""
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from hetgpt.knobs import configure  # noqa: E402
from model import GPT, config_from  # noqa: E402

cfg = configure(dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, dropout=0.0, bias=True,
                     init_std=0.02, batch_size=8, dtype='float32', steps=5, loss='', profile=True), strict_files=False)

if not cfg['loss']:  # the parent: one child per loss, then the comparison
    out = {}
    for loss in ('textbook', 'chunked'):
        p = subprocess.run([sys.executable, __file__] + sys.argv[1:] + [f'--loss={loss}'], capture_output=True, text=True)
        if p.returncode:
            sys.exit(p.stderr[-3000:])
        print(p.stdout)
        out[loss] = dict(line.split('=') for line in p.stdout.splitlines() if line.startswith(('step_s=', 'peak_gib=')))
    t, c = ({k: float(v) for k, v in out[n].items()} for n in ('textbook', 'chunked'))
    print(f"chunked / textbook: step time {c['step_s'] / t['step_s']:.2f}×, peak RSS {c['peak_gib']:.2f} vs "
          f"{t['peak_gib']:.2f} GiB ({t['peak_gib'] - c['peak_gib']:.2f} GiB saved); {cfg['dtype']}, "
          f"{cfg['batch_size']}×{cfg['block_size']} tokens")
    sys.exit()

torch.manual_seed(0)
model = GPT(config_from(cfg))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
x = torch.randint(0, cfg['vocab_size'], (cfg['batch_size'], cfg['block_size']))
autocast = torch.autocast('cpu', dtype=torch.bfloat16, enabled=cfg['dtype'] == 'bfloat16')


def textbook_loss(idx, targets):
    # What model.forward did before the chunked loss: the whole logits, a float32 copy, cross_entropy.
    m = model.transformer
    h = m.drop(m.wte(idx) + m.wpe(torch.arange(idx.size(1))))
    for block in m.h:
        h = block(h)
    logits = model.lm_head(m.ln_f(h))
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), reduction='sum')


def step():
    with autocast:
        loss = textbook_loss(x, x) if cfg['loss'] == 'textbook' else model(x, x, reduction='sum')[1]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


step()  # warm-up: allocations, AdamW state
times = []
for _ in range(cfg['steps']):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(f"step_s={statistics.median(times)}")
print(f"peak_gib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}")
if cfg['profile']:
    from torch.profiler import profile
    with profile() as prof:
        step()
    print(f"{cfg['loss']} loss, one step, ops by self CPU time:")
    print(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=10))
