"""
plan.py: does a GPT config fit these GPUs, and how? The planner's dry run (hetgpt/planner/search.py),
before any GPU is touched: the model is built on the meta device, nothing is allocated.

$ python plan.py configs/gpt_70b.py --gpus 16xA100-80GB --host_mem 1024 --nodes 2
$ python plan.py configs/gpt_13b.py --gpus 4xA100-80GB,4xV100-32GB --host_mem 512

The model's shape and the batch are train.py's knobs, with its defaults (read from its source)
and rules (hetgpt/knobs.py); the table shows each rank's strategy, micro-batch, memory and predicted speed.
"""
import argparse
import math
import os
import re
import shlex
import sys
import time
from collections import Counter

from hetgpt import knobs
from hetgpt.errors import die
from hetgpt.gpus import GPUS, peak_flops
from hetgpt.knobs import (DTYPES, STRATEGIES, configure, defaults_of, model_defaults,
                          refuses_local_steps)
from hetgpt.planner import cluster, measured

DEFAULT_GPUS = '1xH200'
LISTED = 16  # nodes whose torchrun lines are printed one by one
GiB = 2**30
KNOBS = (*model_defaults(), 'batch_size', 'gradient_accumulation_steps', 'micro_batch_size',
         'memory_fraction', 'max_iters', 'outer_interval')  # (the model's: GPTConfig's fields)
KNOBS += knobs.OPTIMIZER  # (make_optimizer's choice: the planner measures it)
DILOCO_H = 500  # local steps per round where outer_interval is 0: DiLoCo's (arXiv 2311.08105)


def _gpu(name, item):
    # A --gpus NAME: a key of the GPU table or cpu, in any case. Nothing is planned on a guess: a
    # name that begins several keys ('A100': 40 and 80 GB, SXM and PCIe) is one line naming them,
    # and any other name one line naming them all.
    if name and name.lower() == 'cpu':
        return 'cpu'
    found = [k for k in GPUS if name and k.lower() == name.lower()] or \
        [k for k in GPUS if name and k.lower().startswith(name.lower() + '-')]
    if len(found) == 1 and found[0].lower() == name.lower():
        return found[0]
    if found:
        die(f"--gpus {item}: which {name}? say one of {', '.join(found)}")
    die(f"--gpus: cannot read {item!r}; write COUNTxNAME (COUNT >= 1) with NAME one of "
        f"{', '.join(GPUS)}, or cpu (with --host_mem); several joined by commas")


