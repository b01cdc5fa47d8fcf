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
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import plan as planner
from configurator import configure
from model import GPT, GPTConfig, config_from

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
    return 0.9 * planner.GPUS[gpu]['mem']


def per_sequence(cfg):
    # activation bytes of one sequence, 16-bit, no checkpointing: 34·s·h per layer (the chunked
    # loss keeps no logits per sequence)
    return 34 * cfg.block_size * cfg.n_embd * cfg.n_layer


@pytest.mark.parametrize('name', ['gpt_tiny', 'gpt_111m', 'gpt_13b'])
def test_parameter_count_is_exact(name):
    cfg, _ = load(name)
    P = exact_params(cfg)
    assert planner.counts(cfg)['total'] == P
    e = planner.estimate(cfg, 'ddp', 1, 1)
    assert e['params'] == 4 * P and e['params'] + e['grads'] + e['optim'] == 16 * P  # ZeRO's 16Ψ


def test_111m_on_one_h200_is_ddp_without_checkpointing():
    cfg, batch = load('gpt_111m')
    P = exact_params(cfg)
    room = budget('H200') - 16 * P - GiB            # states and the CUDA context
    assert room > per_sequence(cfg)                # plain DDP holds at least one sequence
    p = planner.make_plan(cfg, batch, cluster('H200', 1))
    assert p.fits and p.strategy == 'ddp' and not p.ac and not p.shard
    # the micro-batch is what the formula allows, less autocast's weight copies, fp32 residual and slack
    assert min(batch, 0.6 * room / per_sequence(cfg)) <= p.micro_batch[0] <= room / per_sequence(cfg)
    assert sum(p.share) == batch and p.accum[0] == math.ceil(batch / p.micro_batch[0])


def test_13b_on_one_h200_with_128gb_host_does_not_fit_and_says_how_much_host():
    cfg, batch = load('gpt_13b')
    P = exact_params(cfg)
    assert 16 * P > budget('H200')                 # no GPU-only rung: the states alone overflow
    assert 16 * P > 0.9 * 128 * GiB                # offload: the host cannot hold them either
    p = planner.make_plan(cfg, batch, cluster('H200', 1, host_gib=128))
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
    p = planner.make_plan(cfg, batch, cluster('A100-80GB', 8, host_gib=1024))
    assert p.fits and p.shard and not p.offload
    assert len(set(p.accum)) == 1 and sum(p.share) == batch  # FSDP: the same number of micro-batches


def test_70b_on_16_a100_two_nodes_1tb_host_fits():
    cfg, batch = load('gpt_70b')
    P = exact_params(cfg)
    assert 16 * P / 16 * 8 < 0.9 * 1024 * GiB       # offloaded shards of 8 ranks fit a node's host
    p = planner.make_plan(cfg, batch, cluster('A100-80GB', 16, host_gib=1024))
    assert p.fits and p.shard and sum(p.share) == batch
    assert {r['node'] for r in p.ranks} == {0, 1}
    if p.offload:
        assert 8 * 16 * P / 16 <= p.predicted[0]['host'] <= 0.9 * 1024 * GiB


def test_forced_ddp_for_13b_on_one_gpu_does_not_fit():
    cfg, batch = load('gpt_13b')
    assert 16 * exact_params(cfg) > budget('H200')
    p = planner.make_plan(cfg, batch, cluster('H200', 1, host_gib=1024), plan='ddp')
    assert not p.fits and p.strategy == 'ddp' and 'ddp needs' in p.advice and 'plan=auto fits' in p.advice


def test_model_states_shrink_along_the_ladder():
    cfg, _ = load('gpt_13b')
    states = [sum(planner.estimate(cfg, s, 1, 8)[k] for k in ('params', 'grads', 'optim')) for s in planner.STRATEGIES]
    assert all(a >= b for a, b in zip(states, states[1:])) and states[0] > states[-1] == 0
    P = exact_params(cfg)
    assert states[3] == pytest.approx(16 * P / 8, rel=1e-3)  # FSDP: 16Ψ/N, up to dim-0 padding
    act = [planner.estimate(cfg, s, 4, 8)['activations'] for s in ('fsdp', 'fsdp+ac')]
    assert act[1] < act[0] / 3                      # checkpointing keeps block inputs only


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp', 'fsdp+ac'])
def test_micro_batch_cap_grows_with_memory(strategy):
    cfg, _ = load('gpt_1p3b')
    caps = [planner.make_plan(cfg, 4096, [dict(device='cuda', gpu='A100-80GB', mem=g * GiB)], plan=strategy).micro_batch[0]
            for g in (24, 40, 80, 141)]
    assert all(a <= b for a, b in zip(caps, caps[1:])) and caps[-1] > caps[0]


