"""
What the devices at hand are: what a running rank has (its device, memory,
dtype), the host's memory, and train.py's device and compile settings made
concrete. The GPU table: hetgpt/gpus.py.
"""
import ctypes
import math
import os
import re
import resource
import shutil

import torch

from hetgpt.errors import die
from hetgpt.gpus import GPUS, UNKNOWN_GPU, gpu_key


def host_memory_available():
    """Bytes the OS could give now (MemAvailable), for train.py's ranks."""
    with open('/proc/meminfo') as f:
        info = {line.split(':')[0]: int(line.split()[1]) * 1024
                for line in f}
    return info.get('MemAvailable', info['MemTotal'])


def peak_rss():
    """The host's peak RSS of this process, in bytes: since reset_peak_rss
    where Linux allows it, else ever."""
    try:
        with open('/proc/self/status') as f:
            found = re.search(r'VmHWM:\s+(\d+) kB', f.read())
            return int(found.group(1)) * 1024
    except (OSError, AttributeError):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_maxrss * 1024  # KiB on Linux


def rss():
    """This process's resident bytes now; None where /proc cannot tell."""
    try:
        with open('/proc/self/status') as f:
            found = re.search(r'VmRSS:\s+(\d+) kB', f.read())
            return int(found.group(1)) * 1024
    except (OSError, AttributeError):
        return None


