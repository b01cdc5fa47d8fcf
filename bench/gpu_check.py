"""
The GPU checks, as one command for one H100/H200-class GPU, in under 8 minutes of wall time:
  1. tokens/s and MFU of 124M and 1.3B (bf16, torch.compile), steady state after warm-up;
  2. the planner's predicted against measured peak memory (max allocated and reserved) of 1.3B at
     three micro-batch sizes under ddp, ddp+ac and single-GPU fsdp;
  3. the largest configs/ model that this GPU and the measured host memory train, as plan.py says;
  4. one CPU-offload run of a GPT-2 shape chosen from the host memory: predicted against measured
     step time and host memory.
Each run is train.py through bench/throughput.py (random tokens, no checkpoint on disk) with its own
time limit, all within one budget. A summary table ends the output; with $OUT set it is also written
to $OUT/gpu_check.md, the raw results to $OUT/gpu_check.jsonl and each run's output to $OUT/logs/.

  bash bench/gpu_check.sh              # on the GPU host (python3 when there is no python)
  bash bench/gpu_check.sh --dry-run    # on CPU, tiny shapes, the same sequence and summary
"""
import contextlib
import datetime
import glob
import io
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'bench')]
import costs  # noqa: E402
import hardware  # noqa: E402
import plan as planner  # noqa: E402  (no CUDA is touched here: the runs own the GPU)
from configurator import configure  # noqa: E402
from model import GPTConfig, config_from  # noqa: E402
from throughput import measure  # noqa: E402

GiB = 2**30
BUDGET_S = 480  # the whole sequence; each run also has its own limit below (they sum under 9 min)
# GPT-2-style shapes for the offload run, the largest whose offloaded state fits half the host
OFFLOAD_SHAPES = [(24, 2048, 16), (32, 2560, 32), (32, 4096, 32), (40, 5120, 40)]


def gpu_facts():
    # name, MiB and driver from nvidia-smi (not torch: a CUDA context here would sit on the GPU
    # beside every run's)
    try:
        out = subprocess.run(['nvidia-smi', '--query-gpu=name,memory.total,driver_version',
                              '--format=csv,noheader,nounits'], capture_output=True, text=True, timeout=30)
        name, mib, driver = [x.strip() for x in out.stdout.splitlines()[0].split(',')]
        return name, int(float(mib)), driver
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
        return None, None, None


def host_total():
    with open('/proc/meminfo') as f:
        return int(re.search(r'MemTotal:\s+(\d+)', f.read()).group(1)) * 1024


def n_params(path):
    # counted from the model the config builds (on the meta device), not read from its comments
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    return costs.counts(config_from(configure(defaults, [path], strict_files=False)))['total']


def largest_config(gpu_arg, host_gib):
    # Asks plan.py (its main, in this process) about every configs/*.py, largest first: the first
    # that fits, and the first line of each answer.
    answers = []
    for path in sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py')), key=n_params, reverse=True):
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            fits = planner.main([path, '--gpus', gpu_arg, '--host_mem', f'{host_gib:.0f}']) == 0
        answers.append(f"{os.path.basename(path)}: {text.getvalue().splitlines()[0]}")
        if fits:
            return os.path.relpath(path, ROOT), answers
    return None, answers


def offload_shape(gpu, host):
    # The largest OFFLOAD_SHAPES entry whose fsdp+offload host state fits half the host memory;
    # and whether it would fit on the GPU without offload (fsdp+ac).
    rank = dict(device='cuda', gpu=gpu, host_mem=host)
    best = None
    for L, h, heads in OFFLOAD_SHAPES:
        cfg = GPTConfig(n_layer=L, n_embd=h, n_head=heads, block_size=2048)
        if planner.estimate(cfg, 'fsdp+offload', 1, 1)['host_rank'] <= 0.5 * host:
            best = cfg
    if best is None:
        return None, None
    on_gpu = planner.make_plan(best, 4, [rank], plan='fsdp+ac').fits
    return best, on_gpu