def _cluster(gpus, nodes, host_mem, batch=None, cpu_flops=None):
    # '4xA100-80GB,4xV100-32GB' -> ranks spread evenly over nodes (default, nodes None: 8 GPUs per
    # node), as entries of identical ranks (hetgpt/planner/cluster.py: a million GPUs are a few entries).
    # batch: the global batch, which must hold a sequence per rank (train.py's rule); cpu_flops:
    # a CPU rank's FLOP/s (--cpu_gflops)
    kinds = []
    for item in gpus.split(','):
        m = re.fullmatch(r'(?:(\d+)x)?([A-Za-z0-9-]+)', item.strip())
        if m is None or int(m[1] or 1) < 1:
            _gpu(None, item)  # (cannot read it)
        key = _gpu(m[2], item)
        if len(m[1] or '') > 18:  # (far beyond any batch: no int of thousands of digits)
            die(f"--gpus {item}: at most {knobs.MAX_BATCH:,} ranks (2**24, the largest batch)")
        if key == 'cpu' and not host_mem:
            die(f"--gpus {item}: CPU ranks need --host_mem (GiB per node), their memory")
        kinds.append((int(m[1] or 1), key))
    R = sum(c for c, _ in kinds)
    if batch is not None and R > knobs.MAX_BATCH:  # (before any work that grows with R)
        knobs.feeds(batch, R)
    if nodes is not None and nodes > R:
        die(f"--nodes {nodes} but --gpus {gpus} has {R:,} ranks: at least one per node")
    nodes = nodes or math.ceil(R / 8)
    per = math.ceil(R / nodes)
    if math.ceil(R / per) < nodes:  # 12 GPUs on 5 nodes: 3 each fill only 4
        fits = sorted({d for k in range(1, math.isqrt(R) + 1) if R % k == 0 for d in (k, R // k)})
        die(f"--nodes {nodes} does not fit {R:,} GPUs (--gpus {gpus}): spread evenly, "
            f"they leave a node empty; give --nodes one of {', '.join(map(str, fits))}")
    if batch is not None:
        knobs.feeds(batch, R)
    host = host_mem * GiB if host_mem else None
    host_from = 'given (--host_mem)' if host else None
    # a CPU rank's threads: torchrun gives each of a node's 2+ ranks one (OMP_NUM_THREADS=1); a
    # lone process has torch's default, the cores it may use (as on this machine)
    threads = 1 if per > 1 else len(os.sched_getaffinity(0))
    rank = lambda g: dict(device='cuda', gpu=g, host_mem=host, host_from=host_from) \
        if g != 'cpu' else dict(device='cpu', gpu=None, host_mem=host, host_from=host_from,
                                mem=host and host // per, flops=cpu_flops, threads=threads)
    return cluster.layout([(c, rank(g)) for c, g in kinds], per)


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other mistake (argparse prints the usage too)
        die(f"{message} (python plan.py -h for help)")


def main(argv=None):
    # Returns 0 when the config fits, 1 when it does not; a mistake in the arguments exits 2.
    t0 = time.time()
    ap = ArgumentParser(
        description="Does a GPT config fit these GPUs, and how? (meta device, no GPU needed)",
        epilog="examples:\n"
               "  python plan.py configs/gpt_13b.py --gpus 8xA100-80GB\n"
               "  python plan.py configs/gpt_70b.py --gpus 16xA100-80GB --host_mem 1024 "
               "--nodes 2\n"
               "  python plan.py configs/gpt_13b.py --gpus 4xA100-80GB,4xV100-32GB "
               "--host_mem 512\n"
               "  python plan.py configs/gpt_tiny.py --gpus 2xcpu --host_mem 16\n"
               "  python plan.py configs/gpt_1p3b.py --gpus 2xRTX4090 --nodes 2 --link_gbit 1\n"
               "exit status: 0 fits, 1 does not fit (and what would), 2 a mistake",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('config', nargs='+',
                    help="configs/*.py, and --key=value overrides of the train.py knobs plan.py "
                         "reads: the model's shape (n_layer, n_embd, ...), the batch (batch_size, "
                         "gradient_accumulation_steps, micro_batch_size: e.g. "
                         "--micro_batch_size=4) and memory_fraction")
    ap.add_argument('--gpus', default=None,
                    help=f"COUNTxNAME[,COUNTxNAME...], NAME one of {', '.join(GPUS)}, or cpu "
                         f"(CPU ranks need --host_mem): e.g. 16xA100-80GB, "
                         f"4xA100-80GB,4xV100-32GB, 2xcpu --host_mem 16 (default: {DEFAULT_GPUS})")
    ap.add_argument('--host_mem', type=float, default=None,
                    help="host memory per node, GiB (default: not checked)")
    ap.add_argument('--nodes', type=int, default=None, help="ranks spread evenly over them "
                    "(default: 8 GPUs per node)")
    ap.add_argument('--plan', default='auto', choices=('auto',) + STRATEGIES)
    ap.add_argument('--dtype', default='auto', choices=('auto',) + DTYPES,
                    help="as train.py's: auto (each GPU's fastest under DDP; under FSDP one for "
                         "all, the fastest), or one for all")
    ap.add_argument('--inter_node_gbs', type=float, default=None,
                    help="GB/s of NIC per GPU between nodes (default: the GPU's reference "
                    "system); NCCL drives a node's NICs together")
    ap.add_argument('--link_gbit', type=float, default=None,
                    help="Gbit/s of each node's network link, e.g. 1 (1 GbE) or 0.1 (100 Mbit/s): "
                    "--inter_node_gbs for an ordinary network; with 2+ nodes plan.py also times "
                    "local steps (--outer_interval=H, docs/two_machines.md)")
    ap.add_argument('--cpu_gflops', type=float, default=None,
                    help="GFLOP/s of a CPU rank (default: a guess, 100 a thread; under torchrun "
                         "each of a node's 2+ ranks has one thread, a lone process its CPUs)")
    ap.add_argument('--measured', metavar='OUT_DIR', default=None,
                    help="a train.py run's out_dir (finished or running): the kinds of GPU "
                         "(or cpu) it had are planned at the step efficiency it measured "
                         "(its measured.json), the others at their priors")
    args, rest = ap.parse_known_args(argv)
    for name, ok, want in (  # (nan and inf fail these comparisons)
            ('host_mem', args.host_mem is None or 0 < args.host_mem < math.inf, 'a number > 0'),
            ('nodes', args.nodes is None or args.nodes >= 1, '>= 1 (default: 8 GPUs per node)'),
            ('inter_node_gbs', args.inter_node_gbs is None or 0 < args.inter_node_gbs < math.inf,
             'a number > 0'),
            ('link_gbit', args.link_gbit is None or 0 < args.link_gbit < math.inf and
             args.inter_node_gbs is None, 'a number > 0, and no --inter_node_gbs with it'),
            ('cpu_gflops', args.cpu_gflops is None or 0 < args.cpu_gflops < math.inf,
             'a number > 0')):
        if not ok:
            die(f"--{name} {getattr(args, name)}: must be {want}")
    for a in args.config + rest:
        if not (a.startswith('--') or a.endswith('.py')):
            die(f"{a!r}: give config files (configs/*.py) and --key=value overrides")
    # the model's shape, the batch and memory_fraction: train.py's knobs, with its defaults and
    # rules (knobs.TRAIN; the defaults read from train.py's source: nothing of it runs)
    defaults = {k: v for k, v in defaults_of(knobs.TRAIN_PY, model=True).items() if k in KNOBS}
    rules = knobs.TRAIN
    config = configure(defaults, args.config + rest, strict_files=False,
                       rules={k: rules.get(k, '') for k in KNOBS})
    knobs.check_shape(config)
    # nanoGPT's configs: gradient_accumulation_steps > 0 makes batch_size the micro-batch
    batch, micro = knobs.batch_of(config['batch_size'], config['gradient_accumulation_steps'],
                                  config['micro_batch_size'])
    ranks = _cluster(DEFAULT_GPUS if args.gpus is None else args.gpus, args.nodes, args.host_mem,
                     batch, args.cpu_gflops and args.cpu_gflops * 1e9)
    why = refuses_local_steps(None, cluster.per_node(ranks).values())
    if config['outer_interval'] and why:  # (train.py would refuse the run)
        die(f"--outer_interval={config['outer_interval']} on {cluster.node_count(ranks)} nodes: "
            f"{why}; {_even(ranks)}, or --outer_interval=0")
    record = None  # (a damaged one: one line, before torch)
    if args.measured is not None:
        record = measured.read(args.measured)
    inter_node_bw = args.inter_node_gbs and args.inter_node_gbs * 1e9
    if args.link_gbit:  # (per rank, as a GPU's NIC: timing.bandwidth sums a node's)
        inter_node_bw = args.link_gbit * 1e9 / 8 / max(cluster.per_node(ranks).values())
    # the knobs and GPUs hold: now the planner, and torch under it (a mistake above is one line
    # in a tenth of a second, without it)
    from hetgpt.planner.plan import duration
    from hetgpt.planner.search import make_plan
    from model import config_from
    planned = lambda ranks, dtype=args.dtype: make_plan(
        config_from(config), batch, ranks, plan=args.plan, micro_batch_size=micro,
        knobs={k: config[k] for k in knobs.OPTIMIZER if k in config},
        memory_fraction=config['memory_fraction'], dtype=dtype, inter_node_bw=inter_node_bw,
        outer_interval=config['outer_interval'])
    if record:
        ranks, said = measured.apply(record, ranks, args.measured)
        print(said)
    p = planned(ranks)
    if args.gpus is None:
        print(f"no --gpus given: planned for {DEFAULT_GPUS}; choose with --gpus, e.g. "
              f"--gpus 8xA100-80GB")
    print(p.table())
    if p.fits and p.step_time:
        steps = config['max_iters']
        print(f"the run: max_iters {steps:,} × {p.step_time:.3g} s = {duration(steps * p.step_time)}"
              f" predicted, {steps * batch * config['block_size']:,} tokens")
    if p.fits:
        for line in choices(p, ranks, args.dtype, planned):
            print(line)
    if p.fits and p.step_time and cluster.node_count(ranks) > 1:
        print(local_steps(p, ranks, config['outer_interval'], inter_node_bw, args.link_gbit))
    if p.fits and all(r['device'] == 'cuda' for r in ranks):
        print(launch(ranks, args.config + rest))
    print(f"({time.time() - t0:.1f} s)")
    return 0 if p.fits else 1


def choices(p, ranks, dtype, planned):
    # What each kind of GPU adds to the step's tokens/s (the plan without them), and another
    # dtype setting where it runs some GPU at another rate (a V100: float16 only, bfloat16 at its
    # float32 rate) and is faster: the gain and the flag
    kinds = Counter()
    for r in ranks:
        kinds[r['gpu'] or 'cpu'] += r['count']
    if len(kinds) > 1:
        for kind, n in kinds.items():
            q = planned([r for r in ranks if (r['gpu'] or 'cpu') != kind])
            adds = f"{p.tokens_per_sec / q.tokens_per_sec - 1:+.1%}" if q.fits else \
                "the fit: the rest alone do not fit"
            yield f"the {n:,} × {kind} add {adds} tokens/s" + (
                f"; leave them out: {q.tokens_per_sec / p.tokens_per_sec - 1:+.1%}"
                if q.fits and q.tokens_per_sec > p.tokens_per_sec else '')
    from hetgpt.hardware import native_dtype  # (torch, as make_plan already has it)
    rates = lambda dtypes: [peak_flops(r['gpu'], d) for r, d in zip(p.ranks, dtypes)]
    for other in ('auto', 'bfloat16', 'float16'):  # (float32: slower on every GPU of the table)
        own = [native_dtype(r['device'], r['gpu']) if other == 'auto' else other
               for r in p.ranks]
        if other == dtype or rates(own) == rates(p.dtypes):
            continue
        q = planned(ranks, other)
        if q.fits and q.tokens_per_sec > p.tokens_per_sec:
            yield (f"--dtype={other} (here and in train.py) would give "
                   f"{q.tokens_per_sec / p.tokens_per_sec - 1:+.1%} tokens/s")


def _even(ranks):
    # The --nodes that give every node as many ranks (local steps' layout), beyond one
    R = cluster.world(ranks)
    even = sorted({d for k in range(1, math.isqrt(R) + 1) if R % k == 0 for d in (k, R // k)})
    return f"give --nodes one of {', '.join(map(str, even[1:]))}"


def local_steps(p, ranks, interval, inter_node_bw, link_gbit):
    # Local steps (hetgpt/run/local_steps.py) against every step, as predicted (timing.local_step_times):
    # at outer_interval if set, else at DiLoCo's H. Where train.py would refuse them (the plan's
    # strategy, the ranks per node: knobs.refuses_local_steps), why, and what would do.
    from hetgpt.planner.timing import local_step_times
    H = interval or DILOCO_H
    why = refuses_local_steps(p.strategy, cluster.per_node(ranks).values())
    if p.shard:
        return f"local steps (outer_interval): not for this plan: {why}; --outer_interval=H plans one"
    if why:
        return f"local steps (outer_interval): not for this layout: {why}; {_even(ranks)}"
    every, local, exchange = local_step_times(p, H, inter_node_bw)
    alone = local - exchange / H
    return (f"local steps, outer_interval={H}" + ('' if interval else
            " (DiLoCo's; set it with --outer_interval=H)") + f": step {local:.3g} s (a node "
            f"alone {alone:.3g} s + exchange {exchange:.3g} s / {H}), {every / local:.2f}× every "
            f"step's tokens/s (step {every:.3g} s" + (f" over {link_gbit:g} Gbit/s links"
            if link_gbit else '') + ("): local steps are faster" if local < every else
            "): every step is as fast or faster: outer_interval=0"))


def launch(ranks, train_args):
    # The torchrun line to run this plan, one per node: each node's own count of GPUs (torchrun's
    # agents tell each other theirs), node 0's address for HOST0. Beyond LISTED nodes, one line
    # per run of nodes alike, NODE standing for each node's number.
    args = ' '.join(['train.py', *map(shlex.quote, train_args)])
    per_node, nodes = cluster.per_node(ranks), cluster.node_count(ranks)
    if nodes == 1:
        return f"run it: torchrun --standalone --nproc_per_node={cluster.world(ranks)} {args}"
    alike = sorted({r['node']: r['nodes'] for r in ranks}.items())
    line = lambda name, n, k: (f"  {name}: torchrun --nnodes={nodes} --node_rank={n} "
                               f"--nproc_per_node={k} --master_addr=HOST0 --master_port=29500 "
                               f"{args}")
    if nodes <= LISTED:
        return '\n'.join(["run it, on each node (HOST0: node 0's address):"] + [
            line(f"node {n + j}", n + j, per_node[n]) for n, count in alike for j in range(count)])
    return '\n'.join(["run it, on each node (HOST0: node 0's address, NODE: the node's number):"]
                     + [line(f"node {n}" if count == 1 else f"nodes {n}-{n + count - 1}",
                             n if count == 1 else 'NODE', per_node[n]) for n, count in alike])


if __name__ == '__main__':
    sys.exit(main())
