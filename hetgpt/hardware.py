"""
What the devices are. A table of NVIDIA GPUs (memory, dense TFLOPS by dtype, memory
and link bandwidths), the name torch reports mapped to it, and what a running rank has.
"""
import ctypes
import math
import os
import re
import resource
import shutil

import torch

from hetgpt.errors import die


# GPUs. mem: total MiB as CUDA gives them (torch.cuda.mem_get_info's total, what a running rank
# plans with), seen in users' out-of-memory messages: H100-SXM 79.11 GiB where nvidia-smi shows
# 81,559 MiB (vllm#27508), A100-80GB 79.25 GiB (Vad-R1#11 on A100 80GB, OOTDiffusion#235). The
# others: nvidia-smi's MiB, some 0.5-0.8 GiB above what CUDA gives (the probe step measures it). TFLOPS are dense (datasheets print 2:4-sparsity figures: these are half of them).
# bf16/fp16: tensor cores, fp32 accumulate (GeForce cards run fp16 at twice that with fp16
# accumulate, which training does not use). tf32: tensor-core TF32, what float32 matmuls reach
# with torch.backends.cuda.matmul.allow_tf32 (resolve, below, sets it); fp32: CUDA cores.
# None: no such unit (Volta/Turing have no bf16 or TF32 tensor cores; bf16 runs at about the
# fp32 rate). hbm: device memory GB/s (the optimizer step is bound by it). host: GB/s per direction
# to the host (PCIe Gen3 x16 15.75, Gen4 31.5, Gen5 63; GH200's NVLink-C2C 450). p2p: GPU<->GPU
# GB/s per direction inside a node (NVLink's quoted total / 2; PCIe where the parts have no NVLink
# switch).
# net: line rate GB/s per GPU between nodes in the part's reference system: DGX H100/H200 one
# 400 Gb/s NIC per GPU (50), DGX A100 one 200 Gb/s per GPU (25), DGX-1 V100 four 100 Gb/s for eight
# (6.25), GH200 one 200 Gb/s NIC per superchip (CSCS Alps: 25); PCIe cards one 100 Gb/s NIC per node
# of eight (AWS g5.48xlarge: 100 Gb/s for 8 A10G: 1.5625). --inter_node_gbs overrides it.
def _gpu(mib, bf16, fp16, tf32, fp32, hbm, host, p2p, net=100 / 8 / 8):
    return dict(mem=mib * 2**20, bf16=bf16, fp16=fp16, tf32=tf32, fp32=fp32, hbm=hbm, host=host,
                p2p=p2p, net=net)


