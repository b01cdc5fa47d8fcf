"""
The plan checked on the real device before training: each rank runs
training steps at its micro-batch cap and measures its peak memory; the
caps that failed are halved (after_oom), and all probe again.
"""
import math
import time

import torch

import model as network
from hetgpt import hardware
from hetgpt.errors import die
from hetgpt.knobs import STRATEGIES
from hetgpt.planner import costs, search
from hetgpt.run.process_group import gather


def fit_caps(plan, rank, step, device_type, stated, log, compile,
             by_speed):
    """The micro-batch caps every rank's memory holds, probed.

    step(sizes): a training step of this rank's micro-batches (sizes) that
    leaves the weights as they are (optim.frozen). Returns (caps, every
    rank's peak, this rank's peak). compile, by_speed: what the user is
    told comes first and after (the speed's micro-batches).
    """
    said = (f"probe step: training steps at micro-batch {plan.caps[0]} "
            f"(weights unchanged) to check memory")
    if compile:
        said += " (compiling first: slow the first time)"
    if by_speed:
        said += "; then timed micro-batches on every rank to split the batch"
    log(said)
    # as many steps as make the steps that follow: DDP rebuilds its
    # buckets in its second
    steps = 2
    if len(plan.caps) > 1 and not plan.shard:
        steps = 3
    if plan.frees_host_memory(rank):  # (before the probe: as the steps run)
        hardware.return_freed_host_memory()
    caps = plan.caps
    # (this rank's micro-batches at its cap: as many as the plan gives it,
    # up to 2)
    while True:
        count = min(2, len(search.resplit(plan, caps).sizes[rank]))
        mine = probe([caps[rank]] * count, plan, rank, step, steps,
                     device_type, stated)
        peaks = gather(mine)
        if all(peaks):
            return caps, peaks, mine
        caps = after_oom(caps, peaks, plan.strategy)
        log(f"out of memory in the probe step: micro-batches now {caps}")


def after_oom(caps, peaks, strategy):
    """The caps after a probe step that ran out of memory (peak None) on
    some ranks: they halve their micro-batch.

    At one sequence there is nothing to halve: the next rung is the way.
    """
    if any(peak is None and cap == 1 for peak, cap in zip(peaks, caps)):
        rungs = STRATEGIES[STRATEGIES.index(strategy) + 1:]
        if rungs:
            hint = 'plan=' + rungs[0]
        else:
            hint = 'more GPUs or a shorter block_size'
        die(f"out of memory at micro-batch 1 under plan {strategy}: try "
            f"{hint}")
    halved = []
    for peak, cap in zip(peaks, caps):
        if not peak:
            cap = max(1, cap // 2)
        halved.append(cap)
    return halved


def probe(sizes, plan, rank, step, steps, device_type, stated):
    """This rank's peak memory over steps training steps of sizes.

    The last step is measured: the optimizer's state and compiled kernels
    are there from the first, as in every later step. Returns this rank's
    peak bytes and, on CUDA, the bytes outside the allocator once the
    step's kernels are loaded; None when out of memory or above the plan's
    room. (A host whose peak RSS cannot be reset is never above.)
    """
    cuda = device_type == 'cuda'
    try:
        for i in range(steps):
            last = i == steps - 1
            resets = last and (hardware.reset_peaks(device_type) or cuda)
            step(sizes)
        # (stated, the GPU may be shared: what is outside the allocator is
        # not all this rank's)
        outside = alloc = None
        if cuda and stated is None:
            outside = hardware.outside_allocator()
        if cuda:
            total = torch.cuda.max_memory_reserved()
            alloc = torch.cuda.max_memory_allocated()
        else:
            total = hardware.peak_rss()
        peak = dict(total=total, overhead=outside, alloc=alloc)
        if resets and peak['total'] > plan.room(rank, outside):
            peak = None
    except torch.cuda.OutOfMemoryError:
        peak = None
    return peak


def host_step_rate(device_type, elements=2**24):
    """Bytes/s of model.make_optimizer's step on this process's CPU.

    Counted as the planner counts a step (weights and gradients 16 bytes
    per element, its state read and written): what an offloaded step
    costs on this GPU host, measured by each rank at start-up, all at
    once (each with the threads torchrun gives it: OMP_NUM_THREADS=1).
    2**24 elements: 256 MB with AdamW's state, beyond the caches. None on
    a CPU rank: its planned step is a guess (planner). Either way it
    first loads what any step loads (optimizer_state_bytes).
    """
    costs.optimizer_state_bytes(network.GPTConfig())
    if device_type != 'cuda':
        return None
    net = torch.nn.Module()
    net.weight = torch.nn.Parameter(torch.zeros(elements // 4096, 4096))
    net.weight.grad = torch.ones_like(net.weight)
    optimizers = network.make_optimizer(net, costs.train_knobs())
    for opt in optimizers:  # (the first step makes the state)
        opt.step()
    seconds = math.inf
    # the fastest of three: a shared machine's noise only slows a step
    for _ in range(3):
        start = time.perf_counter()
        for opt in optimizers:
            opt.step()
        seconds = min(seconds, time.perf_counter() - start)
    tensors = [t for opt in optimizers for st in opt.state.values()
               for t in st.values() if torch.is_tensor(t) and t.numel() > 1]
    state = costs.storage_bytes(tensors, set())
    return (16 * elements + 2 * state) / seconds
