"""
plan.py's decisions on the meta device. Each expected verdict is derived here from the formulas
(16 bytes per parameter for AdamW with fp32 master weights, ~34·s·h bytes per layer per sequence
of activations, the logits), not copied from the planner's output.
"""
import math
import re
import subprocess
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from hetgpt import gpus, hardware, knobs
from hetgpt.planner import costs, memory, search, timing
from hetgpt.planner.cluster import expand
import plan
from hetgpt.knobs import configure
from model import GPT, GPTConfig, config_from
from trainer import one_error_line

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


def load(name):
    defaults = {f.name: f.default for f in fields(GPTConfig)} | dict(batch_size=1)
    c = configure(defaults, [str(ROOT / 'configs' / f'{name}.py')], strict_files=False)
    return config_from(c), c['batch_size']


def cluster(gpu, count, host_gib=None, per_node=8):
    return [dict(device='cuda', gpu=gpu, node=i // per_node, host_mem=host_gib * GiB if host_gib else None)
            for i in range(count)]


def exact_params(cfg):
    with torch.device('meta'):
        return sum(p.numel() for p in GPT(cfg).parameters())


def budget(gpu):
    # a GPU's whole memory (memory_fraction 1.0): its context and the allocator's pages are in
    # the plan's estimate
    return gpus.GPUS[gpu]['mem']


def per_sequence(cfg):
    # activation bytes of one sequence, 16-bit weights, no checkpointing: what autograd saves in a
    # real block, measured on the CPU at a small shape (test_plan_measured) and scaled by s·h (each
    # tensor a GPT-2 block saves is a multiple of s·h: SDPA keeps no s×s matrix), × layers
    from test_plan_measured import CFG, measured_block_bytes
    per_sh = measured_block_bytes(torch.bfloat16, None) / (CFG.block_size * CFG.n_embd)
    return per_sh * cfg.block_size * cfg.n_embd * cfg.n_layer


@pytest.mark.parametrize('name', ['gpt_tiny', 'gpt_111m', 'gpt_13b'])
def test_parameter_count_is_exact(name):
    cfg, _ = load(name)
    P = exact_params(cfg)
    assert costs.counts(cfg)['total'] == P
    e = memory.estimate(cfg, 'ddp', 1, 1)
    assert e['params'] == 4 * P and e['params'] + e['grads'] + e['optim'] == 16 * P  # ZeRO's 16Ψ


def test_111m_on_one_h200_needs_no_checkpointing_nor_offload():
    cfg, batch = load('gpt_111m')
    P = exact_params(cfg)
    room = budget('H200') - 16 * P - GiB            # states and the CUDA context
    assert room > per_sequence(cfg)                # plain DDP holds at least one sequence
    auto = search.make_plan(cfg, batch, cluster('H200', 1))
    assert auto.fits and not any(auto.ac) and not auto.offload
    p = search.make_plan(cfg, batch, cluster('H200', 1), plan='ddp')
    assert p.fits and p.strategy == 'ddp' and not any(p.ac) and not p.shard
    # the micro-batch is what the formula allows, less autocast's weight copies, fp32 residual and slack
    assert min(batch, 0.6 * room / per_sequence(cfg)) <= p.caps[0] <= room / per_sequence(cfg)
    assert sum(p.share) == batch and p.accum[0] == math.ceil(batch / p.caps[0])


def test_13b_on_one_h200_with_128gb_host_does_not_fit_and_says_how_much_host():
    cfg, batch = load('gpt_13b')
    P = exact_params(cfg)
    assert 16 * P > budget('H200')                 # no GPU-only rung: the states alone overflow
    assert 16 * P > 0.9 * 128 * GiB                # offload: the host cannot hold them either
    p = search.make_plan(cfg, batch, cluster('H200', 1, host_gib=128))
    assert not p.fits
    host = float(re.search(r"host memory >= ([\d,]+) GiB per node", p.advice).group(1).replace(',', '')) * GiB
    assert 16 * P / 0.9 <= host <= 2 * 16 * P / 0.9  # 16Ψ, plus pinned-memory rounding and the process
    assert abs(p.needs['host_mem_per_node'] - host) < GiB
    assert '2×H200' in p.advice                     # 8Ψ each on two H200s leaves room for activations
    assert 8 * P + per_sequence(cfg) / 10 < budget('H200')


def test_dry_run_that_does_not_fit_exits_nonzero_with_advice():
    out = subprocess.run([sys.executable, 'plan.py', 'configs/gpt_13b.py', '--gpus', '1xH200', '--host_mem', '128'],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and 'advice:' in out.stdout and 'host memory >=' in out.stdout


def test_13b_on_8_a100_is_sharded():
    cfg, batch = load('gpt_13b')
    P = exact_params(cfg)
    assert 16 * P > budget('A100-80GB') and 16 * P / 8 + 2 * per_sequence(cfg) / 10 < budget('A100-80GB')
    p = search.make_plan(cfg, batch, cluster('A100-80GB', 8, host_gib=1024))
    assert p.fits and p.shard and not p.offload
    assert len(set(p.accum)) == 1 and sum(p.share) == batch  # FSDP: the same number of micro-batches


def test_70b_on_16_a100_two_nodes_1tb_host_fits():
    cfg, batch = load('gpt_70b')
    P = exact_params(cfg)
    assert 16 * P / 16 * 8 < 0.9 * 1024 * GiB       # offloaded shards of 8 ranks fit a node's host
    p = search.make_plan(cfg, batch, cluster('A100-80GB', 16, host_gib=1024))
    assert p.fits and p.shard and sum(p.share) == batch
    assert {r['node'] for r in p.ranks} == {0, 1}
    if p.offload:
        assert 8 * 16 * P / 16 <= p.predicted[0]['host'] <= 0.9 * 1024 * GiB


def test_forced_ddp_for_13b_on_one_gpu_does_not_fit():
    cfg, batch = load('gpt_13b')
    assert 16 * exact_params(cfg) > budget('H200')
    p = search.make_plan(cfg, batch, cluster('H200', 1, host_gib=1024), plan='ddp')
    assert not p.fits and p.strategy == 'ddp' and 'ddp needs' in p.advice and 'plan=auto fits' in p.advice


def test_model_states_shrink_along_the_ladder():
    cfg, _ = load('gpt_13b')
    states = [sum(memory.estimate(cfg, s, 1, 8)[k] for k in ('params', 'grads', 'optim')) for s in knobs.STRATEGIES]
    assert all(a >= b for a, b in zip(states, states[1:])) and states[0] > states[-1] == 0
    P = exact_params(cfg)
    assert states[3] == pytest.approx(16 * P / 8, rel=1e-3)  # FSDP: 16Ψ/N, up to dim-0 padding
    act = [memory.estimate(cfg, s, 4, 8)['activations'] for s in ('fsdp', 'fsdp+ac')]
    assert act[1] < act[0] / 3                      # checkpointing keeps block inputs only


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp', 'fsdp+ac'])
def test_micro_batch_cap_grows_with_memory(strategy):
    cfg, _ = load('gpt_1p3b')
    caps = [search.make_plan(cfg, 4096, [dict(device='cuda', gpu='A100-80GB', mem=g * GiB)], plan=strategy).caps[0]
            for g in (24, 40, 80, 141)]
    assert all(a <= b for a, b in zip(caps, caps[1:])) and caps[-1] > caps[0]


@pytest.mark.parametrize('name,ranks', [
    ('gpt_1p3b', cluster('A100-80GB', 8)),
    ('gpt_111m', cluster('H200', 1)),
    ('gpt_13b', cluster('A100-80GB', 4, 1024) + cluster('V100-32GB', 4, 1024)),
])
def test_auto_picks_the_fastest_that_fits(name, ranks):
    cfg, batch = load(name)
    auto = search.make_plan(cfg, batch, ranks)
    forced = [search.make_plan(cfg, batch, ranks, plan=s) for s in knobs.STRATEGIES]
    assert auto.fits and all(auto.step_time <= p.step_time for p in forced if p.fits)
    assert auto.step_time == min(p.step_time for p in forced if p.fits)


def test_mixed_cluster_gives_faster_gpus_more():
    cfg, batch = load('gpt_13b')
    p = search.make_plan(cfg, batch, cluster('A100-80GB', 4, 1024) + cluster('V100-32GB', 4, 1024))
    assert p.fits and sum(p.share) == batch and min(p.share[:4]) > max(p.share[4:])
    assert all(max(m) <= c for m, c in zip(p.sizes, p.caps))


def test_forced_micro_batch_size():
    cfg, batch = load('gpt_111m')
    p = search.make_plan(cfg, batch, cluster('H200', 1), micro_batch_size=8)
    assert p.fits and p.caps == [8] and p.accum == [15]
    p = search.make_plan(cfg, 480, cluster('H200', 1), plan='ddp', micro_batch_size=480)
    assert not p.fits
    # its advice: the longest power-of-two block_size at which that micro-batch fits (not the one
    # at which a single sequence would: 2047, when it was searched at micro-batch 1)
    t = p.needs['block_size']
    assert t & (t - 1) == 0 and f'block_size <= {t} (ddp)' in p.advice, p.advice
    at = lambda size: search.make_plan(replace(cfg, block_size=size), 480, cluster('H200', 1),
                                        plan='ddp', micro_batch_size=480).fits
    assert at(t) and (2 * t == cfg.block_size or not at(2 * t))


def test_gpu_names_and_peaks():
    names = {'NVIDIA H200': 'H200', 'NVIDIA H100 80GB HBM3': 'H100-SXM', 'NVIDIA H100 PCIe': 'H100-PCIe',
             'NVIDIA A100-SXM4-80GB': 'A100-80GB', 'NVIDIA A100-SXM4-40GB': 'A100-40GB',
             'NVIDIA A100-PCIE-40GB': 'A100-PCIe-40GB', 'NVIDIA A100 80GB PCIe': 'A100-PCIe-80GB',
             'Tesla V100-SXM2-32GB': 'V100-32GB', 'Tesla V100-PCIE-16GB': 'V100-16GB',
             'NVIDIA GeForce RTX 3090': 'RTX3090', 'NVIDIA GeForce RTX 4090': 'RTX4090', 'NVIDIA RTX A6000': 'A6000',
             'NVIDIA L40S': 'L40S', 'NVIDIA A10': 'A10', 'NVIDIA L4': 'L4', 'Tesla T4': 'T4', 'NVIDIA A40': 'A40',
             'NVIDIA H200 NVL': 'H200-NVL', 'NVIDIA GH200 480GB': 'GH200', 'NVIDIA GH200 144G HBM3e': 'GH200-144GB',
             'NVIDIA A10G': 'A10G', 'a100-80gb': 'A100-80GB', 'Some Future GPU': None}
    for name, key in names.items():
        assert gpus.gpu_key(name) == key, name
    assert gpus.peak_flops('NVIDIA A100-SXM4-80GB', 'bfloat16') == 312e12
    assert gpus.peak_flops('H100-SXM', torch.bfloat16) == 989e12
    assert gpus.peak_flops('V100-32GB', 'float16') == 125e12
    assert gpus.peak_flops('V100-32GB', 'bfloat16') == 15.7e12  # no bf16 tensor cores
    assert gpus.peak_flops('A100-80GB', 'float32') == 156e12 and gpus.peak_flops('A100-80GB', 'float32', tf32=False) == 19.5e12
    assert gpus.peak_flops('cpu') is None and gpus.peak_flops(None) is None
    # datasheets print 2:4-sparse figures: H200 NVL 1,671 bf16 → 835 dense; GH200 1,979 → 989
    assert gpus.peak_flops('NVIDIA H200 NVL') == 835e12 and gpus.peak_flops('NVIDIA GH200 480GB') == 989e12
    assert gpus.GPUS['GH200']['host'] == 450  # NVLink-C2C: 900 GB/s both ways


def test_table_shows_predicted_and_measured():
    cfg, batch = load('gpt_111m')
    p = search.make_plan(cfg, batch, cluster('A100-80GB', 2))
    text = p.table(measured=[dict(total=30 * GiB, activations=20 * GiB), None])
    assert 'pred' in text and 'meas' in text and p.strategy in text and 'tokens/s' in text


def test_dry_run_175b_fits_64_a100s():
    # (its time, 5-6 CPU seconds, is measured in bench/RESULTS.md: a timed test fails under load)
    out = subprocess.run([sys.executable, 'plan.py', 'configs/gpt_175b.py', '--gpus', '64xA100-80GB',
                          '--host_mem', '1024'], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'fsdp' in out.stdout and 'tokens/s' in out.stdout


def test_fsdp_accumulation_without_sync_costs_unsharded_fp32_grads():
    # FSDP2 under set_requires_gradient_sync(False) keeps every gradient unsharded in fp32
    cfg, batch = load('gpt_1p3b')
    P = exact_params(cfg)
    a, b = (memory.estimate(cfg, 'fsdp', 2, 8, accumulate=acc)['grads'] for acc in (False, True))
    assert b - a == 4 * P
    p = search.make_plan(cfg, batch, cluster('A100-80GB', 8))
    if p.shard and not p.reduce_every_micro_batch:
        assert p.predicted[0]['grads'] >= 4 * P


# -----------------------------------------------------------------------------
# The GPU speed model (issue 10): each expectation derived here from the formula it states.
# AdamW's step per parameter: reads p, g, exp_avg, exp_avg_sq (16 B), writes p and both moments
# (12), and clipping reads g once more (4)
ADAMW_STEP_BYTES = 32


def flops_per_token(cfg):
    # PaLM's 6N (weights that do matmuls: not wpe) + 12·L·h·s for attention
    return 6 * (exact_params(cfg) - cfg.block_size * cfg.n_embd) + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


# The host CPU of a DGX H200 with one rank: one thread's step, below its memory's (2 Xeon 8480C,
# 8 channels of DDR5-4800 each)
H200_HOST = min(gpus.HOST_THREAD_BW * 1e9, 2 * 8 * 4.8e9 * 8)


def test_offload_on_one_gpu_pays_its_pcie_copies():
    # One rank: no ring, but every micro-batch still copies the fp32 parameters to the GPU before
    # the forward's and again before the backward's all-gather, and the fp32 gradients back.
    cfg, _ = load('gpt_13b')
    P, s, L = exact_params(cfg), cfg.block_size, cfg.n_layer
    pcie = 63e9 * timing.PCIE_EFFICIENCY                       # H200: PCIe Gen5 x16 per direction
    copies = (2 * 4 * P + 4 * P) / pcie
    ranks = search._normalise(cluster('H200', 1, host_gib=1024), 1.0)
    compute = sum(timing.compute(cfg, ranks[0], False, True, 1))  # (its own tests: test_clock)
    assert compute > s * flops_per_token(cfg) / 989e12          # not above the datasheet's peak
    adam = ADAMW_STEP_BYTES * P / H200_HOST                     # on the host
    assert copies > 3 * compute                                 # what the old model dropped
    p = search.make_plan(cfg, 1, cluster('H200', 1, host_gib=1024), plan='fsdp+offload')
    assert p.fits and p.step_time == pytest.approx(max(copies, compute) + adam, rel=1e-6)


def test_offload_accumulation_adds_gradients_on_the_host():
    # Reduced after each of K micro-batches, every one but the first is copied back synchronously
    # and added to the host's gradient (read 2, write 1 fp32 per parameter): K-1 exposed adds.
    cfg, _ = load('gpt_1p3b')
    P, s, L, K = exact_params(cfg), cfg.block_size, cfg.n_layer, 4
    pcie = 63e9 * timing.PCIE_EFFICIENCY
    ranks = search._normalise(cluster('H200', 1, host_gib=1024), 0.9)
    c0, c1 = timing.compute(cfg, ranks[0], False, True, 2)  # (its own tests: test_clock)
    per_micro_batch = max((2 * 4 * P + 4 * P) / pcie, c0 + 2 * c1)
    host_add = 4 * P / pcie + 12 * P / H200_HOST
    adam = ADAMW_STEP_BYTES * P / H200_HOST
    r = search._evaluate_one(cfg, 2 * K, ranks, 'fsdp+offload', 2, None, accumulate=False)
    assert [search._expand(x) for x in r['runs']] == [[2] * K]
    assert r['step'] == pytest.approx(K * per_micro_batch + (K - 1) * host_add + adam, rel=1e-6)


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_an_empty_micro_batch_costs_one_sequence(strategy):
    # One sequence for an H100 and a V100: the V100 gets none, but train.py still runs one
    # sequence × 0 on it (so that it joins the collectives): the step waits for that.
    cfg, _ = load('gpt_111m')
    p = search.make_plan(cfg, 1, cluster('H100-SXM', 1) + cluster('V100-32GB', 1), plan=strategy)
    assert p.fits and p.share == [1, 0]
    # dtype=auto: the V100 computes in float16 (125 TFLOP/s; it has no bf16 units), under FSDP
    # with the H100 (float16 on both is faster than bfloat16 with the V100 at its float32 rate)
    assert p.dtypes == (['bfloat16', 'float16'] if strategy == 'ddp' else ['float16'] * 2)
    v100_sequence = cfg.block_size * flops_per_token(cfg) / 125e12  # at its datasheet's peak
    assert p.step_time >= v100_sequence


def test_checkpointing_recomputes_all_but_the_last_linear():
    # Measured here on real CPU tensors: the matmul FLOPs of one block's forward and backward with
    # and without the checkpointing train.py applies (non-reentrant). FlopCounterMode does not count
    # the CPU's SDPA kernel, so attention's forward third (4·h·s per token) is added by formula.
    import functools
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode
    from model import Block
    cfg = GPTConfig(n_layer=3, n_embd=64, n_head=4, block_size=32)
    block, x = Block(cfg), torch.randn(1, cfg.block_size, cfg.n_embd, requires_grad=True)
    counted = []
    for forward in (block.forward, functools.partial(checkpoint, block.forward, use_reentrant=False)):
        with FlopCounterMode(display=False) as counter:
            forward(x).sum().backward()
        counted.append(counter.get_total_flops())
    s, h, L = cfg.block_size, cfg.n_embd, cfg.n_layer
    recompute = costs.flops_per_sequence(cfg, ac=True) - costs.flops_per_sequence(cfg)
    assert recompute == L * (counted[1] - counted[0]) + L * s * 4 * h * s
    assert counted[1] - counted[0] < 2 * s * sum(p.numel() for p in block.parameters() if p.dim() == 2)


def test_between_nodes_nccl_drives_every_nic_of_a_node():
    # NCCL runs its rings through all of a node's NICs at once (NVIDIA on nccl-tests#267: all-to-all
    # alone is held to one NIC), each NIC at 46-48 GB/s of its 50 (NDR 400 Gb/s; #290): between
    # nodes a ring's bus bandwidth is the node's NICs together, and the NVLink ring inside the
    # node (one node's figure) bounds it. DGX H100 and DGX A100: a NIC per GPU (400 and 200 Gb/s);
    # DGX-1 V100: four 100 Gb/s NICs for eight GPUs.
    achieved = 47 / 50
    for gpu, nics, line_rate in (('H100-SXM', 8, 400e9 / 8), ('A100-80GB', 8, 200e9 / 8),
                                 ('V100-32GB', 4, 100e9 / 8)):
        inside = timing.bandwidth(search._normalise(cluster(gpu, 8), 0.9), None)
        two_nodes = search._normalise(cluster(gpu, 16), 0.9)
        expected = min(inside, nics * line_rate * achieved)
        assert timing.bandwidth(two_nodes, None) == pytest.approx(expected, rel=0.02), gpu
    # a node of H100s beside a node of A100s: each node's own NVLink ring (the A100's 300 GB/s the
    # slower, at the 0.7 that nccl-tests reach of it) and the A100 node's NICs bound the ring;
    # PCIe (31.5 GB/s) only where unlike GPUs share a node
    mixed = search._normalise(cluster('H100-SXM', 8) + [dict(r, node=1) for r in cluster('A100-80GB', 8)],
                               0.9)
    assert timing.bandwidth(mixed, None) == pytest.approx(min(0.7 * 300e9, 8 * 200e9 / 8 * achieved),
                                                         rel=0.02)
    shared = search._normalise(cluster('H100-SXM', 4) + cluster('A100-80GB', 4), 0.9)
    assert timing.bandwidth(shared, None) == pytest.approx(0.7 * 31.5e9, rel=0.02)
    # --inter_node_gbs is per GPU: a node of one GPU has that much, a node of eight 8 times it
    one_each = search._normalise(cluster('H100-SXM', 2, per_node=1), 0.9)
    assert timing.bandwidth(one_each, 1e9) == pytest.approx(achieved * 1e9, rel=0.02)
    cfg, batch = load('gpt_1p3b')
    slow, fast = (search.make_plan(cfg, batch, cluster('H100-SXM', 16), plan='ddp', inter_node_bw=bw)
                  for bw in (100e9 / 8 / 8, None))
    assert fast.step_time < slow.step_time


def test_a_small_collective_costs_nccls_start_up():
    # A 4-byte all-reduce over 2 nodes of 8 GPUs takes 47 us (nccl#1244, NCCL 2.21): what DDP's
    # all-reduce of a few bytes is predicted to take, bandwidth being no part of it
    ranks = search._normalise(cluster('H100-SXM', 16), 0.9)
    bw = timing.bandwidth(ranks, None)
    assert timing.all_reduce(dict(total=1), 16, 15 / 16, bw) == pytest.approx(47e-6, rel=0.25)
    assert timing.all_reduce(dict(total=1), 1, 0, bw) == 0  # one rank: no collective


def test_a_sharded_model_on_64_gpus_runs_per_gpu_as_on_8_as_published():
    # MosaicML's MPT 13B and 1B under FSDP on 8 and on 64 H100s (bench/published.py): tokens/s per
    # GPU change by the published factor (13B: 4,800 against 4,792; 1B: 44,402 against 45,455),
    # within 10%. Before NCCL's use of every NIC was modelled, 13B on 64 was predicted at 0.29 of 8.
    sys.path.insert(0, str(ROOT / 'bench'))
    import published
    runs = {(size, n): (micro, count, ac, tps) for size, gpu, n, micro, count, ac, tps in published.MPT_RUNS
            if gpu == 'H100-SXM'}
    for size in ('13b', '1b'):
        per_gpu = {}
        for n in (8, 64):
            micro, count, ac, _ = runs[size, n]
            per_gpu[n] = published.plan_mpt(size, 'H100-SXM', n, micro, count, ac).tokens_per_sec / n
        published_change = runs[size, 64][3] / runs[size, 8][3]
        assert per_gpu[64] / per_gpu[8] == pytest.approx(published_change, rel=0.10), (size, per_gpu)


def test_what_published_runs_held_fits():
    # MosaicML's MPT 30B (48 × 7168) ran at micro-batch 3 under FSDP with activation checkpointing
    # on 8 A100-80GB and on 8 H100s (bench/published.py): it fits as it ran. Planned against 90%
    # of the GPU it did not (73.3 GiB against 72). The budget is what CUDA gives: 79.25 GiB on an
    # A100-80GB, 79.11 on an H100 (users' out-of-memory messages, cited in hetgpt/gpus.py).
    sys.path.insert(0, str(ROOT / 'bench'))
    import published
    for gpu, cuda_gives in (('A100-80GB', 79.25), ('H100-SXM', 79.11)):
        p = published.plan_mpt('30b', gpu, 8, 3, 21, True)
        assert p.fits and p.caps == [3] * 8, gpu
        assert p.ranks[0]['budget'] / GiB == pytest.approx(cuda_gives, abs=0.005)
        # memory_fraction leaves the rest to another job: at half, 30B fits no more
        ranks = cluster(gpu, 8)
        half = search.make_plan(published.mpt('30b'), 3 * 21 * 8, ranks, plan='fsdp+ac',
                                 micro_batch_size=3, memory_fraction=0.5)
        assert not half.fits and half.ranks[0]['budget'] == p.ranks[0]['budget'] / 2


def test_the_allocator_s_rounding_is_pages_on_a_gpu_and_a_share_on_a_cpu():
    # expandable segments (train.py) lose at most a last page per pool and stream, whatever the
    # micro-batch: a GPU's 'other' (buffers, context, pages) does not grow with it. A CPU rank's
    # malloc keeps 5% of what comes and goes: its 'other' grows by 5% of the activations'.
    cfg, _ = load('gpt_111m')
    est = lambda strategy, device, b: memory.estimate(cfg, strategy, b, 2, 'bfloat16', 2, GiB,
                                                       device, False, 2)
    for strategy in ('ddp', 'fsdp'):
        small, large = est(strategy, 'cuda', 4), est(strategy, 'cuda', 8)
        assert large['activations'] > small['activations'] and large['other'] == small['other']
        small, large = est(strategy, 'cpu', 4), est(strategy, 'cpu', 8)
        grew = large['activations'] - small['activations']
        assert large['other'] - small['other'] == pytest.approx(0.05 * grew, abs=1)


def test_identical_ranks_are_one_row_of_the_plan_table():
    # 512 sequences on 64 H100s on 8 nodes, 8 each: one row "0-63" on nodes "0-7"; 2 A100s and 2
    # V100s on two nodes: a row for each kind
    cfg, batch = load('gpt_1p3b')
    table = search.make_plan(cfg, 512, cluster('H100-SXM', 64)).table().splitlines()
    rows = [line for line in table if ' pred ' in line]
    assert len(rows) == 1 and rows[0].split()[:3] == ['0-63', '0-7', 'H100-SXM'], table
    mixed = cluster('A100-80GB', 2, per_node=2) + [dict(r, node=1) for r in cluster('V100-32GB', 2)]
    rows = [line.split()[:3] for line in search.make_plan(cfg, batch, mixed).table().splitlines()
            if ' pred ' in line]
    assert rows == [['0-1', '0', 'A100-80GB'], ['2-3', '1', 'V100-32GB']], rows


def test_the_host_step_is_measured_as_make_optimizer_steps(monkeypatch):
    # probe.host_step_rate times model.make_optimizer's step on this CPU: an optimizer whose step
    # takes 0.2 s can only measure at most its bytes (16 per element: no state) per 0.2 s. A CPU
    # rank does not measure.
    import model

    class Slow(torch.optim.SGD):
        def step(self, closure=None):
            time.sleep(0.2)
            return super().step(closure)

    from hetgpt.run import probe
    assert probe.host_step_rate('cpu') is None
    monkeypatch.setattr(model, 'make_optimizer', lambda net, config: [Slow(net.parameters(), lr=0.1)])
    costs.optimizer_state_bytes.cache_clear()
    try:
        assert 0 < probe.host_step_rate('cuda') <= 16 * 2**24 / 0.2
    finally:
        costs.optimizer_state_bytes.cache_clear()


def test_the_offloaded_step_runs_at_the_hosts_rate():
    # What the ranks measured, summed per node; in a dry run a node's ranks get a thread each
    # (torchrun: OMP_NUM_THREADS=1) at one thread's rate, up to its memory: DGX A100's two EPYC
    # 7742 with 8 channels of DDR4-3200 each, 2 × 8 × 3.2e9 × 8 bytes/s
    measured = [dict(r, host_bw=3e9 if r['node'] else 5e9) for r in cluster('A100-80GB', 16)]
    assert timing.host_bw(search._normalise(measured, 0.9)) == {0: 8 * 5e9, 1: 8 * 3e9}
    dgx_a100 = 2 * 8 * 3.2e9 * 8
    one_node = search._normalise(cluster('A100-80GB', 8), 0.9)
    assert timing.host_bw(one_node)[0] == min(8 * gpus.HOST_THREAD_BW * 1e9, dgx_a100)
    crowded = search._normalise(cluster('A100-80GB', 24, per_node=24), 0.9)
    assert timing.host_bw(crowded)[0] == dgx_a100
    cpu = search._normalise([dict(device='cpu', mem=8 * GiB)] * 2, 0.9)
    assert timing.host_bw(cpu)[0] == timing.HOST_ADAM_BW
    # a slower host, a slower offloaded step
    cfg, batch = load('gpt_1p3b')
    slow, fast = (search.make_plan(cfg, batch, [dict(r, host_bw=bw) for r in cluster('A100-80GB', 8)],
                                    plan='fsdp+offload').step_time for bw in (2e9, 20e9))
    assert slow > fast


def test_cuda_overhead_is_measured_at_start_up(monkeypatch):
    # What is in use on the device but not in PyTorch's allocator after the first collective (CUDA
    # context, NCCL buffers) is the rank's overhead, in place of the 1 GiB guess.
    total, reserved = gpus.GPUS['H200']['mem'], 2 * 2**20
    free = total - reserved - int(0.7 * GiB)
    monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda *a: (free, total))
    monkeypatch.setattr(torch.cuda, 'memory_reserved', lambda *a: reserved)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'NVIDIA H200')
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda including_emulation=True: True)
    me = hardware.this_rank('cuda', 0, 1, host_bw=7e9)  # (train.py: probe.host_step_rate)
    assert me['gpu'] == 'H200' and me['mem'] == total and me['overhead'] == total - free - reserved
    assert me['host_bw'] == 7e9
    cfg, _ = load('gpt_111m')
    with_it, without = (memory.estimate(cfg, 'ddp', 1, 1, overhead=o)['total'] for o in (me['overhead'], 0))
    assert with_it - without == me['overhead']
    default = search.make_plan(cfg, 480, cluster('H200', 1)).caps[0]
    measured = search.make_plan(cfg, 480, [me]).caps[0]
    assert measured >= default  # 0.7 GiB measured against the guessed 1 GiB: never a smaller cap


