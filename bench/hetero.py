"""
Heterogeneous ranks on one 2-core CPU machine (issue 4): rank 0 alone on core 0, rank 1 on core 1
sharing that core with a CPU-bound busy loop (so about half as fast). In one run, with the hog
running throughout:
  ideal  = speed of a 1-process run pinned to core 0 + speed of one pinned to core 1 (run side by
           side, so both cores are busy as in the 2-rank run)
  even   = 2-rank run, balance=even       (expected about 2·min/sum of ideal)
  auto   = 2-rank run, balance=auto, rebalance_interval small (aim: >= 0.95 of ideal)
each 2-rank run under DDP and under FSDP (--plans; one row each, against the same ideal). Speeds are
tokens/s from metrics.jsonl, the median of the log rows after the warm-up steps; "idle" is each
rank's mean idle fraction over those rows as train.py logs it (1 - its compute time / step time).

  python bench/hetero.py                 # 2 rounds of 60 steps: ~6 min on 2 cores (batch 64: ~9)
  python bench/hetero.py --rounds=1 --nice=0 --keep --plans=fsdp

On a machine that others use, their processes skew every figure (the scheduler even moves them to
core 0, making the cores alike): the bench reports their share of the cores per phase ("foreign
load") and, as root, runs its processes at nice -15 (--nice) so that they mostly yield.

The ranks are started here, not by torchrun, so that each can be pinned with taskset. The hog and
every child are killed on exit, Ctrl-C included.
"""
import argparse
import atexit
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
from trainer import make_dataset  # noqa: E402
from hetgpt.run.metrics import read_rows  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split('\n')[1], formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--steps', type=int, default=60, help='optimizer steps per run')
p.add_argument('--warmup', type=int, default=15, help='log rows at iter <= this are skipped')
p.add_argument('--rounds', type=int, default=2,
               help='repeat solo/even/auto this many times, the order reversed every other round')
p.add_argument('--batch_size', type=int, default=32)
p.add_argument('--plans', default='ddp,fsdp', help='the strategies of the 2-rank runs (train.py plan=)')
p.add_argument('--rebalance_interval', type=int, default=10)
p.add_argument('--log_interval', type=int, default=5)
p.add_argument('--train', default=os.path.join(ROOT, 'train.py'), help='the train.py to run')
p.add_argument('--compare', default='', help='another train.py (a private copy with a fix, say), run as a 4th '
               'phase "alt" with balance=auto, interleaved with the others')
p.add_argument('--quiet_wait', type=int, default=30,
               help='wait up to this many seconds for the other load on cores 0-1 to fall below 10%% first')
p.add_argument('--nice', type=int, default=-15 if os.geteuid() == 0 else 0,
               help='scheduling nice of the hog and the runs (e.g. -10, as root): shields them from other '
                    "people's work on a shared machine; each child is its own session, so it is set on its autogroup")
p.add_argument('--keep', action='store_true', help='keep the work directory (logs, metrics)')
p.add_argument('--timeout', type=int, default=400, help='seconds per run before giving up')
args = p.parse_args()
if args.warmup >= args.steps - args.log_interval:
    p.error(f"--warmup={args.warmup} leaves no log rows in --steps={args.steps}")

MODEL = ['--bias=False', '--n_layer=4', '--n_head=4', '--n_embd=128', '--block_size=128', '--vocab_size=256',
         '--device=cpu', '--dtype=float32', '--compile=False', '--dropout=0.0', '--dataset=synth', f'--batch_size={args.batch_size}',
         '--eval_iters=2', '--eval_interval=100000', '--checkpoint_interval=100000', '--keep_last=1',
         '--warmup_iters=10', '--lr_decay_iters=1000', f'--log_interval={args.log_interval}']
DIST_VARS = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT',
             'GROUP_RANK', 'ROLE_RANK', 'TORCHELASTIC_RUN_ID')
