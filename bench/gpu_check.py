"""
The GPU checks, as one command for one H100/H200-class GPU, ending inside 540 s of wall time:
  1. the planner's predicted against measured peak memory (max allocated and reserved, of the probe
     step and of the steps) of 1.3B at micro-batches 4 and 16 under ddp, ddp+ac and single-GPU
     fsdp, eager;
  2. one CPU-offload run (fsdp+offload) of a GPT-2 shape chosen from the host memory: predicted
     against measured step time and host memory;
  3. the largest configs/ model that this GPU and host train, as plan.py says (when it is 1.3B, the
     row of 4's compiled 1.3B run);
  4. tokens/s and MFU of 124M and 1.3B (bf16, torch.compile), steady state after warm-up;
  5. the clock's kernels (bench/kernel_rates.py, at most 60 s): every matmul shape and attention
     kernel of a 1.3B micro-batch as the planner records them, timed on this GPU, against the
     seconds the clock gives each at its published rate; and a streaming copy against its HBM rate.
     Sustained rates, as MSMF: the clock settled first (a matmul loop until two 0.5 s windows in a
     row agree within 2%), then the shapes that carry 90% of the predicted time each timed over a
     window of 2 s (the rest at their burst); every shape also timed as a 20 ms burst, as MAMF.
     Its row: the sustained tokens/s, and in its note the burst ones and the sustained and burst
     TFLOP/s of the matmul of the most predicted time, and their ratio (MSMF / MAMF);
  6. float16 with loss scaling (124M, eager), with a checkpoint at step 2 and 4; then the run
     resumed from step 2 on CUDA, its losses at steps 3 and 4 against the first run's.
Each run is train.py through bench/throughput.py (random tokens, no checkpoint on disk), weights
first made on the meta device (never a whole model on the host), with its own time limit. The
compiled runs come last and take what the eager ones leave (their first compile: 60-120 s each).
Every train.py run's row holds its measured step (the median after warm-up) beside the step
the planner predicted for it (the line 'predicted: step ... s' of the plan table it printed after
the probe step).
Time limits (LIMITS): each memory run 30 s, the kernels 60 s, each float16 run 45 s, offload 90 s,
the largest config (when not 1.3B) 60 s, 124M compiled 120 s, 1.3B compiled the rest up to 200 s;
a run with too little left is skipped.

Host memory, for this script's own planning (3, and 2's shape): HETGPT_HOST_MEM_GIB when set, else
MemTotal. The runs inherit the variable (train.py plans with it instead of MemAvailable). The GPU
host is a microVM whose MemAvailable reads far below the 128 GiB it gives: run it there with
HETGPT_HOST_MEM_GIB=120.

With $OUT set, exactly three files, each written as the runs end (a kill keeps the rows so far):
  gpu_check.log    every run's command and whole output, under a header per run
  gpu_check.md     the summary table (its header is written first)
  gpu_check.jsonl  one JSON row per run: its numbers, the plan row of its metrics.jsonl, "failed"
A run that failed, timed out or was skipped (the budget spent) is marked failed in its printed row,
its .md row (**FAILED: why**) and its .jsonl row ("failed": true, "error"); the exit status is 1.

  HETGPT_HOST_MEM_GIB=120 bash bench/gpu_check.sh   # on the GPU host (python3 if no python)
  bash bench/gpu_check.sh --dry-run       # on CPU: tiny shapes, eager, the same sequence and files
  bash bench/gpu_check.sh --help          # the options: --host_mem_gib, --budget, --only, --limit, ...
"""
import argparse
import contextlib
import datetime
import glob
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'bench')]
from hetgpt import gpus, hardware  # noqa: E402
from hetgpt.errors import die  # noqa: E402
from hetgpt.knobs import configure  # noqa: E402
# (no CUDA is touched here: the runs own the GPU)
from hetgpt.planner import costs, memory, search  # noqa: E402
import plan  # noqa: E402
from model import GPTConfig, config_from  # noqa: E402
from throughput import measure  # noqa: E402

