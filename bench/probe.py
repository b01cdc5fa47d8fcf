"""
The probe step's peak against the peaks of the steps after it, per strategy: train.py on random
tokens (bench/throughput.py's measure), its plan row's probe_gib against the highest mem_gib of the
next steps, rank 0's. What the first step of a run may not exceed is what the probe measured.

  python bench/probe.py                      # 2 gloo ranks, 4 × 512 wide, 64 tokens
  python bench/probe.py --nproc=1 --strategies=ddp --n_embd=384 --block_size=512

Options of its own: --nproc (default 2), --steps (default 5), --strategies (comma-separated, default
ddp,ddp+ac,fsdp,fsdp+offload). Everything else goes to train.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import measure  # noqa: E402

opts = dict(nproc='2', steps='5', strategies='ddp,ddp+ac,fsdp,fsdp+offload')
train_args = ['--device=cpu', '--dtype=float32', '--compile=False', '--bias=False',
              '--n_layer=4', '--n_head=4', '--n_embd=512', '--block_size=64',
              '--batch_size=8', '--micro_batch_size=4', '--balance=even', '--eval_iters=1']
for arg in sys.argv[1:]:
    key, _, value = arg.lstrip('-').partition('=')
    if key in opts:
        opts[key] = value
    else:
        train_args.append(arg)  # (later ones win in train.py)
print(f"{'strategy':<14}{'probe GiB':>10}{'steps GiB':>10}{'probe/steps':>12}   steps' peaks")
for strategy in opts['strategies'].split(','):
    r = measure(train_args + [f'--plan={strategy}'], steps=int(opts['steps']), warmup=0,
                nproc=int(opts['nproc']))
    if 'error' in r:
        sys.exit(f"{strategy}: train.py failed ({r['error']}):\n{r['tail']}")
    probe, peaks = r['plan']['probe_gib'], r['mem_per_step']
    print(f"{strategy:<14}{probe:>10.3f}{max(peaks):>10.3f}{probe / max(peaks):>12.3f}   "
          + ' '.join(f"{x:.3f}" for x in peaks), flush=True)