BASE_ENV = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
BASE_ENV.update(OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', PYTHONWARNINGS='ignore', PYTHONUNBUFFERED='1')

children = []   # every Popen started here, each the leader of its own process group
cpu_seen = {}   # pid -> last CPU seconds read from /proc (the process is gone once reaped)
TICK = os.sysconf('SC_CLK_TCK')


def spawn(cmd, **kw):
    proc = subprocess.Popen(cmd, start_new_session=True, **kw)
    children.append(proc)
    if args.nice:
        # With sched_autogroup (Linux's default) CFS shares a core between sessions first, so the
        # session's autogroup carries the nice; without it, the process's own nice does.
        try:
            with open(f'/proc/{proc.pid}/autogroup', 'w') as f:
                f.write(str(args.nice))
        except OSError:
            pass
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, args.nice)
        except OSError as e:
            print(f"warning: cannot set nice {args.nice} on pid {proc.pid}: {e}", file=sys.stderr)
    return proc


def kill(proc):
    if proc.poll() is None:
        proc_cpu(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own group: the pid we started, and its children
        except ProcessLookupError:
            pass
        proc.wait()


def cleanup():
    for proc in children:
        kill(proc)


atexit.register(cleanup)
signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the shell started us ignoring it
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))


def proc_cpu(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
        cpu_seen[pid] = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
    except (OSError, IndexError, ValueError):
        pass
    return cpu_seen.get(pid, 0.0)


def ours_cpu():
    return sum(proc_cpu(pr.pid) for pr in children)


def cores_busy():
    # Busy seconds of cores 0 and 1 together, from /proc/stat.
    busy = 0
    for line in open('/proc/stat'):
        if re.match(r'cpu[01] ', line):
            v = [int(x) for x in line.split()[1:]]
            busy += sum(v) - v[3] - v[4]  # all but idle and iowait
    return busy / TICK


class Foreign:
    # CPU time on cores 0-1 used by processes not started here, as a share of the phase's 2 cores:
    # other people's work on this machine, the noise of the measurement.
    def __enter__(self):
        self.t, self.busy, self.ours = time.time(), cores_busy(), ours_cpu()
        return self

    def __exit__(self, *exc):
        wall = time.time() - self.t
        self.share = max(0.0, (cores_busy() - self.busy) - (ours_cpu() - self.ours)) / (2 * wall)


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def start_train(work, name, core, extra, env, train=None):
    out = os.path.join(work, name)
    os.makedirs(out, exist_ok=True)
    rank = env.get('RANK', '0')
    logf = open(os.path.join(out, f'rank{rank}.log'), 'w')
    cmd = ['taskset', '-c', str(core), sys.executable, train or args.train] + MODEL + [f'--out_dir={out}'] + extra
    return spawn(cmd, cwd=work, env=env, stdout=logf, stderr=subprocess.STDOUT), out


def wait_all(procs, deadline, what):
    while any(pr.poll() is None for pr in procs):
        ours_cpu()
        if any(pr.poll() not in (None, 0) for pr in procs) or time.time() > deadline:
            break
        time.sleep(0.1)
    bad = [pr for pr in procs if pr.poll() != 0]
    if bad:
        for pr in procs:
            kill(pr)
        raise SystemExit(f"{what} failed (exit {[pr.returncode for pr in procs]}; timeout {args.timeout}s); "
                         f"see the logs under {WORK} (kept)")


def speed(out):
    rows = read_rows(os.path.join(out, 'metrics.jsonl'))
    tps = [r['tokens_per_sec'] for r in rows if 'tokens_per_sec' in r and r['iter'] > args.warmup]
    if not tps:
        raise SystemExit(f"no log rows after iter {args.warmup} in {out}/metrics.jsonl")
    return statistics.median(tps), len(tps)


def solo_pair(work, tag):
    # A 1-process run on each core, side by side; core 0's (faster) keeps going until core 1's is done,
    # so that both cores are busy for the whole measurement, as in the 2-rank run.
    env = dict(BASE_ENV)
    p0, o0 = start_train(work, f'{tag}_solo0', 0, [f'--max_iters={args.steps * 10}'], env)
    p1, o1 = start_train(work, f'{tag}_solo1', 1, [f'--max_iters={args.steps}'], env)
    wait_all([p1], time.time() + args.timeout, 'solo run on core 1')
    if p0.poll() not in (None, 0):
        raise SystemExit(f"solo run on core 0 failed (exit {p0.returncode}); see {o0}")
    kill(p0)
    (s0, n0), (s1, n1) = speed(o0), speed(o1)
    return s0, s1, n0, n1


def two_ranks(work, tag, plan, balance, train=None):
    env = dict(BASE_ENV, WORLD_SIZE='2', LOCAL_WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()))
    extra = [f'--max_iters={args.steps}', f'--plan={plan}', f'--balance={balance}',
             f'--rebalance_interval={args.rebalance_interval}']
    procs, out = [], None
    for r in (0, 1):
        pr, o = start_train(work, f"{tag}_{plan}_{balance}{'_alt' if train else ''}", r, extra,
                            dict(env, RANK=str(r), LOCAL_RANK=str(r)), train)
        procs.append(pr)
        out = out or o
    wait_all(procs, time.time() + args.timeout, f'2-rank run plan={plan} balance={balance}')
    log = open(os.path.join(out, 'rank0.log')).read()
    first = re.search(r'shares (\[[\d, ]+\])', log)
    rebalances = re.findall(r'iter (\d+): rebalanced (\[[\d, ]+\]) -> (\[[\d, ]+\])', log)
    ranks = re.findall(r'^iter (\d+): loss .*\n  (rank 0: .*)$', log, re.M)
    idle = [[int(x) for x in re.findall(r'idle (\d+)%', line)] for i, line in ranks if int(i) > args.warmup]
    s, n = speed(out)
    return dict(tps=s, rows=n, start=first.group(1) if first else '?',
                final=rebalances[-1][2] if rebalances else (first.group(1) if first else '?'),
                rebalances=[f"@{i}: {a}->{b}" for i, a, b in rebalances], last=ranks[-1][1] if ranks else '',
                idle='/'.join(f"{statistics.mean(x):.0f}%" for x in zip(*idle)) if idle else '?')


