"""
The GPU table: each NVIDIA part's memory, dense TFLOPS by dtype, and
memory, host-link, GPU-link and network bandwidths, with their sources; the
name torch reports mapped to a row, and a part's peak FLOP/s in a dtype.
Data only (no torch): plan.py reads it before torch loads.
"""
from hetgpt.knobs import dtype_name


# GPUs. mem: total MiB as CUDA gives them (torch.cuda.mem_get_info's total,
# what a running rank plans with), seen in users' out-of-memory messages:
# H100-SXM 79.11 GiB where nvidia-smi shows 81,559 MiB (vllm#27508),
# A100-80GB 79.25 GiB (Vad-R1#11 on A100 80GB, OOTDiffusion#235). The
# others: nvidia-smi's MiB, some 0.5-0.8 GiB above what CUDA gives (the
# probe step measures it). TFLOPS are dense (datasheets print 2:4-sparsity
# figures: these are half of them).
# bf16/fp16: tensor cores, fp32 accumulate (GeForce cards run fp16 at twice
# that with fp16 accumulate, which training does not use). tf32:
# tensor-core TF32, what float32 matmuls reach with
# torch.backends.cuda.matmul.allow_tf32 (resolve, in hetgpt/hardware.py,
# sets it); fp32: CUDA cores. None: no such unit (Volta/Turing have no bf16
# or TF32 tensor cores; bf16 runs at about the fp32 rate).
# hbm: device memory GB/s (the optimizer step is bound by it). host: GB/s
# per direction to the host (PCIe Gen3 x16 15.75, Gen4 31.5, Gen5 63;
# GH200's NVLink-C2C 450). p2p: GPU<->GPU GB/s per direction inside a node
# (NVLink's quoted total / 2; PCIe where the parts have no NVLink switch).
# net: line rate GB/s per GPU between nodes in the part's reference
# system: DGX H100/H200 one 400 Gb/s NIC per GPU (50), DGX A100 one
# 200 Gb/s per GPU (25), DGX-1 V100 four 100 Gb/s for eight (6.25), GH200
# one 200 Gb/s NIC per superchip (CSCS Alps: 25); PCIe cards one 100 Gb/s
# NIC per node of eight (AWS g5.48xlarge: 100 Gb/s for 8 A10G: 1.5625).
# --inter_node_gbs overrides it.
def _gpu(mib, bf16, fp16, tf32, fp32, hbm, host, p2p, net=100 / 8 / 8):
    """A row of GPUS: the fields above, mem in bytes (mib: MiB)."""
    return dict(mem=mib * 2**20, bf16=bf16, fp16=fp16, tf32=tf32,
                fp32=fp32, hbm=hbm, host=host, p2p=p2p, net=net)


# Sources: NVIDIA datasheets (H200, H200 NVL, GH200, H100, A100, V100, A40,
# L40S, A10, L4, T4, RTX A6000) and the TU102/GA102/AD102 whitepapers (RTX
# 2080 Ti, 3090, 4090: the reference boards' clocks).
GPUS = {  # name: _gpu(MiB, bf16, fp16, tf32, fp32, hbm, host, p2p, net)
    # NVLink 900 GB/s
    'H200':           _gpu(143771, 989, 989, 494, 67, 4800, 63, 450, 50),
    'H200-NVL':       _gpu(143771, 835, 835, 417, 60, 4800, 63, 450),  # NVLink bridge
    # "GH200 480GB"
    'GH200':          _gpu(97871, 989, 989, 494, 67, 4000, 450, 450, 25),
    'GH200-144GB':    _gpu(146831, 989, 989, 494, 67, 4900, 450, 450, 25),  # HBM3e
    # NVLink 900 GB/s
    'H100-SXM':       _gpu(81009, 989, 989, 494, 67, 3350, 63, 450, 50),
    # NVLink bridges pairs only
    'H100-PCIe':      _gpu(81559, 756, 756, 378, 51, 2000, 63, 63),
    'A100-80GB':      _gpu(81152, 312, 312, 156, 19.5, 2039, 31.5, 300, 25),  # SXM4
    'A100-40GB':      _gpu(40960, 312, 312, 156, 19.5, 1555, 31.5, 300, 25),  # SXM4
    'A100-PCIe-80GB': _gpu(81920, 312, 312, 156, 19.5, 1935, 31.5, 31.5),
    'A100-PCIe-40GB': _gpu(40960, 312, 312, 156, 19.5, 1555, 31.5, 31.5),
    'V100-32GB':      _gpu(32768, None, 125, None, 15.7, 900, 15.75, 150, 6.25),  # SXM2
    'V100-16GB':      _gpu(16384, None, 125, None, 15.7, 900, 15.75, 150, 6.25),
    # Turing: fp16 only
    'RTX2080Ti':      _gpu(11264, None, 53.8, None, 13.4, 616, 15.75, 15.75),
    'RTX3090':        _gpu(24576, 71, 71, 35.6, 35.6, 936, 31.5, 31.5),
    # no P2P
    'RTX4090':        _gpu(24564, 165.2, 165.2, 82.6, 82.6, 1008, 31.5, 31.5),
    # RTX A6000
    'A6000':          _gpu(49140, 154.8, 154.8, 77.4, 38.7, 768, 31.5, 31.5),
    'A40':            _gpu(46068, 149.7, 149.7, 74.8, 37.4, 696, 31.5, 31.5),
    'L40S':           _gpu(46068, 362, 362, 183, 91.6, 864, 31.5, 31.5),
    # A10G (AWS g5): no NVIDIA datasheet; the A10's memory, about half its
    # tensor rate (uncertain)
    'A10G':           _gpu(23028, 70, 70, 35, 31.2, 600, 31.5, 31.5),
    'A10':            _gpu(23028, 125, 125, 62.5, 31.2, 600, 31.5, 31.5),
    'L4':             _gpu(23034, 121, 121, 60, 30.3, 300, 31.5, 31.5),
    'T4':             _gpu(15360, None, 65, None, 8.1, 320, 15.75, 15.75),
}