def main():
    dry = '--dry-run' in sys.argv[1:]
    out = os.environ.get('OUT')
    logs = os.path.join(out, 'logs') if out else None
    if logs:
        os.makedirs(logs, exist_ok=True)
    t_start, deadline = time.time(), time.time() + BUDGET_S
    name, mib, driver = (None, None, None) if dry else gpu_facts()
    gpu = hardware.gpu_key(name) or 'H200'
    host = host_total()
    import torch
    head = [f"# GPU check{' (dry run on CPU, tiny shapes)' if dry else ''}",
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
            f"GPU {name or 'none'} ({mib or '-'} MiB), driver {driver or '-'}; torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}); host memory {host / GiB:.0f} GiB; {os.cpu_count()} CPUs; "
            f"python {sys.version.split()[0]}"]
    print('\n'.join(head), flush=True)
    # Dry run: the same runs with a tiny model on the CPU (overrides come last, so they win).
    tiny = ['--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=64', '--block_size=64'] if dry else []
    results = []

    def run(label, args, steps, warmup, limit, batch, note=''):
        left = deadline - time.time()
        row = dict(label=label, args=' '.join(args), note=note)
        if left < 15:
            row.update(error='skipped: the time budget is spent')
        else:
            log = os.path.join(logs, re.sub(r'\W+', '_', label).strip('_') + '.log') if logs else None
            if dry:
                steps, warmup, args = 2, 1, args + tiny + [f'--batch_size={batch}']
            print(f"\n== {label}: {' '.join(args)} (limit {min(limit, left):.0f} s)", flush=True)
            row.update(measure(args, steps=steps, warmup=warmup, timeout=min(limit, left), log_path=log))
            print(row.get('table') or f"failed: {row['error']}\n{row.get('tail', '')}", flush=True)
        results.append(row)
        return row

    # 1. throughput, bf16 (dtype=auto on these GPUs), compiled
    run('124M compile', ['configs/gpt2_124m.py', '--compile=True', '--batch_size=64', '--block_size=1024'],
        15, 5, 100, 4)
    run('1.3B compile', ['configs/gpt_1p3b.py', '--compile=True', '--batch_size=16'], 8, 4, 120, 4)
    # 2. memory: predicted against measured, no compile (the probe's and the steps' peaks)
    for strategy in ('ddp', 'ddp+ac', 'fsdp'):
        for mb in (2, 4, 8):
            run(f'mem {strategy} mb{mb}', ['configs/gpt_1p3b.py', f'--plan={strategy}', '--compile=False',
                                          f'--micro_batch_size={mb}', f'--batch_size={mb}', '--init_device=meta'],
                1, 1, 22, mb)
    # 3. the largest config this GPU and host train, as the planner says (not hard-coded)
    biggest, answers = largest_config(f'1x{gpu}', host / GiB)
    print('\n== largest config that plan.py fits on 1x' + gpu + f' with {host / GiB:.0f} GiB host:\n  '
          + '\n  '.join(answers), flush=True)
    done = next((r for r in results if biggest and r['args'].startswith(biggest) and 'compile' in r['label']), None)
    if biggest is None:
        results.append(dict(label='largest config', args='', note='', error='plan.py fits no config here'))
    elif done and not dry:
        results.append(dict(done, label=f'largest: {biggest}', note='the same run as above'))
    else:
        run(f'largest: {os.path.basename(biggest)}', [biggest, '--compile=True', '--batch_size=8'], 2, 1, 40, 2)
    # 4. CPU offload: a shape from the host memory; predicted against measured step time and host memory
    # (dry run: chosen for the GPU host's 128 GiB, to walk the same path; the run itself is tiny)
    cfg, fits_without = offload_shape(gpu, 128 * GiB if dry else host)
    if cfg is None:
        results.append(dict(label='offload', args='', note='', error='no shape fits half the host memory'))
    else:
        shape = [f'--n_layer={cfg.n_layer}', f'--n_embd={cfg.n_embd}', f'--n_head={cfg.n_head}']
        note = ('fits the GPU without offload too' if fits_without else 'needs offload') + \
            f" ({costs.counts(cfg)['total'] / 1e9:.1f}B)"
        run('offload', ['configs/gpt_1p3b.py'] + shape + ['--plan=fsdp+offload', '--compile=False',
                                                           '--batch_size=4'], 2, 1, 80, 4, note)

    table = summary(results)
    text = '\n'.join(head) + '\n\n' + table + f"\n\n(whole check: {time.time() - t_start:.0f} s)\n"
    print('\n' + text, flush=True)
    if out:
        open(os.path.join(out, 'gpu_check.md'), 'w').write(text)
        with open(os.path.join(out, 'gpu_check.jsonl'), 'w') as f:
            f.writelines(json.dumps(r) + '\n' for r in results)
    failed = [r['label'] for r in results if 'error' in r]
    if failed:
        print(f"failed or skipped: {', '.join(failed)}")
    return 1 if failed else 0


def summary(results):
    # predicted memory is the planner's total, the CUDA context and NCCL ('outside allocator',
    # measured at start-up) included; the probe's and the steps' peaks are the allocator's alone
    f = lambda x, spec='.1f': '-' if x is None else format(x, spec)
    rows = ['| check | plan | micro-batch | tokens/s | predicted tokens/s | MFU | memory GiB: predicted | '
            'probe alloc / reserved | steps alloc / reserved | outside allocator | '
            'host GiB: predicted / peak RSS | wall s | note |',
            '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    for r in results:
        if 'error' in r:
            rows.append(f"| {r['label']} | | | | | | | | | | | {f(r.get('wall'), '.0f')} | "
                        f"**{r['error']}** {r['note']} |")
            continue
        p = r['plan']
        rows.append(
            f"| {r['label']} | {p.get('plan', '?')}{' (ac)' if p.get('ac') and '+ac' not in p.get('plan', '') else ''} "
            f"| {p.get('micro_batch', '-')} | {f(r['tokens_per_sec'], ',.0f')} | {f(p.get('pred_tokens_per_sec'), ',.0f')} "
            f"| {f(r['mfu'] and 100 * r['mfu'])}{'%' if r['mfu'] else ''} | {f(p.get('pred_gib'))} "
            f"| {f(p.get('probe_alloc_gib'))} / {f(p.get('probe_gib'))} | {f(r['mem_gib'])} / {f(r['reserved_gib'])} "
            f"| {f(p.get('overhead_gib'), '.2f')} "
            f"| {f(p.get('pred_host_gib'))} / {f(r['host_gib'])} | {f(r['wall'], '.0f')} | {r['note']} |")
    return '\n'.join(rows)


if __name__ == '__main__':
    sys.exit(main())