GiB = 2**30
BUDGET_S = 540
END_S = 15  # of the budget, kept for the shell's checks before and the summary after
# (cap, floor) seconds per check, by label prefix: a run's limit is its cap, or what is left of
# the budget if less; with less than its floor left it is skipped. Eager runs on the GPU take about
# 15-20 s each (start-up, plan, probe, 2 steps). Expected (eager ~20 s each, kernels ~40: a
# settled clock and 2 s windows, offload ~60, 124M ~100), the 1.3B compile gets 525 - 380 = ~145 s;
# worst case, every run before it at its cap (6 × 30 + 60 + 2 × 45 + 90 + 120 = 540 s), it is
# skipped (FAILED) and the rows
# before it stand. The largest config runs (eagerly, 60 s more) only when it is not 1.3B.
LIMITS = {'mem': (30, 15), 'kernels': (60, 30), 'fp16': (45, 20), 'offload': (90, 45),
          'largest': (60, 30), '124M compile': (120, 60), '1.3B compile': (200, 90)}
DRY_LIMITS = (120, 5)  # tiny and eager, on a loaded 2-core machine
PLAN_WAIT_S = 60  # for plan_ahead, at most, when the offload run needs it (it runs from the start)
MICRO_BATCHES = (4, 16)  # 1.3B on an H200: ddp fits up to about 27
STRATEGIES = ('ddp', 'ddp+ac', 'fsdp')
# GPT-2-style shapes for the offload run: the largest whose offloaded state fits half the host
# (350M for a small host, 2.7B for the GPU host's 120 GiB)
OFFLOAD_SHAPES = [(24, 1024, 16), (24, 2048, 16), (32, 2560, 32), (32, 4096, 32), (40, 5120, 40)]
COLUMNS = ['check', 'plan', 'micro-batch', 'tokens/s', 'predicted tokens/s', 'MFU',
           'memory GiB: predicted', 'probe alloc / reserved', 'steps alloc / reserved',
           'outside allocator', 'host GiB: predicted / peak RSS', 'step s: predicted / measured',
           'wall s', 'note']


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


def meminfo(key):
    with open('/proc/meminfo') as f:
        return int(re.search(rf'{key}:\s+(\d+)', f.read()).group(1)) * 1024


def n_params(path):
    # counted from the model the config builds (on the meta device), not read from its comments
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    return costs.counts(config_from(configure(defaults, [path], strict_files=False)))['total']


def largest_config(gpu_arg, host_gib, upto=None):
    # Asks plan.py (its main) about every configs/*.py, largest first (of at most upto parameters):
    # the first that fits, and the first line of each answer.
    answers, paths = [], sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py')), key=n_params)
    for path in [p for p in paths[::-1] if upto is None or n_params(p) <= upto]:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            fits = plan.main([path, '--gpus', gpu_arg, '--host_mem', f'{host_gib:g}']) == 0
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
        if memory.estimate(cfg, 'fsdp+offload', 1, 1)['host_rank'] <= 0.5 * host:
            best = cfg
    if best is None:
        return None, None
    return best, search.make_plan(best, 4, [rank], plan='fsdp+ac').fits


def plan_ahead(gpu, host_gib, dry):
    # What 2 and 3 need, planned in a process of its own while the first runs use the GPU (plan.py
    # on the larger configs takes a minute of CPU); its last line of output is this, as JSON.
    upto = n_params(os.path.join(ROOT, 'configs', 'gpt_1p3b.py')) if dry else None
    biggest, answers = largest_config(f'1x{gpu}', host_gib, upto)
    cfg, fits_without = offload_shape(gpu, host_gib * GiB)
    shape = cfg and dict(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head,
                         params=costs.counts(cfg)['total'])
    return dict(largest=biggest, answers=answers, offload=shape, offload_fits_gpu=fits_without)