# Each row's GPU generation (its architecture), which picks the step
# efficiency (hetgpt/planner/efficiency.py): NVIDIA's architecture of each
# part (V100: Volta; T4, RTX 2080 Ti: Turing; A100, A10/A10G, A40, A6000,
# RTX 3090: Ampere; L4, L40S, RTX 4090: Ada Lovelace; H100, H200, GH200:
# Hopper).
GENERATION = {'Hopper': ('H200', 'H200-NVL', 'GH200', 'GH200-144GB',
                         'H100-SXM', 'H100-PCIe'),
              'Ampere': ('A100-80GB', 'A100-40GB', 'A100-PCIe-80GB',
                         'A100-PCIe-40GB', 'RTX3090', 'A6000', 'A40',
                         'A10G', 'A10'),
              'Ada': ('RTX4090', 'L40S', 'L4'),
              'Turing': ('RTX2080Ti', 'T4'),
              'Volta': ('V100-32GB', 'V100-16GB')}
for _gen, _names in GENERATION.items():
    for _name in _names:
        GPUS[_name]['generation'] = _gen

# not in the table (mem must be given)
UNKNOWN_GPU = dict(_gpu(0, 50, 50, 25, 12, 1000, 15.75, 15.75),
                   generation=None)

# The host CPUs of each part's reference system, for the dry run's offloaded
# optimizer step (a GPU rank measures its own at start-up): memory bandwidth
# per node, GB/s, from the CPUs' datasheets (channels × MT/s × 8 bytes ×
# sockets). DGX A100: 2 AMD EPYC 7742, 8 channels of DDR4-3200 each; DGX
# H100/H200: 2 Intel Xeon Platinum 8480C, 8 of DDR5-4800; DGX-1 V100: 2 Xeon
# E5-2698 v4, 4 of DDR4-2400; GH200: Grace's LPDDR5X, up to 512 GB/s (GH200
# datasheet).
HOST_BW = {'A100-80GB': 409.6, 'A100-40GB': 409.6,
           'H100-SXM': 614.4, 'H200': 614.4,
           'V100-32GB': 153.6, 'V100-16GB': 153.6,
           'GH200': 512, 'GH200-144GB': 512}
# One thread's fused AdamW step (what each rank has under torchrun,
# OMP_NUM_THREADS=1), as probe.host_step_rate counts it: 25.1-38.9 GB/s in
# six runs on this project's CPU machine (an AMD EPYC, torch 2.13;
# bench/RESULTS.md); the least. A node's step: the lesser of its ranks'
# threads and its memory.
HOST_THREAD_BW = 25

def gpu_key(name):
    """A GPUS key for torch.cuda.get_device_name()'s name, or None. Also
    accepts a key in any case."""
    if name is None:
        return None
    for key in GPUS:
        if name.lower() == key.lower():
            return key
    t = name.upper().replace('-', ' ').split()
    pcie = 'PCIE' in t
    if 'GH200' in t:
        if any(x.startswith('144G') for x in t):
            return 'GH200-144GB'
        return 'GH200'
    if 'H200' in t:
        if 'NVL' in t:
            return 'H200-NVL'
        return 'H200'
    if 'H100' in t:
        if pcie:
            return 'H100-PCIe'
        return 'H100-SXM'
    if 'A100' in t:
        size = '40GB'
        if '80GB' in t:
            size = '80GB'
        if pcie:
            return 'A100-PCIe-' + size
        return 'A100-' + size
    if 'V100' in t:
        if '32GB' in t:
            return 'V100-32GB'
        return 'V100-16GB'
    if '2080' in t and 'TI' in t:
        return 'RTX2080Ti'
    if '3090' in t:
        return 'RTX3090'
    if '4090' in t:
        return 'RTX4090'
    for key in ('A6000', 'A40', 'L40S', 'A10G', 'A10', 'L4', 'T4'):
        if key in t:
            return key
    return None


def peak_flops(device, dtype='bfloat16', tf32=True):
    """Dense peak FLOP/s of a GPU (a torch device name or a GPUS key) in a
    compute dtype; None for a CPU or an unknown GPU.

    float32 counts TF32 tensor cores when tf32 (as train.py runs CUDA); a
    dtype without tensor cores on that part falls back to the fp32
    CUDA-core rate.
    """
    key = gpu_key(device)
    if key is None:
        return None
    g, dtype = GPUS[key], dtype_name(dtype)
    float32 = 'fp32'
    if tf32:
        float32 = 'tf32'
    col = {'bfloat16': 'bf16', 'bf16': 'bf16', 'float16': 'fp16',
           'fp16': 'fp16', 'tf32': 'tf32', 'float32': float32,
           'fp32': 'fp32'}[dtype]
    return (g[col] or g['fp32']) * 1e12