@pytest.mark.parametrize('name,ranks', [
    ('gpt_1p3b', cluster('A100-80GB', 8)),
    ('gpt_111m', cluster('H200', 1)),
    ('gpt_13b', cluster('A100-80GB', 4, 1024) + cluster('V100-32GB', 4, 1024)),
])
def test_auto_picks_the_fastest_that_fits(name, ranks):
    cfg, batch = load(name)
    auto = planner.make_plan(cfg, batch, ranks)
    forced = [planner.make_plan(cfg, batch, ranks, plan=s) for s in planner.STRATEGIES]
    assert auto.fits and all(auto.step_time <= p.step_time for p in forced if p.fits)
    assert auto.step_time == min(p.step_time for p in forced if p.fits)


def test_mixed_cluster_gives_faster_gpus_more():
    cfg, batch = load('gpt_13b')
    p = planner.make_plan(cfg, batch, cluster('A100-80GB', 4, 1024) + cluster('V100-32GB', 4, 1024))
    assert p.fits and sum(p.share) == batch and min(p.share[:4]) > max(p.share[4:])
    assert all(max(m) <= c for m, c in zip(p.micro_batches, p.micro_batch))


def test_forced_micro_batch_size():
    cfg, batch = load('gpt_111m')
    p = planner.make_plan(cfg, batch, cluster('H200', 1), micro_batch_size=8)
    assert p.fits and p.micro_batch == [8] and p.accum == [15]
    assert not planner.make_plan(cfg, 480, cluster('H200', 1), plan='ddp', micro_batch_size=480).fits


def test_gpu_names_and_peaks():
    names = {'NVIDIA H200': 'H200', 'NVIDIA H100 80GB HBM3': 'H100-SXM', 'NVIDIA H100 PCIe': 'H100-PCIe',
             'NVIDIA A100-SXM4-80GB': 'A100-80GB', 'NVIDIA A100-SXM4-40GB': 'A100-40GB',
             'NVIDIA A100-PCIE-40GB': 'A100-PCIe-40GB', 'NVIDIA A100 80GB PCIe': 'A100-PCIe-80GB',
             'Tesla V100-SXM2-32GB': 'V100-32GB', 'Tesla V100-PCIE-16GB': 'V100-16GB',
             'NVIDIA GeForce RTX 3090': 'RTX3090', 'NVIDIA GeForce RTX 4090': 'RTX4090', 'NVIDIA RTX A6000': 'A6000',
             'NVIDIA L40S': 'L40S', 'NVIDIA A10': 'A10', 'NVIDIA L4': 'L4', 'Tesla T4': 'T4', 'NVIDIA A40': 'A40',
             'a100-80gb': 'A100-80GB', 'Some Future GPU': None}
    for name, key in names.items():
        assert planner.gpu_key(name) == key, name
    assert planner.peak_flops('NVIDIA A100-SXM4-80GB', 'bfloat16') == 312e12
    assert planner.peak_flops('H100-SXM', torch.bfloat16) == 989e12
    assert planner.peak_flops('V100-32GB', 'float16') == 125e12
    assert planner.peak_flops('V100-32GB', 'bfloat16') == 15.7e12  # no bf16 tensor cores
    assert planner.peak_flops('A100-80GB', 'float32') == 156e12 and planner.peak_flops('A100-80GB', 'float32', tf32=False) == 19.5e12
    assert planner.peak_flops('cpu') is None and planner.peak_flops(None) is None


def test_table_shows_predicted_and_measured():
    cfg, batch = load('gpt_111m')
    p = planner.make_plan(cfg, batch, cluster('A100-80GB', 2))
    text = p.table(measured=[dict(total=30 * GiB, activations=20 * GiB), None])
    assert 'pred' in text and 'meas' in text and p.strategy in text and 'tokens/s' in text


def test_dry_run_175b_under_10_seconds():
    t = time.time()
    out = subprocess.run([sys.executable, 'plan.py', 'configs/gpt_175b.py', '--gpus', '64xA100-80GB',
                          '--host_mem', '1024'], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert time.time() - t < 10, out.stdout
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'fsdp' in out.stdout and 'tokens/s' in out.stdout


def test_fsdp_accumulation_without_sync_costs_unsharded_fp32_grads():
    # FSDP2 under set_requires_gradient_sync(False) keeps every gradient unsharded in fp32
    cfg, batch = load('gpt_1p3b')
    P = exact_params(cfg)
    a, b = (planner.estimate(cfg, 'fsdp', 2, 8, accumulate=acc)['grads'] for acc in (False, True))
    assert b - a == 4 * P
    p = planner.make_plan(cfg, batch, cluster('A100-80GB', 8))
    if p.shard and not p.reduce_every_micro_batch:
        assert p.predicted[0]['grads'] >= 4 * P