def md_row(r):
    # The summary's row of a run. Predicted memory is the planner's total, the CUDA context and NCCL
    # ('outside allocator', measured at start-up) included; the probe's and the steps' peaks are
    # the allocator's alone. A peak the run could not measure (None) is '-', as is a step not
    # said (the kernels' row: its micro-batch's seconds are its tokens/s).
    f = lambda x, spec='.1f': '-' if x is None else format(x, spec)
    if 'error' in r:
        cells = [r['label']] + [''] * 11 + [f(r.get('wall'), '.0f'), f"**FAILED: {r['error']}** {r['note']}"]
    else:
        p = r['plan']
        ac = ' (ac)' if p.get('ac') and '+ac' not in p.get('plan', '') else ''
        cells = [r['label'], f"{p.get('plan', '?')}{ac}", f"{p.get('micro_batch', '-')}",
                 f(r['tokens_per_sec'], ',.0f'), f(p.get('pred_tokens_per_sec'), ',.0f'),
                 f"{100 * r['mfu']:.1f}%" if r['mfu'] else '-', f(p.get('pred_gib')),
                 f"{f(p.get('probe_alloc_gib'))} / {f(p.get('probe_gib'))}",
                 f"{f(r['mem_gib'])} / {f(r['reserved_gib'])}", f(p.get('overhead_gib'), '.2f'),
                 f"{f(p.get('pred_host_gib'))} / {f(r['host_gib'])}",
                 f"{f(r.get('pred_step_s'), '.3g')} / {f(r.get('step_s'), '.3g')}",
                 f(r['wall'], '.0f'), r['note']]
    return '| ' + ' | '.join(cells) + ' |'


def json_row(r):
    # The .jsonl row of a run: what the .md row shows and the whole plan row (no output: the log has it)
    keep = ('label', 'args', 'note', 'limit_s', 'wall', 'tokens_per_sec', 'mfu', 'mem_gib',
            'reserved_gib', 'host_gib', 'step_s', 'pred_step_s', 'steps', 'plan', 'kernels',
            'sustained', 'burst_tokens_per_sec', 'losses', 'error')
    return json.dumps(dict(failed='error' in r, **{k: r[k] for k in keep if k in r}))


def summary(results):
    return '\n'.join(['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
                     + [md_row(r) for r in results])


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other mistake (argparse prints the usage too)
        die(f"{message} (bash bench/gpu_check.sh --help)")


def options(argv):
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--dry-run', action='store_true',
                    help="tiny shapes on the CPU, eager (compiling is train.py's, tested in tests/); "
                         "for 3 only configs/ up to 1.3B are planned (the larger ones' plans take a "
                         "minute of CPU; tests/test_plan.py checks them)")
    ap.add_argument('--host_mem_gib', type=float, default=None, metavar='N',
                    help="host memory in GiB: sets HETGPT_HOST_MEM_GIB, for this script and the "
                         "runs (default: that variable, else MemTotal)")
    ap.add_argument('--budget', type=float, default=BUDGET_S, metavar='S',
                    help=f"the whole check's wall seconds (default {BUDGET_S}); the runs end {END_S} s "
                         f"before it, and a run with less than its floor left is skipped (FAILED)")
    ap.add_argument('--only', default='', metavar='A,B',
                    help="only the checks whose label starts with one of these, e.g. mem,offload "
                         "(a rerun of what failed; default: all)")
    ap.add_argument('--micro_batches', default=','.join(map(str, MICRO_BATCHES)), metavar='M,N',
                    help="the memory runs' micro-batches (default: %(default)s)")
    ap.add_argument('--limit', action='append', default=[], metavar='LABEL=S',
                    help="the time limit in seconds of the checks whose label starts with LABEL, "
                         "instead of their cap (LIMITS); repeat it for several, e.g. "
                         "--limit='1.3B compile=240'")
    a = ap.parse_args(argv)
    if a.host_mem_gib is not None and not 0 < a.host_mem_gib < math.inf:
        die(f"--host_mem_gib {a.host_mem_gib}: must be a number > 0 (GiB)")
    if not 0 < a.budget < math.inf:
        die(f"--budget {a.budget}: must be a number of seconds > 0")
    try:
        mbs = [int(x) for x in a.micro_batches.split(',')]
        assert all(x > 0 for x in mbs)
    except (ValueError, AssertionError):
        die(f"--micro_batches {a.micro_batches}: give integers > 0, e.g. 4,16")
    a.micro_batches = mbs
    labels = [f'mem {s} mb{mb}' for s in STRATEGIES for mb in a.micro_batches] + [
        'kernels', 'fp16 save', 'fp16 resume', 'offload', 'largest', '124M compile', '1.3B compile']
    known = lambda p: p.startswith('largest') or any(x.startswith(p) for x in labels)
    a.only = [p.strip() for p in a.only.split(',') if p.strip()]
    limits = {}
    for item in a.limit:
        label, _, value = item.rpartition('=')
        try:
            limits[label] = float(value)
            assert label and 0 < limits[label] < math.inf
        except (ValueError, AssertionError):
            die(f"--limit {item}: give LABEL=SECONDS, e.g. --limit='1.3B compile=240'")
    for p in a.only + list(limits):
        if not known(p):
            die(f"{p!r} starts no check's label: {', '.join(labels)}")
    a.limits = limits
    return a