def test_a_stated_memory_is_the_rank_s_budget_and_its_probe_room(monkeypatch):
    # HETGPT_MEM_GIB=20,80 on a node of two H200s: local rank 0 plans with 20 GiB. What is in use
    # on its GPU may be the other job's, so its own overhead is the planner's default (1 GiB), and
    # the probe step's room is the 20 GiB less it; a CPU rank's room is 90% of its memory (its
    # RSS counts the whole process; the kernel keeps the rest).
    total = gpus.GPUS['H200']['mem']
    monkeypatch.setattr(torch.cuda, 'mem_get_info', lambda *a: (total // 2, total))
    monkeypatch.setattr(torch.cuda, 'memory_reserved', lambda *a: 0)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'NVIDIA H200')
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda including_emulation=True: True)
    monkeypatch.setenv('HETGPT_MEM_GIB', '20,80')
    tight, roomy = (hardware.this_rank('cuda', r, 2, hardware.stated_memory(r)) for r in (0, 1))
    assert (tight['mem'], roomy['mem'], tight['overhead']) == (20 * GiB, 80 * GiB, None)
    cpu = dict(device='cpu', mem=3 * GiB, node=1, host_mem=None)
    cfg, _ = load('gpt_111m')
    p = search.make_plan(cfg, 64, [tight, roomy, cpu])
    assert p.caps[0] < p.caps[1]
    assert p.room(0) == 20 * GiB - GiB and p.room(1) == 80 * GiB - GiB
    assert p.room(2) == 0.9 * 3 * GiB