NOISY = 0.05  # a round whose solo phase had more foreign load than this is left out of the median


def fmt(x):
    return f"{x:,.0f}"


WORK = tempfile.mkdtemp(prefix='hetgpt_hetero_')
ok = False
try:
    make_dataset(WORK)
    t_wait = time.time()
    while True:  # other people's work skews every figure: start when the machine is quiet, if it gets so
        with Foreign() as fg:
            time.sleep(3)
        if fg.share < 0.10 or time.time() - t_wait > args.quiet_wait:
            break
    print(f"other load on cores 0-1 at start: {fg.share:.0%} (waited {time.time() - t_wait:.0f}s)", file=sys.stderr)
    hog = spawn(['taskset', '-c', '1', sys.executable, '-c', 'while True: pass'], env=BASE_ENV)
    time.sleep(1.0)
    t_start = time.time()
    print(f"work dir {WORK}; nice {args.nice}; hog pid {hog.pid} on core 1; {args.steps} steps per run, rows after iter "
          f"{args.warmup}, batch {args.batch_size} x 128 tokens, rebalance_interval {args.rebalance_interval}",
          file=sys.stderr)
    plans = args.plans.split(',')
    results = []
    for rnd in range(args.rounds):
        order = ['solo'] + [f'{plan} {b}' for plan in plans for b in ['even', 'auto'] + (['alt'] if args.compare else [])]
        order = order if rnd % 2 == 0 else order[::-1]
        res = {}
        for what in order:
            t0 = time.time()
            with Foreign() as fg:
                if what == 'solo':
                    res['s0'], res['s1'], n0, n1 = solo_pair(WORK, f'r{rnd}')
                else:
                    plan, balance = what.split()
                    res[what] = two_ranks(WORK, f'r{rnd}', plan, 'auto' if balance == 'alt' else balance,
                                          args.compare if balance == 'alt' else None)
            res[f'{what} foreign'] = fg.share
            if what == 'solo':
                print(f"round {rnd}: solo core0 {fmt(res['s0'])} tok/s ({n0} rows), core1+hog {fmt(res['s1'])} "
                      f"tok/s ({n1} rows)", end='', file=sys.stderr)
            else:
                print(f"round {rnd}: {what:9s} {fmt(res[what]['tps'])} tok/s ({res[what]['rows']} rows), shares "
                      f"{res[what]['start']} -> {res[what]['final']}, idle {res[what]['idle']}", end='', file=sys.stderr)
            print(f"  [{time.time() - t0:.0f}s, foreign load {fg.share:.0%} of the 2 cores]", file=sys.stderr)
        results.append(res)

    print(f"\n{args.rounds} round(s) in {time.time() - t_start:.0f}s, nice {args.nice}; batch {args.batch_size}; tokens/s, "
          f"median of log rows after iter {args.warmup} of {args.steps}; idle: rank 0/rank 1, mean over those rows")
    print("| round | plan | core 0 alone | core 1 + hog alone | ideal (sum) | even | auto | even/ideal | 2·min/sum | "
          "auto/ideal | auto shares (start -> end) | rebalances | idle even / auto | foreign load solo/even/auto |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rnd, r in enumerate(results):
        ideal = r['s0'] + r['s1']
        for plan in plans:
            even, auto = r[f'{plan} even'], r[f'{plan} auto']
            print(f"| {rnd}{'' if r['solo foreign'] <= NOISY else ' (noisy solo)'} | {plan} | {fmt(r['s0'])} | {fmt(r['s1'])} | "
                  f"{fmt(ideal)} | {fmt(even['tps'])} | {fmt(auto['tps'])} | {even['tps'] / ideal:.3f} | "
                  f"{2 * min(r['s0'], r['s1']) / ideal:.3f} | **{auto['tps'] / ideal:.3f}** | {auto['start']} -> {auto['final']} | "
                  f"{', '.join(auto['rebalances']) or 'none'} | {even['idle']} / {auto['idle']} | "
                  f"{r['solo foreign']:.0%}/{r[f'{plan} even foreign']:.0%}/{r[f'{plan} auto foreign']:.0%} |")
    clean = [r for r in results if r['solo foreign'] <= NOISY]
    if len(results) > 1 and clean:
        med = lambda f: statistics.median(f(r) for r in clean)  # noqa: E731
        for plan in plans:
            e, a = f'{plan} even', f'{plan} auto'
            print(f"| median{'' if len(clean) == len(results) else f' of the {len(clean)} clean'} | {plan} | "
                  f"{fmt(med(lambda r: r['s0']))} | {fmt(med(lambda r: r['s1']))} | "
                  f"{fmt(med(lambda r: r['s0'] + r['s1']))} | {fmt(med(lambda r: r[e]['tps']))} | "
                  f"{fmt(med(lambda r: r[a]['tps']))} | {med(lambda r: r[e]['tps'] / (r['s0'] + r['s1'])):.3f} | "
                  f"{med(lambda r: 2 * min(r['s0'], r['s1']) / (r['s0'] + r['s1'])):.3f} | "
                  f"**{med(lambda r: r[a]['tps'] / (r['s0'] + r['s1'])):.3f}** | | | | |")
    if args.compare:
        print(f"\nalt: balance=auto with {args.compare}")
        for rnd, r in enumerate(results):
            ideal = r['s0'] + r['s1']
            for plan in plans:
                alt, auto = r[f'{plan} alt'], r[f'{plan} auto']
                print(f"round {rnd} {plan}: alt {fmt(alt['tps'])} tok/s, alt/ideal {alt['tps'] / ideal:.3f} "
                      f"(auto/ideal {auto['tps'] / ideal:.3f}), shares {alt['start']} -> {alt['final']}, "
                      f"rebalances {', '.join(alt['rebalances']) or 'none'}, idle {alt['idle']}, "
                      f"foreign load {r[f'{plan} alt foreign']:.0%}")
    print("\nforeign load: busy time of cores 0-1 not spent in the processes of this bench (other people's work; "
          "in the 2-rank phases also the kernel's loopback traffic, and others using the time a rank waits), "
          "as a share of both cores during that phase; in the solo phase above a few % the ratios are unreliable")
    for plan in plans:
        for b in ('even', 'auto'):
            print(f"last log line, {plan} {b}: {results[-1][f'{plan} {b}']['last']}")
    ok = True
finally:
    cleanup()
    if ok and not args.keep:
        shutil.rmtree(WORK, ignore_errors=True)
    elif os.path.isdir(WORK):
        print(f"logs kept in {WORK}", file=sys.stderr)