class Check:
    # The check's state: its options, clock, files and rows, and the planning done ahead
    def __init__(self, a, out):
        self.a, self.dry, self.t_start = a, a.dry_run, time.time()
        self.deadline = self.t_start + a.budget - END_S
        if out:
            os.makedirs(out, exist_ok=True)
        self.paths = {k: os.path.join(out, f'gpu_check.{k}') for k in ('log', 'md', 'jsonl')} if out else {}
        self.results, self.planned, self.ahead = [], {}, None

    def wanted(self, label):
        return not self.a.only or any(label.startswith(p) for p in self.a.only)

    def write(self, kind, text, mode='a'):
        if kind in self.paths:
            with open(self.paths[kind], mode) as f:
                f.write(text)

    def record(self, row):
        # the row on disk the moment its run ends (a kill keeps it), then printed
        line = md_row(row)
        self.write('md', line + '\n')
        self.write('jsonl', json_row(row) + '\n')
        print(line, flush=True)
        self.results.append(row)
        return row

    def limit(self, label):
        # (the run's limit in seconds, None when too little of the budget is left: then recorded
        # as skipped)
        cap, floor = DRY_LIMITS if self.dry else next(v for k, v in LIMITS.items() if label.startswith(k))
        cap = next((s for k, s in self.a.limits.items() if label.startswith(k)), cap)
        left = self.deadline - time.time()
        if left < min(floor, cap):
            self.write('log', f"\n{'=' * 30} {label}: skipped, {max(0, left):.0f} s of the budget left\n")
            return None, f"skipped: {max(0, left):.0f} s of the budget left"
        print(f"== {label}: limit {round(min(cap, left))} s", flush=True)
        self.write('log', f"\n{'=' * 30} {label}: limit {round(min(cap, left))} s, "
                          f"{time.time() - self.t_start:.0f} s into the check\n")
        return round(min(cap, left)), None

    def run(self, label, args, steps, warmup, batch, note='', work=None, then=(), dry_steps=(1, 1),
            check=None):
        # train.py through measure(), within its limit; batch and dry_steps: the dry run's
        # batch_size, steps and warm-up; work and then: measure's (a folder kept for a resume,
        # arguments after its own); check(row): what the row says of the run, before it is recorded
        row = dict(label=label, args=' '.join(args), note=note)
        if self.dry:  # the same runs with a tiny model on the CPU (overrides come last, so they win)
            (steps, warmup), args = dry_steps, args + TINY + [f'--batch_size={batch}']
        limit, skipped = self.limit(label)
        if skipped:
            return self.record(dict(row, error=skipped))
        row.update(args=' '.join(args), limit_s=limit)
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, 'log')
            row.update(measure(args, steps=steps, warmup=warmup, timeout=limit, log_path=log,
                               work=work, then=then))
            self.write('log', open(log).read() if os.path.exists(log) else '(no output)\n')
        self.write('log', f"{'-' * 30} {label}: {'FAILED: ' + row['error'] if 'error' in row else 'ok'}, "
                          f"{row['wall']:.0f} s\n")
        if 'error' in row:
            print('\n'.join(row.get('tail', '').splitlines()[-8:]), flush=True)
        elif check:
            row.update(check(row))
        return self.record(row)

    def kernels(self):
        # bench/kernel_rates.py on 1.3B's shapes (a tiny model's on the CPU), in a process of its
        # own (it holds a CUDA context), its summary as a row: tokens/s of the micro-batch's kernels
        # at sustained rates and predicted; in the note the ratio of each kind, the burst tokens/s,
        # and the sustained and burst TFLOP/s of the matmul of the most predicted time (their
        # ratio: MSMF / MAMF)
        model = ['--n_layer=2', '--n_head=2', '--n_embd=64', '--block_size=64', '--vocab_size=512',
                 '--device=cpu'] if self.dry else []
        limit, skipped = self.limit('kernels')
        args = [sys.executable, os.path.join(ROOT, 'bench', 'kernel_rates.py'), 'configs/gpt_1p3b.py',
                *model]
        row = dict(label='kernels', args=' '.join(args[1:]), note='')
        if skipped:
            return self.record(dict(row, error=skipped))
        args.append(f'--budget={max(5, limit - 12)}')  # (start-up and plan: ~10 s)
        t0 = time.time()
        try:
            p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=limit)
            out = p.stdout + ('\n--- stderr\n' + p.stderr if p.stderr else '')
            k = json.loads(p.stdout.splitlines()[-1]) if p.returncode == 0 else None
            error = None if k else f"exit code {p.returncode}: " + \
                (p.stderr.strip().splitlines() or ['no output'])[-1]
        except subprocess.TimeoutExpired as e:
            out, k, error = (e.stdout or b'').decode(errors='replace'), None, f"timed out after {limit} s"
        row['wall'] = time.time() - t0
        self.write('log', ' '.join(args) + '\n' + out + f"\n{'-' * 30} kernels: "
                          f"{'FAILED: ' + error if error else 'ok'}, {row['wall']:.0f} s\n")
        if error:
            return self.record(dict(row, error=error))
        said = '; '.join(f"{kind} {v['ratio']:.2f}×" + (f" ({v['untimed']} shapes untimed)"
                                                       if v.get('untimed') else '')
                         for kind, v in k['kinds'].items() if v['ratio'] is not None)
        sus, big = k['sustained'], k['sustained']['big']
        ratio = '-'
        if big['ratio']:
            ratio = f"{big['ratio']:.2f}"
        settled = 'settled'
        if not sus['settled']:
            settled = 'not settled'
        row.update(tokens_per_sec=k['measured_tokens_per_sec'], mfu=None, mem_gib=None,
                   reserved_gib=None, host_gib=None, kernels=k['kinds'], sustained=sus,
                   burst_tokens_per_sec=k['burst_tokens_per_sec'],
                   plan=dict(plan=k['strategy'] + ('+ac' if k['ac'] and '+ac' not in k['strategy'] else ''),
                             micro_batch=k['micro'], pred_tokens_per_sec=k['predicted_tokens_per_sec']),
                   note=f"sustained / predicted seconds, {k['dtype']}: {said}; burst "
                        f"{k['burst_tokens_per_sec']:,.0f} tokens/s; matmul {big['shape']} "
                        f"{big['tflops'] or 0:.4g} TFLOP/s sustained, "
                        f"{big['burst_tflops'] or 0:.4g} burst: sustained / burst {ratio}; clock {settled} after "
                        f"{sus['settle_s']:.1f} s, windows of {sus['window']:g} s over "
                        f"{sus['share']:.0%} of the predicted time; copy at "
                        f"{k['kinds']['memory']['copy_gbs']:,.0f} GB/s sustained, "
                        f"{k['kinds']['memory']['copy_burst_gbs']:,.0f} burst")
        return self.record(row)

    def plan_ahead(self, gpu, host):
        # plan_ahead() in a process of its own, from the start (see there)
        code = (f"import json, gpu_check; "
                f"print(json.dumps(gpu_check.plan_ahead({gpu!r}, {host / GiB!r}, {self.dry})))")
        self.ahead = subprocess.Popen([sys.executable, '-c', code], cwd=os.path.join(ROOT, 'bench'),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=dict(os.environ, OMP_NUM_THREADS='1'))
        self.said = f"== planned ahead (plan.py, 1x{gpu}, {host / GiB:.4g} GiB host):\n  "

    def ahead_result(self):
        # plan_ahead's answer, waited for once (at most PLAN_WAIT_S); with 'error' if it failed
        if not self.planned:
            try:
                wait = min(PLAN_WAIT_S, max(1, self.deadline - time.time() - 30))
                text = self.ahead.communicate(timeout=wait)[0]
                self.planned.update(json.loads(text.splitlines()[-1]))
            except subprocess.TimeoutExpired:
                self.stop_ahead()
                self.planned['error'] = 'planning (plan.py) did not end in time'
            except (ValueError, IndexError):
                self.planned['error'] = 'planning failed: ' + (text.strip().splitlines() or ['no output'])[-1]
            said = self.said + '\n  '.join(self.planned.get('answers', [self.planned.get('error')])) + '\n'
            print(said, end='', flush=True)
            self.write('log', '\n' + said)
        return self.planned

    def stop_ahead(self):
        if self.ahead is not None and self.ahead.poll() is None:
            self.ahead.kill()
            self.ahead.communicate()