def test_h100_over_a100_is_the_published_ratio():
    # MosaicML's MPT 1B on 8 H100-SXM and on 8 A100-80GB (bench/published.py): 45,455 against
    # 20,513 tokens/s per GPU, 2.22x. The planner's kernels at published micro-benchmark rates
    # (hetgpt/planner/timing.py, the ceiling: 2.49x) over each generation's step efficiency
    # (hetgpt/planner/efficiency.py: Hopper's and Ampere's priors) give the ratio within 15%; one
    # efficiency for every GPU at 0.5 of peak gave 3.1x.
    sys.path.insert(0, str(ROOT / 'bench'))
    import published
    runs = {(gpu, n): r for size, gpu, n, *r in published.MPT_RUNS if size == '1b'}
    per_gpu = {}
    for gpu in ('H100-SXM', 'A100-80GB'):
        micro, count, ac, tps = runs[gpu, 8]
        per_gpu[gpu] = published.plan_mpt('1b', gpu, 8, micro, count, ac).tokens_per_sec / 8, tps
    predicted = per_gpu['H100-SXM'][0] / per_gpu['A100-80GB'][0]
    assert predicted == pytest.approx(per_gpu['H100-SXM'][1] / per_gpu['A100-80GB'][1], rel=0.15)


@pytest.mark.parametrize('path', sorted((ROOT / 'configs').glob('*.py')), ids=lambda p: p.stem)
def test_each_configs_stated_parameter_count_is_the_models(path):
    # the header comment users read ("Exact parameter count: N") against the model it builds
    stated = re.search(r'Exact parameter count: ([\d,]+)', path.read_text())
    assert stated, f"{path.name} states no parameter count"
    cfg, _ = load(path.stem)
    assert int(stated.group(1).replace(',', '')) == exact_params(cfg)