def reset_peak_rss():
    """Resets this process's peak RSS to its current RSS (Linux since
    4.0); True if it did."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def _stated_gib(name, local_rank, per_rank, most=None):
    """The one reader of the HETGPT_*_GIB variables: this rank's GiB, as
    bytes; None when unset.

    Each figure GiB > 0 and finite (nan and inf fail). per_rank: one
    number for every local rank or one per local rank. most: (bytes, what
    they are) this rank's number may not exceed; never above ABSURD_GIB.
    """
    text = os.environ.get(name, '')
    if not text:
        return None
    try:
        gib = [float(x) for x in text.split(',')]
    except ValueError:
        gib = []
    fits = len(gib) == 1 or (per_rank and len(gib) > local_rank)
    if not (gib and fits and all(0 < x < math.inf for x in gib)):
        if per_rank:
            how = (f"one number or one per local rank "
                   f"(this is local rank {local_rank})")
        else:
            how = "one number: this node's host memory"
        die(f"{name}={text}: give GiB > 0, " + how)
    mine = gib[0]
    if len(gib) > 1:
        mine = gib[local_rank]
    absurd = (ABSURD_GIB * 2**30, 'any one host has')
    limit, what = min(most or (math.inf, ''), absurd)
    if mine * 2**30 > limit:
        whose = ''
        if len(gib) > 1:
            whose = f" for local rank {local_rank}"
        die(f"{name}={text} states {mine:g} GiB" + whose +
            f", more than {what} ({limit / 2**30:.1f} GiB): "
            f"state at most that")
    return int(mine * 2**30)


# HETGPT_HOST_MEM_GIB is for hosts whose /proc/meminfo reads below what
# they give (docs/gpu.md: the GPU host, a microVM that grows with use;
# bench/gpu_check.sh states 120 there), so it is not held to MemTotal: only
# an absurd figure is refused, above 64 TiB (the physical address space of
# CPUs with 46-bit physical addresses, above the largest single hosts
# sold: HPE Superdome Flex, 48 TiB).
ABSURD_GIB = 64 * 1024


def host_memory_total():
    """Bytes of RAM the OS sees (MemTotal): the most a CPU rank can
    have."""
    with open('/proc/meminfo') as f:
        return next(int(line.split()[1]) * 1024 for line in f
                    if line.startswith('MemTotal:'))


def return_freed_host_memory():
    """Makes the C library give each block of 64 KiB or more its own
    mmap, returned to the OS when freed (mallopt's M_MMAP_THRESHOLD).
    True if set; False where the C library has no mallopt (musl's does
    nothing; macOS, Windows).

    The planner predicts live bytes; the probe step and the metrics read
    the host's RSS. glibc keeps a freed block below its mmap threshold in
    the heap for reuse, and raises that threshold to each larger block
    freed (up to 32 MiB): a CPU step's freed tensors stay resident, and
    its peak RSS reaches up to 1.88× the live bytes (memory.GLIBC_SLACK).
    A fixed 64 KiB threshold (as the environment's
    MALLOC_MMAP_THRESHOLD_=65536) gives each larger block its own mmap,
    returned to the OS when freed. Its cost, measured
    (bench/host_allocator.py, 1 thread), CPU time per step: float32 eager
    1.46× at gpt_tiny's 4×128 (its loss's 13 MB chunk buffers are fresh
    pages each time) and 1.18× at 4×256, bfloat16 compiled 1.25× and
    1.10×: the kernel zeroing fresh pages. With 1 MiB the peak RSS was 5%
    over the planner's prediction at micro-batch 2 (tests/peak_step.py),
    with 16 MiB up to 33%. So it is set only where the RSS must follow the
    live bytes: before the probe step of a rank near its memory
    (planner.plan.Plan.frees_host_memory), whose steps then pay the fresh
    pages.
    """
    try:
        libc = ctypes.CDLL(None)
        return libc.mallopt(-3, 65536) == 1  # M_MMAP_THRESHOLD, bytes
    except (AttributeError, OSError, TypeError):
        return False


def stated_memory(local_rank, device_type=None):
    """HETGPT_MEM_GIB as bytes: the most memory a rank may take, its CUDA
    context included; None when unset.

    Stated in GiB (a GPU shared with another job; tests make CPU ranks
    differ with it): one number for every rank of this machine, or one
    per local rank ('20,80'). Unset: the whole device (a CPU rank: its
    share of the host's). A CPU rank may not state more than its host
    has: MemTotal, or the host memory stated where that is more (the
    microVM of ABSURD_GIB's comment). A CUDA rank's is held to its GPU's
    total memory by this_rank, which reads it. (device_type None: only
    the absurd is refused.)
    """
    most = None
    if device_type == 'cpu':
        total = host_memory_total()
        host = stated_host_memory() or 0
        if total >= host:
            most = (total, "this host's MemTotal")
        else:
            most = (host, "this host's memory as HETGPT_HOST_MEM_GIB "
                          "states it")
    return _stated_gib('HETGPT_MEM_GIB', local_rank, per_rank=True,
                       most=most)


def stated_host_memory():
    """HETGPT_HOST_MEM_GIB as bytes: this node's host memory, for the
    planner's host checks (offload, where weights are first made) instead
    of MemAvailable; None when unset.

    For a host whose MemAvailable reads far below what it can give (a
    microVM that grows with use), or a share of a host kept for others.
    """
    return _stated_gib('HETGPT_HOST_MEM_GIB', 0, per_rank=False)


def reset_peaks(device_type):
    """From here peak_memory reads the peaks since this call: the
    allocator's on CUDA (its cache emptied first, so that reserved bytes
    are this work's), and the host's RSS where Linux allows it. Returns
    whether the host's was reset (else it is the peak of the whole
    process)."""
    if device_type == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return reset_peak_rss()


def peak_memory(device_type, host_reset=True):
    """GiB at the peak since reset_peaks: (allocated, reserved) on the
    GPU, and the host's RSS (on a CPU, all 3); the host's is None on CUDA
    when it could not be reset (a peak of another time)."""
    host = peak_rss() / 2**30
    if device_type != 'cuda':
        return host, host, host
    if not host_reset:
        host = None
    return (torch.cuda.max_memory_allocated() / 2**30,
            torch.cuda.max_memory_reserved() / 2**30, host)


def outside_allocator():
    """Bytes in use on this GPU but not in PyTorch's allocator: the CUDA
    context, cuBLAS's workspaces and loaded kernels, NCCL's buffers (and
    any other process's)."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


# The default process group's backend, by the device type train.py runs
# on. Under CUDA one group has a backend per device type: NCCL serves only
# CUDA tensors, and train.py also reduces host tensors (flags, counts;
# gradients under CPU offload), which go through gloo.
BACKENDS = {'cuda': 'cpu:gloo,cuda:nccl', 'cpu': 'gloo'}


def this_rank(device_type, rank, local_world, stated=None, host_bw=None):
    """What this rank has, for make_plan: its device and memory (stated:
    no more than this), and its node's host memory.

    A GPU rank calls it after its first collective on the device: the
    memory in use then but not in PyTorch's allocator (CUDA context,
    NCCL's buffers, other processes) is its measured overhead; host_bw:
    its optimizer step's bytes/s on the host CPU, measured
    (run.probe.host_step_rate). (host_from: where the host figure came from,
    for the plan's table.)
    """
    host = stated_host_memory()
    if host:
        host_from = 'stated (HETGPT_HOST_MEM_GIB)'
    else:
        host = host_memory_available()
        host_from = 'available now (/proc/meminfo MemAvailable)'
    node = rank // local_world
    if device_type != 'cuda':
        # (its overhead: the process before the model, torch and the
        # group loaded, as it is now)
        # (its threads: torch's intra-op threads, its compute's rate)
        return dict(device='cpu', node=node, host_mem=host,
                    host_from=host_from, gpu=None,
                    mem=stated or host // local_world, overhead=rss(),
                    dtype=native_dtype('cpu'),
                    threads=torch.get_num_threads())
    total = torch.cuda.mem_get_info()[1]
    if stated and stated > total:
        die(f"HETGPT_MEM_GIB states {stated / 2**30:.1f} GiB for rank "
            f"{rank}, whose GPU has {total / 2**30:.1f} GiB: state at "
            f"most that")
    gpu = gpu_key(torch.cuda.get_device_name())
    # (Stated, the memory in use now may be the other job's: the planner's
    # estimate of this rank's own overhead then counts against what it may
    # use.)
    overhead = None
    if not stated:
        overhead = outside_allocator()
    return dict(device='cuda', node=node, host_mem=host,
                host_from=host_from, gpu=gpu, mem=stated or total,
                overhead=overhead, host_bw=host_bw,
                dtype=native_dtype('cuda'))


def native_dtype(device_type, gpu=None):
    """The fastest dtype a device computes in without emulation, for
    dtype=auto: bfloat16 where it has bf16 units, else float16 (with loss
    scaling) on a GPU with fp16 tensor cores, else float32.

    A running CUDA rank asks torch without emulation (a V100 emulates
    bfloat16 at its float32 rate, and torch counts that unless told not
    to); the dry run reads the GPU table (gpu: a GPUS key); a CPU has bf16
    units with AVX512-BF16 or AMX.
    """
    if device_type == 'cuda' and gpu is None:
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return 'bfloat16'
        if torch.cuda.get_device_capability() >= (7, 0):
            return 'float16'
        return 'float32'
    if device_type == 'cuda':
        g = GPUS.get(gpu, UNKNOWN_GPU)
        if g['bf16']:
            return 'bfloat16'
        if g['fp16']:
            return 'float16'
        return 'float32'
    units = ('_is_avx512_bf16_supported', '_is_amx_tile_supported')
    if any(getattr(torch.cpu, f, bool)() for f in units):
        return 'bfloat16'
    return 'float32'


def resolve(device, compile, local_rank):
    """(device, compile, how): train.py's device and compile knobs made
    concrete for this process, and a note of how. (The dtype is the
    plan's: each rank's native_dtype under DDP, one for all under FSDP.)"""
    if device == 'auto':
        device = 'cpu'
        if torch.cuda.is_available():
            device = 'cuda'
    if device.startswith('cuda'):
        if not torch.cuda.is_available():
            die(f"device={device} but this torch sees no CUDA device; "
                f"use --device=cpu")
        if device == 'cuda':
            device = f'cuda:{local_rank}'  # one GPU per local rank
        # before the process group: NCCL binds to the current device
        torch.cuda.set_device(device)
        # float32 matmuls on TF32 tensor cores (as peak_flops counts
        # float32)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    how = 'eager'
    if compile:
        how = 'compiled'
    if compile and device == 'cpu':
        # inductor writes C++ for the CPU: without a compiler, run eager
        # and say so
        if not (shutil.which('g++') or shutil.which('c++')):
            compile = False
            how = 'eager: no C++ compiler for torch.compile'
    return device, compile, how