# Dry run: a tiny model on the CPU, eager
TINY = ['--device=cpu', '--compile=False', '--n_layer=2', '--n_head=2', '--n_embd=64', '--block_size=64']


def main(argv=None):
    a = options(sys.argv[1:] if argv is None else argv)
    # a SIGTERM unwinds as an exception does: measure() then takes its run down with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    c = Check(a, os.environ.get('OUT'))
    if a.host_mem_gib is not None:  # for the runs too: they inherit the environment
        os.environ['HETGPT_HOST_MEM_GIB'] = f'{a.host_mem_gib:g}'
    stated = hardware.stated_host_memory()  # (a bad value: one line, exit 2)
    host, host_from = (stated, 'stated (HETGPT_HOST_MEM_GIB), and the runs plan with it') if stated else (
        meminfo('MemTotal'), 'MemTotal (HETGPT_HOST_MEM_GIB unset: the runs plan with MemAvailable)')
    name, mib, driver = (None, None, None) if c.dry else gpu_facts()
    gpu = gpus.gpu_key(name) or 'H200'
    if c.wanted('offload') or c.wanted('largest'):
        c.plan_ahead(gpu, host)
    import torch
    head = [f"# GPU check{' (dry run on CPU: tiny shapes, eager)' if c.dry else ''}", '',
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
            f"GPU {name or 'none'} ({mib or '-'} MiB), driver {driver or '-'}; torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}); {os.cpu_count()} CPUs; python {sys.version.split()[0]}; "
            f"budget {a.budget:.0f} s (runs end by {a.budget - END_S:.0f} s)", '',
            f"host memory for planning: {host / GiB:.4g} GiB, {host_from}; now MemTotal "
            f"{meminfo('MemTotal') / GiB:.0f} GiB, MemAvailable {meminfo('MemAvailable') / GiB:.0f} GiB", '']
    table = '\n'.join(head) + '\n' + summary([]) + '\n'
    print(table, end='', flush=True)
    c.write('md', table, 'w')
    c.write('jsonl', '', 'w')
    c.write('log', '\n'.join(head) + '\n', 'w')
    try:
        sequence(c, host)
    finally:
        c.stop_ahead()
    failed = [r['label'] for r in c.results if 'error' in r]
    end = f"\n(whole check: {time.time() - c.t_start:.0f} s; {len(c.results)} rows, {len(failed)} failed" \
          + (f": {', '.join(failed)}" if failed else '') + ")\n"
    c.write('md', end)
    # the whole summary again at the end: the GPU host keeps only the end of what a run prints
    print('\n' + '\n'.join(head) + '\n' + summary(c.results) + '\n' + end, flush=True)
    return 1 if failed else 0