# -----------------------------------------------------------------------------
# The dry run's command line: a user's mistake is one line on stderr starting 'error: ' and exit
# status 2; "does not fit" is an answer, exit status 1.

PLAN_MISTAKES = [  # (arguments after configs/gpt_tiny.py, what the error line says)
    ('--gpus 0xA100-80GB', 'COUNT >= 1'), ('--gpus x', 'cannot read'),
    ('--gpus=-1xH100', 'cannot read'), ('--gpus=', 'cannot read'), ('--gpus 2xA999', 'cannot read'),
    ('--gpus 2xH100-SXM,', 'cannot read'), ('--gpus 2xcpu', '--host_mem'),
    # an ambiguous name is not guessed: the keys it could be (issue 27)
    ('--gpus A100', 'say one of A100-80GB, A100-40GB, A100-PCIe-80GB, A100-PCIe-40GB'),
    ('--gpus 2xH100', 'say one of H100-SXM, H100-PCIe'),
    ('--gpus 2xA100-80GB+2xV100-32GB', 'cannot read'), ('--gpus 2xA100-80GB 2xV100-32GB', 'give config files'),
    ('--gpus 12xH100-SXM --nodes 5', 'one of 1, 2, 3, 4, 6, 12'),
    ('--host_mem -1', '--host_mem'), ('--host_mem 0', '--host_mem'),
    ('--host_mem nan', '--host_mem'), ('--nodes -1', '--nodes'), ('--nodes 0', '--nodes 0: must be >= 1'),
    ('--gpus 17xH100-SXM', 'batch_size=16 cannot feed 17 ranks'),  # as train.py says it
    ('--nodes 3 --gpus 2xH100-SXM', 'one per node'), ('--micro_batch_size=-1', 'micro_batch_size=-1'),
    ('--memory_fraction=0', 'memory_fraction=0'), ('--memory_fraction=1.5', 'memory_fraction'),
    ('--inter_node_gbs 0', '--inter_node_gbs'), ('--inter_node_gbs inf', '--inter_node_gbs'),
    ('--link_gbit 0', '--link_gbit'), ('--link_gbit nan', '--link_gbit'),
    ('--link_gbit 1 --inter_node_gbs 1', 'no --inter_node_gbs with it'),
    ('--cpu_gflops -1', '--cpu_gflops'), ('--outer_interval=-1', 'outer_interval=-1'),
    ('--gpus 8xRTX4090 --nodes 3 --outer_interval=5', 'as many ranks on every node'),  # 3/3/2
    ('--plan zero3', 'invalid choice'), ('--dtype fp8', 'invalid choice'),
    ('--nodes two', 'invalid int'), ('--n_layer=0', 'n_layer=0'), ('--n_head=5', 'not divisible'),
    ('--batch_size=0', 'batch_size=0'), ('--dropout=1.0', 'dropout'), ('--n_layer=2.5', 'n_layer'),
    ('--n_layr=2', 'did you mean n_layer'), ('configs/gpt_tiny', 'config files'),
    ('configs/nope.py', 'cannot read config file')]