# Sources: NVIDIA datasheets (H200, H200 NVL, GH200, H100, A100, V100, A40, L40S, A10, L4, T4,
# RTX A6000) and the TU102/GA102/AD102 whitepapers (RTX 2080 Ti, 3090, 4090: the reference
# boards' clocks).
GPUS = {  # name: _gpu(MiB, bf16, fp16, tf32, fp32, hbm, host, p2p, net)
    'H200':           _gpu(143771, 989, 989, 494, 67, 4800, 63, 450, 50),   # NVLink 900 GB/s
    'H200-NVL':       _gpu(143771, 835, 835, 417, 60, 4800, 63, 450),       # NVLink bridge
    'GH200':          _gpu(97871, 989, 989, 494, 67, 4000, 450, 450, 25),   # "GH200 480GB"
    'GH200-144GB':    _gpu(146831, 989, 989, 494, 67, 4900, 450, 450, 25),  # HBM3e
    'H100-SXM':       _gpu(81009, 989, 989, 494, 67, 3350, 63, 450, 50),    # NVLink 900 GB/s
    'H100-PCIe':      _gpu(81559, 756, 756, 378, 51, 2000, 63, 63),         # bridges pairs only
    'A100-80GB':      _gpu(81152, 312, 312, 156, 19.5, 2039, 31.5, 300, 25),  # SXM4
    'A100-40GB':      _gpu(40960, 312, 312, 156, 19.5, 1555, 31.5, 300, 25),  # SXM4
    'A100-PCIe-80GB': _gpu(81920, 312, 312, 156, 19.5, 1935, 31.5, 31.5),
    'A100-PCIe-40GB': _gpu(40960, 312, 312, 156, 19.5, 1555, 31.5, 31.5),
    'V100-32GB':      _gpu(32768, None, 125, None, 15.7, 900, 15.75, 150, 6.25),  # SXM2
    'V100-16GB':      _gpu(16384, None, 125, None, 15.7, 900, 15.75, 150, 6.25),
    'RTX2080Ti':      _gpu(11264, None, 53.8, None, 13.4, 616, 15.75, 15.75),  # Turing: fp16 only
    'RTX3090':        _gpu(24576, 71, 71, 35.6, 35.6, 936, 31.5, 31.5),
    'RTX4090':        _gpu(24564, 165.2, 165.2, 82.6, 82.6, 1008, 31.5, 31.5),  # no P2P
    'A6000':          _gpu(49140, 154.8, 154.8, 77.4, 38.7, 768, 31.5, 31.5),   # RTX A6000
    'A40':            _gpu(46068, 149.7, 149.7, 74.8, 37.4, 696, 31.5, 31.5),
    'L40S':           _gpu(46068, 362, 362, 183, 91.6, 864, 31.5, 31.5),
    # A10G (AWS g5): no NVIDIA datasheet; the A10's memory, about half its tensor rate (uncertain)
    'A10G':           _gpu(23028, 70, 70, 35, 31.2, 600, 31.5, 31.5),
    'A10':            _gpu(23028, 125, 125, 62.5, 31.2, 600, 31.5, 31.5),
    'L4':             _gpu(23034, 121, 121, 60, 30.3, 300, 31.5, 31.5),
    'T4':             _gpu(15360, None, 65, None, 8.1, 320, 15.75, 15.75),
}

UNKNOWN_GPU = _gpu(0, 50, 50, 25, 12, 1000, 15.75, 15.75)  # not in the table (mem must be given)

# The host CPUs of each part's reference system, for the dry run's offloaded optimizer step (a
# GPU rank measures its own at start-up): memory bandwidth per node, GB/s, from the CPUs'
# datasheets (channels × MT/s × 8 bytes × sockets). DGX A100: 2 AMD EPYC 7742, 8 channels of
# DDR4-3200 each; DGX H100/H200: 2 Intel Xeon Platinum 8480C, 8 of DDR5-4800; DGX-1 V100: 2 Xeon
# E5-2698 v4, 4 of DDR4-2400; GH200: Grace's LPDDR5X, up to 512 GB/s (GH200 datasheet).
HOST_BW = {'A100-80GB': 409.6, 'A100-40GB': 409.6, 'H100-SXM': 614.4, 'H200': 614.4,
           'V100-32GB': 153.6, 'V100-16GB': 153.6, 'GH200': 512, 'GH200-144GB': 512}
# One thread's fused AdamW step (what each rank has under torchrun, OMP_NUM_THREADS=1), as
# costs.host_step_rate counts it: 25.1-38.9 GB/s in six runs on this project's CPU machine (an AMD
# EPYC, torch 2.13; bench/RESULTS.md); the least. A node's step: the lesser of its ranks' threads
# and its memory.
HOST_THREAD_BW = 25


def gpu_key(name):
    # torch.cuda.get_device_name() -> a GPUS key, or None. Also accepts a key in any case.
    if name is None:
        return None
    for key in GPUS:
        if name.lower() == key.lower():
            return key
    t = name.upper().replace('-', ' ').split()
    pcie = 'PCIE' in t
    if 'GH200' in t: return 'GH200-144GB' if any(x.startswith('144G') for x in t) else 'GH200'
    if 'H200' in t: return 'H200-NVL' if 'NVL' in t else 'H200'
    if 'H100' in t: return 'H100-PCIe' if pcie else 'H100-SXM'
    if 'A100' in t: return ('A100-PCIe-' if pcie else 'A100-') + ('80GB' if '80GB' in t else '40GB')
    if 'V100' in t: return 'V100-32GB' if '32GB' in t else 'V100-16GB'
    if '2080' in t and 'TI' in t: return 'RTX2080Ti'
    if '3090' in t: return 'RTX3090'
    if '4090' in t: return 'RTX4090'
    for key in ('A6000', 'A40', 'L40S', 'A10G', 'A10', 'L4', 'T4'):
        if key in t:
            return key
    return None