def sequence(c, host):
    # Eager runs first (short, predictable), the compiled runs last with the time left
    # 1. memory: predicted against measured, eager (the probe's and the steps' peaks)
    for strategy in STRATEGIES:
        for mb in c.a.micro_batches:
            if c.wanted(f'mem {strategy} mb{mb}'):
                c.run(f'mem {strategy} mb{mb}', ['configs/gpt_1p3b.py', f'--plan={strategy}', '--compile=False',
                                                f'--micro_batch_size={mb}', f'--batch_size={mb}',
                                                '--init_device=meta'], 1, 1, mb)
    # 5. the clock's kernels against this GPU's
    if c.wanted('kernels'):
        c.kernels()
    # 6. float16 with loss scaling, a checkpoint, and a resume from it on CUDA
    if c.wanted('fp16'):
        float16(c)
    # 2. CPU offload: a shape from the host memory; predicted against measured step time and host memory
    if c.wanted('offload'):
        planned = c.ahead_result()
        shape = planned.get('offload')
        if shape is None:
            c.record(dict(label='offload', args='', note='', error=planned.get(
                'error', f'no shape fits half of {host / GiB:.4g} GiB host memory')))
        else:
            note = ('fits the GPU without offload too' if planned['offload_fits_gpu'] else 'needs offload') \
                + f" ({shape['params'] / 1e9:.1f}B)"
            c.run('offload', ['configs/gpt_1p3b.py'] + [f'--{k}={shape[k]}' for k in ('n_layer', 'n_embd', 'n_head')]
                  + ['--plan=fsdp+offload', '--compile=False', '--batch_size=4', '--init_device=meta'],
                  1, 1, 4, note)
    # 3. the largest config this GPU and host train, as the planner says (not hard-coded); when it
    # is 1.3B, 4's compiled run is its row
    biggest, reuse = None, False
    if c.wanted('largest'):
        planned = c.ahead_result()
        biggest = planned.get('largest')
        reuse = biggest == 'configs/gpt_1p3b.py' and c.wanted('1.3B compile')
        if biggest is None:
            c.record(dict(label='largest', args='', note='',
                          error=planned.get('error', 'plan.py fits no config here')))
        elif not reuse:
            c.run(f'largest: {os.path.basename(biggest)}', [biggest, '--compile=False', '--batch_size=8',
                                                            '--init_device=meta'], 1, 1, 2)
    # 4. throughput, bf16 (dtype=auto on these GPUs), compiled
    if c.wanted('124M compile'):
        c.run('124M compile', ['configs/gpt2_124m.py', '--compile=True', '--batch_size=64', '--block_size=1024',
                               '--init_device=meta'], 10, 3, 4)
    if c.wanted('1.3B compile'):
        done = c.run('1.3B compile', ['configs/gpt_1p3b.py', '--compile=True', '--batch_size=16',
                                      '--init_device=meta'], 6, 2, 4)
        if reuse:
            c.record(dict(done, label=f'largest: {os.path.basename(biggest)}',
                          note='the same run as 1.3B compile'))