@pytest.mark.parametrize('args,expected', PLAN_MISTAKES, ids=[a for a, _ in PLAN_MISTAKES])
def test_dry_run_mistakes_are_one_line(args, expected, capsys):
    with pytest.raises(SystemExit) as e:
        plan.main([str(ROOT / 'configs' / 'gpt_tiny.py'), *args.split()])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and not out
    assert err.splitlines() == [err.strip()] and err.startswith('error: ') and expected in err, err


def test_dry_run_mistake_as_a_process():
    # the contract end to end: no usage block, no traceback, exit status 2 (1 means "does not fit")
    for args in (['--gpus', '0xA100-80GB'], ['--bogus-flag']):
        out = subprocess.run([sys.executable, 'plan.py', 'configs/gpt_tiny.py', *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        one_error_line(out)
        assert not out.stdout, out.stdout


def test_a_rank_with_less_memory_checkpoints_and_the_others_do_not():
    # Two H200s on two nodes with a slow link (1.6 Gb/s: FSDP's gathers per micro-batch cost more
    # than DDP's one all-reduce), one shared with another job (27 GiB left to us): 1.3B's model
    # states (16 B per parameter, 19.6 GiB) fit there but not one 2048-token sequence's
    # activations and the loss's working set without checkpointing. DDP fails on that rank; under
    # ddp+ac only that rank checkpoints (and takes a smaller micro-batch); the other trains
    # without the recompute.
    cfg, _ = load('gpt_1p3b')
    ranks = cluster('H200', 2, per_node=1)
    ranks[1]['mem'] = 27 * GiB
    p = search.make_plan(cfg, 64, ranks, plan='auto', inter_node_bw=0.2e9)
    assert p.candidates[0][:2] == ('ddp', False)
    assert p.fits and p.strategy == 'ddp+ac' and p.ac == [False, True]
    assert p.caps[0] > p.caps[1] >= 1
    rows = p.table().splitlines()
    assert re.match(r'\s+0\s+0\s+H200 .* no +pred', rows[2]) and re.match(r'\s+1\s+1\s+H200 .* yes pred', rows[3])
    # plan=ddp+ac asked for: every rank checkpoints, as asked
    assert search.make_plan(cfg, 64, ranks, plan='ddp+ac', inter_node_bw=0.2e9).ac == [True, True]


def test_where_the_weights_are_first_made():
    # 'cpu' (the whole float32 model on each node's host, one copy per rank) when that fits in half
    # the host memory, else 'meta' (each rank makes its own shard); 'auto' only: a choice is kept
    cfg, _ = load('gpt_1p3b')
    copies = 4 * exact_params(cfg) * 8  # eight ranks per node
    fits, tight = cluster('H200', 8, host_gib=math.ceil(2.2 * copies / GiB)), \
        cluster('H200', 8, host_gib=math.floor(1.8 * copies / GiB))
    assert search.make_plan(cfg, 64, fits).init_device == 'cpu'
    assert search.make_plan(cfg, 64, tight).init_device == 'meta'
    assert search.make_plan(cfg, 64, tight, init_device='cpu').init_device == 'cpu'


def test_dtype_auto_takes_bfloat16_only_where_the_gpu_computes_it(monkeypatch):
    # torch.cuda.is_bf16_supported() is True on a V100, which emulates bfloat16 at its float32
    # rate: dtype=auto asks without emulation (issue 27); a GPU without native bfloat16 computes
    # in float16 from compute capability 7.0 (Volta's tensor cores), else in float32. The dry run
    # reads the same from the GPU table.
    for native, capability, expected in ((False, (7, 0), 'float16'), (True, (8, 0), 'bfloat16'),
                                         (False, (6, 1), 'float32')):  # a V100, an A100, a P40
        monkeypatch.setattr(torch.cuda, 'is_bf16_supported',
                            lambda including_emulation=True: including_emulation or native)
        monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: capability)
        assert hardware.native_dtype('cuda') == expected
    for gpu, expected in (('V100-32GB', 'float16'), ('RTX2080Ti', 'float16'), ('T4', 'float16'),
                          ('A100-80GB', 'bfloat16'), ('H100-SXM', 'bfloat16')):
        assert hardware.native_dtype('cuda', gpu) == expected, gpu


def test_the_dry_run_says_the_whole_run_and_the_torchrun_line_of_each_node(capsys):
    # issue 27: max_iters × the predicted step, the run's tokens (max_iters × batch × block_size,
    # gpt_1p3b.py's: 24,334 × 528 × 2048), and the command each node runs (its own GPU count)
    import re
    assert plan.main([str(ROOT / 'configs' / 'gpt_1p3b.py'), '--gpus', '16xH100-SXM']) == 0
    out = capsys.readouterr().out
    step = float(re.search(r'predicted: step ([\d.]+) s', out)[1])
    run = re.search(r'the run: max_iters 24,334 × ([\d.]+) s = (\S+) predicted, ([\d,]+) tokens', out)
    assert run and float(run[1]) == pytest.approx(step, rel=0.01)
    assert int(run[3].replace(',', '')) == 24_334 * 528 * 2048
    # two units, the smaller truncated ('8h30m'): within a unit of it (the step shown to 3 digits)
    size = {'d': 86400, 'h': 3600, 'm': 60, 's': 1}
    big, unit, small, smaller = re.fullmatch(r'(\d+)([dhm])(\d+)([hms])', run[2]).groups()
    shown = int(big) * size[unit] + int(small) * size[smaller]
    assert 0.99 * 24_334 * step - size[smaller] <= shown <= 1.01 * 24_334 * step, run[2]
    lines = re.findall(r'node (\d): torchrun --nnodes=2 --node_rank=(\d) --nproc_per_node=(\d+) '
                       r'--master_addr=HOST0 --master_port=29500 train.py \S+gpt_1p3b.py$', out, re.M)
    assert lines == [('0', '0', '8'), ('1', '1', '8')], out
    assert plan.main([str(ROOT / 'configs' / 'gpt_tiny.py'), '--gpus', '1xH200']) == 0
    assert re.search(r'^run it: torchrun --standalone --nproc_per_node=1 train.py \S+gpt_tiny.py$',
                     capsys.readouterr().out, re.M)


def test_an_emulated_dtype_runs_at_the_float32_rate():
    # The datasheets' dense rates (issue 27): a V100 has fp16 tensor cores (125 TFLOP/s) and no
    # bf16 ones, so bfloat16 runs at its float32 rate (15.7); a 2080 Ti (Turing whitepaper) 53.8
    # fp16 with fp32 accumulate, 13.4 float32; an A100 312 in both 16-bit types
    for name, dtype, tflops in (('Tesla V100-SXM2-32GB', 'float16', 125),
                                ('Tesla V100-SXM2-32GB', 'bfloat16', 15.7),
                                ('NVIDIA GeForce RTX 2080 Ti', 'float16', 53.8),
                                ('NVIDIA GeForce RTX 2080 Ti', 'bfloat16', 13.4),
                                ('NVIDIA A100-SXM4-80GB', 'bfloat16', 312),
                                ('NVIDIA A100-SXM4-80GB', 'float16', 312)):
        assert gpus.peak_flops(name, dtype) == pytest.approx(tflops * 1e12), (name, dtype)
    assert gpus.gpu_key('NVIDIA GeForce RTX 2080') is None  # not the Ti: not in the table


def test_what_each_gpu_kind_adds_and_the_dtype_each_computes_in(capsys):
    # 1.3B on 2 A100-80GB + 2 V100-32GB over two nodes (issue 27). A V100 has no bfloat16 tensor
    # cores: in bfloat16 its matmuls run at its float32 rate (15.7 TFLOP/s), in float16 at 125;
    # an A100 at 312 in both. Split by speed, a V100's share of the batch is its share of the
    # speed, which mixes its kinds of work: no lower than its slowest kind's ratio to the A100's,
    # no higher than its fastest's (the cited rates: matmuls 0.8 of peak against the A100's
    # 271.2 TFLOP/s; attention 35% of peak against FA2's 63-73%; memory 900 GB/s against 2,039).
    # Both over their generation's step efficiency (hetgpt/planner/efficiency.py: Volta's against
    # Ampere's). float16 on the V100s then beats bfloat16 everywhere; dtype=auto computes each
    # GPU in its fastest (DDP), or all in float16 (FSDP); plan.py says what the V100s add and, from
    # --dtype=bfloat16, that auto is faster.
    import re
    from hetgpt.planner.efficiency import STEP_EFFICIENCY
    v100 = {'bfloat16': 15.7, 'float16': 125}
    slower = STEP_EFFICIENCY['Volta'] / STEP_EFFICIENCY['Ampere']
    ranks = expand(plan._cluster('2xA100-80GB,2xV100-32GB', 2, None))  # (rank by rank)
    cfg, batch = load('gpt_1p3b')
    for dtype in ('bfloat16', 'float16', 'auto'):
        p = search.make_plan(cfg, batch, ranks, dtype=dtype)
        v = 'float16' if dtype == 'auto' else dtype
        kinds = [slower * x for x in (0.8 * v100[v] / 271.2, 0.35 * v100[v] / (0.63 * 312), 900 / 2039)]
        share = lambda x: x / (1 + x)  # a V100's share beside an A100 whose speed is 1
        assert share(min(kinds)) <= p.share[2] / (p.share[0] + p.share[2]) <= share(max(kinds))
        assert p.dtypes[2:] == [v] * 2
        assert p.dtypes[:2] == ([v] * 2 if dtype != 'auto' or p.shard else ['bfloat16'] * 2)
    ratio = lambda dtype: (search.make_plan(cfg, batch, ranks, dtype=dtype).tokens_per_sec
                           / search.make_plan(cfg, batch, ranks, dtype='bfloat16').tokens_per_sec)
    gain = ratio('float16')
    assert gain > 1.1 and ratio('auto') == pytest.approx(gain)
    mixed = [str(ROOT / 'configs' / 'gpt_1p3b.py'), '--gpus', '2xA100-80GB,2xV100-32GB', '--nodes', '2']
    assert plan.main(mixed) == 0
    out = capsys.readouterr().out
    assert re.search(r'^the 2 × V100-32GB add \+[\d.]+% tokens/s$', out, re.M), out
    assert re.search(r'^ +2-3 +1 V100-32GB +fp16 ', out, re.M), out
    assert '--dtype=' not in out  # (auto is the fastest)
    assert plan.main(mixed + ['--dtype', 'bfloat16']) == 0
    out = capsys.readouterr().out
    assert re.search(r'^ +2-3 +1 V100-32GB +bf16 ', out, re.M), out
    said = float(re.search(r'^--dtype=auto \(here and in train.py\) would give \+([\d.]+)% '
                           r'tokens/s$', out, re.M)[1]) / 100
    assert said == pytest.approx(gain - 1, abs=0.03)


# Local steps (outer_interval > 0) run a whole model on every rank (knobs.refuses_local_steps):
# (config, GPU, count, per node, memory_fraction) where every step's plan=auto shards the model.
# gpt_111m on 8 A100s: fsdp-noreshard is faster, ddp fits; gpt_1p3b on two 4090s at 0.7 of their
# memory: only sharded does its 16 bytes a parameter fit.
LOCAL_PLANS = [('gpt_111m', 'A100-80GB', 8, 8, 1.0), ('gpt_1p3b', 'RTX4090', 2, 1, 0.7)]


@pytest.mark.parametrize('name,gpu,count,per_node,fraction', LOCAL_PLANS,
                         ids=[r[0] for r in LOCAL_PLANS])
def test_plan_auto_with_local_steps_plans_a_whole_model(name, gpu, count, per_node, fraction,
                                                         capsys):
    cfg, batch = load(name)
    ranks = cluster(gpu, count, 1024, per_node)
    every = search.make_plan(cfg, batch, ranks, memory_fraction=fraction)
    assert every.fits and every.shard, every.strategy
    p = search.make_plan(cfg, batch, ranks, memory_fraction=fraction, outer_interval=5)
    assert not p.shard and {s for s, _, _ in p.candidates} == {'ddp', 'ddp+ac'}, p.candidates
    whole = 16 * exact_params(cfg) < fraction * budget(gpu)  # (AdamW's states on one rank)
    assert p.fits == whole, (p.strategy, p.advice)
    if not p.fits:  # what does fit, said
        assert f"outer_interval=0 fits ({every.strategy})" in p.advice, p.advice
        assert p.needs['outer_interval'] == 0
    # a plan named that shards: one line, the fix in it
    with pytest.raises(SystemExit) as e:
        search.make_plan(cfg, batch, ranks, plan=every.strategy, outer_interval=5)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count('\n') == 1, err
    assert f"plan={every.strategy} with outer_interval=5" in err and 'outer_interval=0' in err


# plan.py's local-steps line (arguments after configs/gpt_tiny.py, what it says): local steps
# offered only where train.py runs them (as many ranks on every node, a whole model), else why.
# 8 GPUs on 3 nodes are 3/3/2; gpt_tiny on 4 CPU ranks: every step's plan is fsdp-noreshard.
PLAN_LOCAL = [('--gpus 8xRTX4090 --nodes 3 --link_gbit 1', 'not for this layout'),
              ('--gpus 8xRTX4090 --nodes 4 --link_gbit 1', 'local steps, outer_interval=500'),
              ('--gpus 4xcpu --host_mem 16 --nodes 2 --plan fsdp', 'not for this plan'),
              ('--gpus 4xcpu --host_mem 16 --nodes 2 --outer_interval=5',
               'local steps, outer_interval=5:')]


@pytest.mark.parametrize('args,said', PLAN_LOCAL, ids=[a for a, _ in PLAN_LOCAL])
def test_the_dry_run_offers_local_steps_only_where_train_py_runs_them(args, said, capsys):
    argv = args.split()
    assert plan.main([str(ROOT / 'configs' / 'gpt_tiny.py'), *argv]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith('local steps'))
    assert said in line, line
    strategy = re.search(r'^plan: (\S+) ', out, re.M)[1]
    get = dict(zip(argv[::2], argv[1::2]))
    R, nodes = int(get['--gpus'].split('x')[0]), int(get['--nodes'])
    even = R % nodes == 0  # ranks spread evenly over the nodes: as many on each
    offered = line.startswith('local steps, outer_interval=')
    assert offered == (even and not knobs.flags(strategy)['shard']), (line, strategy)
    if 'give --nodes one of' in line:
        listed = [int(n) for n in line.split('give --nodes one of ')[1].split(', ')]
        assert listed == [n for n in range(2, R + 1) if R % n == 0], line