def peak_flops(device, dtype='bfloat16', tf32=True):
    # Dense peak FLOP/s of a GPU (a torch device name or a GPUS key) in a compute dtype; None for a
    # CPU or an unknown GPU. float32 counts TF32 tensor cores when tf32 (as train.py runs CUDA);
    # a dtype without tensor cores on that part falls back to the fp32 CUDA-core rate.
    key = gpu_key(device)
    if key is None:
        return None
    g, dtype = GPUS[key], str(dtype).replace('torch.', '')
    col = {'bfloat16': 'bf16', 'bf16': 'bf16', 'float16': 'fp16', 'fp16': 'fp16', 'tf32': 'tf32',
           'float32': 'tf32' if tf32 else 'fp32', 'fp32': 'fp32'}[dtype]
    return (g[col] or g['fp32']) * 1e12


def host_memory_available():
    # Bytes the OS could give now (MemAvailable), for train.py's ranks.
    with open('/proc/meminfo') as f:
        info = {line.split(':')[0]: int(line.split()[1]) * 1024 for line in f}
    return info.get('MemAvailable', info['MemTotal'])


def peak_rss():
    # The host's peak RSS of this process: since reset_peak_rss where Linux allows it, else ever.
    try:
        with open('/proc/self/status') as f:
            return int(re.search(r'VmHWM:\s+(\d+) kB', f.read()).group(1)) * 1024
    except (OSError, AttributeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def rss():
    # This process's resident bytes now; None where /proc cannot tell
    try:
        with open('/proc/self/status') as f:
            return int(re.search(r'VmRSS:\s+(\d+) kB', f.read()).group(1)) * 1024
    except (OSError, AttributeError):
        return None


def reset_peak_rss():
    # Linux (since 4.0) resets a process's peak RSS to its current RSS; True if it did
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def _stated_gib(name, local_rank, per_rank, most=None):
    # The one reader of the HETGPT_*_GIB variables: GiB > 0 and finite (nan and inf fail), as
    # bytes; None when unset. per_rank: one number for every local rank or one per local rank.
    # most: (bytes, what they are) this rank's number may not exceed; never above ABSURD_GIB.
    text = os.environ.get(name, '')
    if not text:
        return None
    try:
        gib = [float(x) for x in text.split(',')]
        assert all(0 < x < math.inf for x in gib)
        assert len(gib) == 1 or (per_rank and len(gib) > local_rank)
    except (ValueError, AssertionError):
        die(f"{name}={text}: give GiB > 0, " + (
            f"one number or one per local rank (this is local rank {local_rank})" if per_rank
            else "one number: this node's host memory"))
    mine = gib[local_rank if len(gib) > 1 else 0]
    limit, what = min(most or (math.inf, ''), (ABSURD_GIB * 2**30, 'any one host has'))
    if mine * 2**30 > limit:
        die(f"{name}={text} states {mine:g} GiB" + (
            f" for local rank {local_rank}" if len(gib) > 1 else '') +
            f", more than {what} ({limit / 2**30:.1f} GiB): state at most that")
    return int(mine * 2**30)


# HETGPT_HOST_MEM_GIB is for hosts whose /proc/meminfo reads below what they give (docs/gpu.md: the GPU
# host, a microVM that grows with use; bench/gpu_check.sh states 120 there), so it is not held to
# MemTotal: only an absurd figure is refused, above 64 TiB (the physical address space of CPUs with
# 46-bit physical addresses, above the largest single hosts sold: HPE Superdome Flex, 48 TiB).
ABSURD_GIB = 64 * 1024


def host_memory_total():
    # Bytes of RAM the OS sees (MemTotal): the most a CPU rank can have.
    with open('/proc/meminfo') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemTotal:'))


def return_freed_host_memory():
    # The planner predicts live bytes; the probe step and the metrics read the host's RSS. glibc
    # keeps a freed block below its mmap threshold in the heap for reuse, and raises that threshold
    # to each larger block freed (up to 32 MiB): a CPU step's freed tensors stay resident, and its
    # peak RSS reaches up to 1.8× the live bytes. A fixed 64 KiB threshold (as the environment's
    # MALLOC_MMAP_THRESHOLD_=65536) gives each larger block its own mmap, returned to the OS when
    # freed. Its cost, measured (bench/host_allocator.py, 1 thread), CPU time per step: float32
    # eager 1.46× at gpt_tiny's 4×128 (its loss's 13 MB chunk buffers are fresh pages each time)
    # and 1.18× at 4×256, bfloat16 compiled 1.25× and 1.10×: the kernel zeroing fresh pages.
    # With 1 MiB the peak RSS was 5% over the planner's prediction at micro-batch 2
    # (tests/peak_step.py), with 16 MiB up to 33%. Call it before the big allocations. True if
    # set; False where the C library has no mallopt (musl's does nothing; macOS, Windows).
    try:
        return ctypes.CDLL(None).mallopt(-3, 65536) == 1  # M_MMAP_THRESHOLD, bytes
    except (AttributeError, OSError, TypeError):
        return False


def stated_memory(local_rank, device_type=None):
    # HETGPT_MEM_GIB: the most memory a rank may take, in GiB, its CUDA context included (a GPU
    # shared with another job; tests make CPU ranks differ with it): one number for every rank of
    # this machine, or one per local rank ('20,80'). Unset: the whole device (a CPU rank: its share
    # of the host's). A CPU rank may not state more than its host has: MemTotal, or the host memory
    # stated where that is more (the microVM above). A CUDA rank's is held to its GPU's total
    # memory by this_rank, which reads it. (device_type None: only the absurd is refused.)
    most = None
    if device_type == 'cpu':
        total, host = host_memory_total(), stated_host_memory() or 0
        most = (total, "this host's MemTotal") if total >= host else \
            (host, "this host's memory as HETGPT_HOST_MEM_GIB states it")
    return _stated_gib('HETGPT_MEM_GIB', local_rank, per_rank=True, most=most)


def stated_host_memory():
    # HETGPT_HOST_MEM_GIB: this node's host memory in GiB, for the planner's host checks (offload,
    # where weights are first made) instead of MemAvailable: a host whose MemAvailable reads far
    # below what it can give (a microVM that grows with use), or a share of a host kept for others.
    return _stated_gib('HETGPT_HOST_MEM_GIB', 0, per_rank=False)


def reset_peaks(device_type):
    # From here peak_memory reads the peaks since this call: the allocator's on CUDA (its cache
    # emptied first, so that reserved bytes are this work's), and the host's RSS where Linux
    # allows it. Returns whether the host's was reset (else it is the peak of the whole process).
    if device_type == 'cuda':
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return reset_peak_rss()


def peak_memory(device_type, host_reset=True):
    # GiB at the peak since reset_peaks: (allocated, reserved) on the GPU, and the host's RSS (on a
    # CPU, all 3); the host's is None on CUDA when it could not be reset (a peak of another time)
    host = peak_rss() / 2**30
    if device_type != 'cuda':
        return host, host, host
    return (torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30,
            host if host_reset else None)


def outside_allocator():
    # Bytes in use on this GPU but not in PyTorch's allocator: the CUDA context, cuBLAS's
    # workspaces and loaded kernels, NCCL's buffers (and any other process's)
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


# The default process group's backend, by the device type train.py runs on. Under CUDA one group has
# a backend per device type: NCCL serves only CUDA tensors, and train.py also reduces host tensors
# (flags, counts; gradients under CPU offload), which go through gloo.
BACKENDS = {'cuda': 'cpu:gloo,cuda:nccl', 'cpu': 'gloo'}


def this_rank(device_type, rank, local_world, stated=None, host_bw=None):
    # What this rank has, for make_plan: its device and memory (stated: no more than this), and its
    # node's host memory. A GPU rank calls it after its first collective on the device: the memory
    # in use then but not in PyTorch's allocator (CUDA context, NCCL's buffers, other processes) is
    # its measured overhead; host_bw: its optimizer step's bytes/s on the host CPU, measured
    # (costs.host_step_rate).
    # (host_from: where the host figure came from, for the plan's table)
    host = stated_host_memory()
    host, host_from = (host, 'stated (HETGPT_HOST_MEM_GIB)') if host else (
        host_memory_available(), 'available now (/proc/meminfo MemAvailable)')
    if device_type != 'cuda':
        # (its overhead: the process before the model, torch and the group loaded, as it is now)
        return dict(device='cpu', node=rank // local_world, host_mem=host, host_from=host_from,
                    gpu=None, mem=stated or host // local_world, overhead=rss(),
                    dtype=native_dtype('cpu'))
    total = torch.cuda.mem_get_info()[1]
    if stated and stated > total:
        die(f"HETGPT_MEM_GIB states {stated / 2**30:.1f} GiB for rank {rank}, whose GPU has "
            f"{total / 2**30:.1f} GiB: state at most that")
    # (Stated, the memory in use now may be the other job's: the planner's estimate of this
    # rank's own overhead then counts against what it may use.)
    return dict(device='cuda', node=rank // local_world, host_mem=host, host_from=host_from,
                gpu=gpu_key(torch.cuda.get_device_name()), mem=stated or total,
                overhead=None if stated else outside_allocator(), host_bw=host_bw,
                dtype=native_dtype('cuda'))


def native_dtype(device_type, gpu=None):
    # The fastest dtype a device computes in without emulation, for dtype=auto: bfloat16 where it
    # has bf16 units, else float16 (with loss scaling) on a GPU with fp16 tensor cores, else
    # float32. A running CUDA rank asks torch without emulation (a V100 emulates bfloat16 at its
    # float32 rate, and torch counts that unless told not to); the dry run reads the GPU table
    # (gpu: a GPUS key); a CPU has bf16 units with AVX512-BF16 or AMX.
    if device_type == 'cuda' and gpu is None:
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return 'bfloat16'
        return 'float16' if torch.cuda.get_device_capability() >= (7, 0) else 'float32'
    if device_type == 'cuda':
        g = GPUS.get(gpu, UNKNOWN_GPU)
        return 'bfloat16' if g['bf16'] else 'float16' if g['fp16'] else 'float32'
    return 'bfloat16' if any(getattr(torch.cpu, f, bool)() for f in (
        '_is_avx512_bf16_supported', '_is_amx_tile_supported')) else 'float32'


def resolve(device, compile, local_rank):
    # train.py's device and compile knobs made concrete for this process, and a note of how. (The
    # dtype is the plan's: each rank's native_dtype under DDP, one for all under FSDP.)
    if device == 'auto':
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device.startswith('cuda'):
        if not torch.cuda.is_available():
            die(f"device={device} but this torch sees no CUDA device; use --device=cpu")
        device = f'cuda:{local_rank}' if device == 'cuda' else device  # one GPU per local rank
        torch.cuda.set_device(device)  # before the process group: NCCL binds to the current device
        # float32 matmuls on TF32 tensor cores (as peak_flops counts float32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    how = 'compiled' if compile else 'eager'
    if compile and device == 'cpu' and not (shutil.which('g++') or shutil.which('c++')):
        # inductor writes C++ for the CPU: without a compiler, run eager and say so
        compile, how = False, 'eager: no C++ compiler for torch.compile'
    return device, compile, how