RESUME_TOLERANCE = 1e-2  # of the loss: a resumed run's steps against the run that went on


def float16(c):
    # 124M in float16 (its gradients scaled: optim.scaler), eager, 4 steps with a checkpoint at
    # steps 2 and 4; then the step-4 checkpoint removed (a run stopped at step 2) and the run
    # resumed from step 2. Steps 3 and 4 of both runs should match: the same batches, weights and
    # optimizer state. Not bit for bit on a GPU (FlashAttention's backward adds in a free order):
    # within RESUME_TOLERANCE of the loss, an allowance far above a float16 step's rounding.
    args = ['configs/gpt2_124m.py', '--dtype=float16', '--compile=False', '--batch_size=8',
            '--init_device=meta']
    with tempfile.TemporaryDirectory() as work:
        first = c.run('fp16 save', args, 2, 2, 2, work=work, then=['--checkpoint_interval=2'],
                      dry_steps=(2, 2), check=lambda row: saved(work, row))
        if not c.wanted('fp16 resume'):
            return
        if 'error' in first:
            return c.record(dict(label='fp16 resume', args='', note='',
                                 error='no checkpoint: fp16 save failed'))
        shutil.rmtree(os.path.join(work, 'out', 'ckpt_00000004'), ignore_errors=True)
        c.run('fp16 resume', args, 2, 2, 2, work=work, then=['--init_from=resume'],
              dry_steps=(2, 2), check=lambda row: resumed(first['losses'], row))


def saved(work, row):
    # the float16 run's checkpoints, and the loss scale it saved (None: no scaler, a failure)
    path = os.path.join(work, 'out', 'ckpt_00000002', 'hetgpt.json')
    try:
        with open(path) as f:
            scale = json.load(f).get('loss_scale')
    except (OSError, ValueError) as e:
        return dict(error=f"no checkpoint at step 2 ({e})")
    if not (isinstance(scale, (int, float)) and scale > 0):
        return dict(error=f"the step-2 checkpoint holds no loss scale ({scale!r})")
    return dict(note=f"checkpoints at steps 2 and 4; loss scale {scale:g} at step 2")


def resumed(losses, row):
    # steps 3 and 4 of the resumed run against the first run's
    diffs = [abs(row['losses'].get(i, math.inf) - losses[i]) for i in sorted(losses)]
    worst = max(diffs) / max(losses.values())
    note = ', '.join(f"step {i}: {row['losses'].get(i, float('nan')):.5f} resumed, {losses[i]:.5f} "
                     f"went on" for i in sorted(losses))
    if not worst <= RESUME_TOLERANCE:
        return dict(error=f"resumed losses differ by {worst:.2g} of the loss", note=note)
    return dict(note=f"{note} (apart by {worst:.1g} of the loss)")



if __name__ == '__main__':
    sys.exit(main())
