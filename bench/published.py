"""
The planner's predicted training throughput against published end-to-end PyTorch runs for the same
model shape, GPUs, batch and strategy (no GPU needed: the planner's dry run), and the step efficiency
per GPU generation fitted on them (hetgpt/planner/efficiency.py). Each row is planned twice, its
GPU ranks' compute at efficiency 1.0 (the ceiling: kernels at micro-benchmark rates,
hetgpt/planner/timing.py) and at 0.5; the step at efficiency e is then a + b/e (b the compute the
efficiency divides, a what it does not: exposed collectives, PCIe copies, the optimizer step). A
row's efficiency is the e at which that step is the published one; the fit and every
leave-one-source-out prediction follow in pure Python (efficiency.fit). Printed per row: its
source, the ceiling's ratio, the held-out ratio (efficiency fitted without the row's source), the
full fit's ratio; then the efficiencies, the H100/A100 ratio at MPT 1B and plan.py's shares for
2 H100 + 2 A100 (tests/test_efficiency.py holds them).

  python bench/published.py

llm.c (C/CUDA, its own fused kernels) is shown but out of the fit: hetgpt's step is PyTorch's.
Llama 3 8B is not a GPT-2, so it is planned as the GPT-2 shape with its FLOPs per token: 35 layers
of width 4096 (GPT-2's 12·h² per layer against Llama's 13.3·h² with SwiGLU 14336 and 8 KV heads over
32 layers), its vocabulary of 128,256 and sequence of 8192: 5.95e10 FLOPs per token against
torchtitan's own 5.79e10.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hetgpt.gpus import GPUS, HOST_BW  # noqa: E402
from hetgpt.planner import efficiency, search, timing  # noqa: E402
from model import GPTConfig  # noqa: E402

LLAMA3_8B = GPTConfig(n_layer=35, n_embd=4096, n_head=32, vocab_size=128256, block_size=8192, bias=False)
GPT2_124M = GPTConfig(n_layer=12, n_embd=768, n_head=12, vocab_size=50304, block_size=1024, bias=True)
TORCHTITAN = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, table 1: 8 H100 (Grand Teton, "
              "96 GB HBM2e at 500 W), FSDP, bf16, selective activation checkpointing, local batch 2, seq 8192")
GPT2_350M = GPTConfig(n_layer=24, n_embd=1024, n_head=16, vocab_size=50304, block_size=1024, bias=True)
GPT2_1558M = GPTConfig(n_layer=48, n_embd=1600, n_head=25, vocab_size=50304, block_size=1024, bias=True)
LLMC = ("karpathy/llm.c scripts/run_gpt2_124M.sh: 'steps in ~300ms/iter' of 524,288 tokens on 8 A100 80GB SXM, "
        "bf16, cuDNN attention, no recompute, ZeRO-1, micro-batch 64 × 1024 per GPU")
LLMC_350M = ("karpathy/llm.c scripts/run_gpt2_350M.sh: 'steps in ~820ms/iter' of 524,288 tokens on 8 A100 80GB "
             "SXM, bf16, cuDNN, no recompute (-r 0), ZeRO-1 (-z 1), micro-batch 64 × 1024 (-b 64)")
LLMC_1558M = ("karpathy/llm.c scripts/run_gpt2_1558M.sh: 'steps in 2.80s/iter' of 1,048,576 tokens on 8 H100 80GB "
              "SXM, bf16, cuDNN, no recompute (-r 0), ZeRO-1 (-z 1), micro-batch 16 × 1024 (-b 16)")
# ZeRO-Offload (Ren et al., arXiv 2101.06840, abstract): "40 TFlops/GPU on a single NVIDIA V100 GPU
# for 10B parameter model", DeepSpeed's ZeRO-2 with the optimizer's state and step on the CPU (its
# own CPU Adam), the model as DeepSpeed's tutorial runs it (docs/_tutorials/zero-offload.md: 50
# layers, hidden 4096, 32 heads, batch 10, --checkpoint-activations, one V100-SXM3 32GB; Megatron's
# GPT-2 vocabulary 50257 and sequence 1024). TFLOP/s to tokens/s by the count DeepSpeed's Megatron
# scripts print (Megatron-DeepSpeed's throughput_calculator: 24·l·h²·(1 + s/6h + V/16lh) per token
# and pass, 4 passes with activation checkpointing): 8.5e10 FLOPs per token, 470 tokens/s. (Counted
# as model FLOPs instead, 6 per parameter and token, it would be 623.) As it ran, the optimizer step
# is DeepSpeedCPUAdam's, "5X-7X faster than the standard PyTorch implementation" (the tutorial):
# multi-threaded over the host's cores, so bound by the node's memory (gpus.HOST_BW, the DGX's
# datasheet), not by one thread's (what a hetgpt rank's own PyTorch step gets): the row's rank
# carries host_bw = the node's bandwidth.
ZERO_OFFLOAD_10B = GPTConfig(n_layer=50, n_embd=4096, n_head=32, vocab_size=50257, block_size=1024, bias=True)
ZERO_OFFLOAD = ("Ren et al., ZeRO-Offload, arXiv 2101.06840: 40 TFLOP/s on one V100 for 10B; DeepSpeed "
                "docs/_tutorials/zero-offload.md for its shape and batch (50 × 4096, batch 10, checkpointing)")
# NVIDIA's Megatron-LM (Shoeybi et al., arXiv 1909.08053, section 5.1.1 and table 1): the 1.2B
# GPT-2 (40 layers, hidden 1536, 16 heads; vocabulary padded to 51,200, sequence 1024, section 5.1)
# "on a single GPU ... achieves 39 TeraFLOPS during the overall training process, which is 30% of
# the theoretical peak FLOPS for a single GPU in a DGX-2H server" (V100 SXM3 32GB, section 5), at
# "a fixed batch size of 8" (5.1), mixed precision, "activation checkpointing after every
# transformer layer" (4.2). One GPU, no model parallelism: a plain PyTorch step. The paper prints
# no FLOP count; TFLOP/s to tokens/s by the one Megatron later published (Narayanan et al., arXiv
# 2104.04473, appendix: 4 passes of 24·l·h²·(1 + s/6h + V/16lh) per token with checkpointing, as
# ZeRO-Offload's row above): 1.05e10 FLOPs, 3,700 tokens/s. Cross-check: NVIDIA's Megatron v1.0
# post (nv-adlr.github.io/MegatronLMV1, table 1) has the same 1.2B at 1,288 ms per batch-8
# iteration for 62.4 TFLOP/s, 9.8e9 FLOPs per token by its count, which would put 39 TFLOP/s at
# 3,980 tokens/s (+7%). (The DGX-2H's V100 runs at 450 W: 130 TFLOP/s peak by the paper's 30%,
# against the table's 125.)
MEGATRON_1P2B = GPTConfig(n_layer=40, n_embd=1536, n_head=16, vocab_size=51200, block_size=1024, bias=True)
MEGATRON = ("Shoeybi et al., Megatron-LM, arXiv 1909.08053 sections 4.2, 5.1: 39 TFLOP/s by the 1.2B "
            "baseline on one V100 32GB, batch 8, checkpointing; FLOPs as arXiv 2104.04473's appendix counts")
# TinyLlama (Zhang et al., arXiv 2401.02385; jzhang38/TinyLlama README, "Blazingly Fast"): "a
# throughput of 24k tokens per second per A100-40G GPU ... without activation checkpointing", lit-gpt
# with FSDP (PyTorch; FlashAttention-2, fused SwiGLU, LayerNorm, loss and rotary), 16 A100-40G,
# sequence 2048, a batch of 1,024 sequences, 16k tokens (8 sequences) per GPU per micro-batch. The
# 1.1B Llama (22 layers of 2048, 32 heads in 4 KV groups, SwiGLU 5632: 10.5·h² per layer) is
# planned as 19 GPT-2 layers of 2048 (12·h² each, 1.3% fewer FLOPs), vocabulary 32,000; 2 nodes
# of 8.
TINYLLAMA_1B = GPTConfig(n_layer=19, n_embd=2048, n_head=32, vocab_size=32000, block_size=2048, bias=False)
TINYLLAMA = ("Zhang et al., TinyLlama, arXiv 2401.02385 and jzhang38/TinyLlama README: 24k tokens/s per "
             "A100-40G, FSDP, no checkpointing, 16 GPUs, 8 × 2048 tokens per GPU")


def megatron_flops_per_token(cfg, passes=4):
    """Megatron's count of a token's FLOPs in training (4 passes: with checkpointing)."""
    layers, h, s, v = cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size
    return passes * 24 * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


# Each row's organisation: the source the fit weights once (per GPU generation) and leaves out
ORGS = {TORCHTITAN: 'PyTorch (Meta) torchtitan', LLMC: 'llm.c (Karpathy)', LLMC_350M: 'llm.c (Karpathy)',
        LLMC_1558M: 'llm.c (Karpathy)', ZERO_OFFLOAD: 'Microsoft DeepSpeed', MEGATRON: 'NVIDIA Megatron-LM',
        TINYLLAMA: 'TinyLlama (SUTD)'}
NOT_PYTORCH = {'llm.c (Karpathy)'}  # shown beside, out of the fit

# (what, source, config, GPUs, global batch in sequences, plan, micro-batch, published tokens/s
# for all GPUs, what the run's ranks carry beyond the planner's defaults). llm.c's ZeRO-1
# (optimizer state sharded, weights and gradients whole) is planned as ddp: the same compute and
# all-reduce volume.
PUBLISHED = [
    ('torchtitan Llama 3.1 8B, eager', TORCHTITAN, LLAMA3_8B, ('H100-SXM', 8), 16, 'fsdp+ac', 2, 8 * 5762, {}),
    ('torchtitan Llama 3.1 8B, torch.compile', TORCHTITAN, LLAMA3_8B, ('H100-SXM', 8), 16, 'fsdp+ac', 2,
     8 * 6667, {}),
    ('llm.c GPT-2 124M', LLMC, GPT2_124M, ('A100-80GB', 8), 512, 'ddp', 64, 524288 / 0.300, {}),
    ('llm.c GPT-2 350M', LLMC_350M, GPT2_350M, ('A100-80GB', 8), 512, 'ddp', 64, 524288 / 0.820, {}),
    ('llm.c GPT-2 1558M', LLMC_1558M, GPT2_1558M, ('H100-SXM', 8), 1024, 'ddp', 16, 1048576 / 2.80, {}),
    ('ZeRO-Offload 10B', ZERO_OFFLOAD, ZERO_OFFLOAD_10B, ('V100-32GB', 1), 10, 'fsdp+ac+offload', 10,
     40e12 / megatron_flops_per_token(ZERO_OFFLOAD_10B), dict(host_bw=HOST_BW['V100-32GB'] * 1e9)),
    ('Megatron-LM 1.2B', MEGATRON, MEGATRON_1P2B, ('V100-32GB', 1), 8, 'ddp+ac', 8,
     39e12 / megatron_flops_per_token(MEGATRON_1P2B), {}),
    ('TinyLlama 1.1B', TINYLLAMA, TINYLLAMA_1B, ('A100-40GB', 16), 1024, 'fsdp', 8, 16 * 24000, {}),
]


# MosaicML's MPT runs (llm-foundry scripts/train/benchmarking/README.md, tables "H100 80GB BF16"
# and "A100 80GB with 1600 Gbps node-node interconnect (RoCE)"): FSDP FULL_SHARD (ZeRO-3), bf16,
# sequence 2048, the micro-batch and activation checkpointing given. MPT is GPT-2's block without
# biases and with ALiBi in place of learned positions (GPT-2's wpe adds 2048·h parameters, under
# 0.2%), vocabulary 50368; its sizes: (layers, width, heads).
FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md (MPT, FSDP FULL_SHARD, bf16, seq 2048)"
ORGS[FOUNDRY] = 'MosaicML llm-foundry'
MPT = {'760m': (24, 1536, 12), '1b': (24, 2048, 16), '3b': (32, 2560, 20), '7b': (32, 4096, 32),
       '13b': (40, 5120, 40), '30b': (48, 7168, 56), '70b': (80, 8192, 64)}
# (size, GPU, GPUs, micro-batch, micro-batches per step, activation checkpointing, tok/s per GPU)
MPT_RUNS = [
    ('70b', 'H100-SXM', 64, 8, 4, True, 1039), ('70b', 'H100-SXM', 32, 2, 16, True, 882),
    ('30b', 'H100-SXM', 32, 14, 3, True, 2308), ('30b', 'H100-SXM', 8, 3, 21, True, 2002),
    ('13b', 'H100-SXM', 64, 2, 1, False, 4800), ('13b', 'H100-SXM', 8, 2, 1, False, 4792),
    ('7b', 'H100-SXM', 8, 6, 1, False, 10643), ('3b', 'H100-SXM', 64, 6, 3, False, 22525),
    ('1b', 'H100-SXM', 64, 20, 1, False, 44402), ('1b', 'H100-SXM', 8, 14, 1, False, 45455),
    ('760m', 'H100-SXM', 8, 24, 2, False, 63147),
    ('70b', 'A100-80GB', 64, 8, 4, True, 410), ('30b', 'A100-80GB', 8, 3, 21, True, 916),
    ('13b', 'A100-80GB', 8, 2, 3, False, 2262), ('7b', 'A100-80GB', 8, 6, 2, False, 4641),
    ('3b', 'A100-80GB', 8, 10, 2, False, 10811), ('1b', 'A100-80GB', 8, 14, 4, False, 20513),
    ('760m', 'A100-80GB', 8, 24, 2, False, 32434),
]


def mpt(size):
    """MPT's size as a GPT-2 shape."""
    layers, width, heads = MPT[size]
    return GPTConfig(n_layer=layers, n_embd=width, n_head=heads, vocab_size=50368, block_size=2048, bias=False)


def plan_mpt(size, gpu, n, micro, count, ac, **extra):
    """One of MPT_RUNS planned as it ran: 8 GPUs per node, its strategy and micro-batch forced.

    extra: what each rank carries (efficiency=1.0: the ceiling); the prior efficiency otherwise.
    """
    ranks = [dict(device='cuda', gpu=gpu, node=i // 8, **extra) for i in range(n)]
    return search.make_plan(mpt(size), micro * count * n, ranks, plan='fsdp+ac' if ac else 'fsdp',
                             micro_batch_size=micro)


def kinds(cfg, gpu, shard, ac, micro):
    """A rank's compute at this micro-batch by kind of work, as shares of its kernels' seconds."""
    k = timing._kernels(cfg, gpu, GPUS[gpu].get('bf16') and 'bfloat16' or 'float16', shard, ac, micro)
    return ', '.join(f"{name} {t / sum(k.values()):.0%}" for name, t in k.items())


def rows():
    """Every published row as a dict: what, org, source, gpu, n, tokens per step, published tokens/s
    (all GPUs), fit (a PyTorch run), and plan(extra): the plan of the run as it ran, its ranks
    carrying extra."""
    out = []
    for what, source, cfg, (gpu, n), batch, strategy, micro, published, more in PUBLISHED:
        def plan(extra, cfg=cfg, gpu=gpu, n=n, batch=batch, strategy=strategy, micro=micro, more=more):
            ranks = [dict(device='cuda', gpu=gpu, node=i // 8, **more, **extra) for i in range(n)]
            return search.make_plan(cfg, batch, ranks, plan=strategy, micro_batch_size=micro)
        out.append(dict(what=what, org=ORGS[source], source=source, gpu=gpu, n=n, strategy=strategy,
                        tokens=batch * cfg.block_size, published=published, fit=ORGS[source] not in NOT_PYTORCH,
                        plan=plan, kinds=kinds(cfg, gpu, 'fsdp' in strategy, '+ac' in strategy, micro)))
    for size, gpu, n, micro, count, ac, per_gpu in MPT_RUNS:
        def plan(extra, size=size, gpu=gpu, n=n, micro=micro, count=count, ac=ac):
            return plan_mpt(size, gpu, n, micro, count, ac, **extra)
        out.append(dict(what=f"MPT {size}", org=ORGS[FOUNDRY], source=FOUNDRY, gpu=gpu, n=n,
                        strategy=f"fsdp{'+ac' if ac else ''} {micro}×{count}",
                        tokens=micro * count * n * 2048, published=per_gpu * n, fit=True, plan=plan,
                        kinds=kinds(mpt(size), gpu, True, ac, micro)))
    for r in out:
        r['generation'] = GPUS[r['gpu']]['generation']
    return out


_AFFINE = {}  # (what, gpu, n, strategy) -> (a, b): plan each row once per process


def affine(row):
    """(a, b) of a row: its step at efficiency e is a + b / e seconds.

    From its plans at 1.0 (the ceiling) and at 0.5: b the compute the efficiency divides, a the
    rest. (Exact while which of compute or collectives bounds each micro-batch stays the same.)
    """
    key = (row['what'], row['gpu'], row['n'], row['strategy'])
    if key not in _AFFINE:
        t1, t2 = (row['tokens'] / row['plan'](dict(efficiency=e)).tokens_per_sec for e in (1.0, 0.5))
        _AFFINE[key] = (2 * t1 - t2, t2 - t1)
    return _AFFINE[key]


def row_efficiency(row):
    """The efficiency at which the row's step is the published one."""
    a, b = affine(row)
    return b / (row['tokens'] / row['published'] - a)


def ratio(row, e):
    """Predicted / published tokens/s at efficiency e."""
    a, b = affine(row)
    return row['tokens'] / row['published'] / (a + b / e)


def fit(rs):
    """efficiency.fit over the PyTorch rows of rs."""
    return efficiency.fit([(r['generation'], r['org'], row_efficiency(r)) for r in rs if r['fit']])


def validate():
    """Every row with its ceiling ratio, held-out ratio (fitted without its org) and full-fit ratio;
    the full fit ({generation: efficiency}, fallback)."""
    rs = rows()
    full = fit(rs)
    for r in rs:
        held = fit([x for x in rs if x['org'] != r['org']])
        r['ceiling'] = ratio(r, 1.0)
        r['held_eff'] = efficiency.prior(r['gpu'], *held)[0]
        r['held_out'] = ratio(r, r['held_eff'])
        r['full'] = ratio(r, efficiency.prior(r['gpu'], *full)[0])
    return rs, full


def h100_over_a100():
    """(predicted, published) H100/A100 tokens/s per GPU at MPT 1B on 8 GPUs, at the stored priors."""
    runs = {gpu: r for size, gpu, n, *r in MPT_RUNS if size == '1b' and n == 8}
    per_gpu = {gpu: plan_mpt('1b', gpu, 8, micro, count, ac).tokens_per_sec / 8
               for gpu, (micro, count, ac, _) in runs.items()}
    return per_gpu['H100-SXM'] / per_gpu['A100-80GB'], runs['H100-SXM'][3] / runs['A100-80GB'][3]


def mixed_shares():
    """plan.py configs/gpt_1p3b.py --gpus=2xH100-SXM,2xA100-80GB, run as a user runs it: the sequences
    of one H100 rank and of one A100 rank (its table's share column)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, os.path.join(root, 'plan.py'), 'configs/gpt_1p3b.py',
                          '--gpus=2xH100-SXM,2xA100-80GB'], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    share = {}
    for line in out.splitlines():
        t = line.split()
        if len(t) > 4 and t[2] in ('H100-SXM', 'A100-80GB'):
            share[t[2]] = int(t[4])
    return share['H100-SXM'], share['A100-80GB']


if __name__ == '__main__':
    rs, (table, fallback) = validate()
    print('| published run | source | GPUs | plan | published tok/s | ceiling ratio | held-out ratio '
          '| full-fit ratio | compute by kind |')
    print('|---|---|---|---|---|---|---|---|---|')
    for r in rs:
        scale = r['n'] if r['what'].startswith('MPT') else 1
        held = f"{r['held_out']:.2f} (e {r['held_eff']:.3f})" if r['fit'] else f"({r['held_out']:.2f}: not fitted)"
        print(f"| {r['what']}{' (per GPU)' if scale > 1 else ''} | {r['org']} | {r['n']}×{r['gpu']} "
              f"| {r['strategy']} | {r['published'] / scale:,.0f} | {r['ceiling']:.2f} | {held} "
              f"| {r['full']:.2f} | {r['kinds']} |")
    fitted = [r for r in rs if r['fit']]
    worst = max(fitted, key=lambda r: abs(r['held_out'] - 1))
    print(f"\nheld out: {sum(abs(r['held_out'] - 1) <= 0.25 for r in fitted)} of {len(fitted)} PyTorch rows "
          f"within 25% (worst {worst['what']} on {worst['gpu']}: {worst['held_out']:.2f})")
    print('\nstep efficiency (geometric mean over sources of each source\'s geometric mean over its rows):')
    for gen, e in table.items():
        orgs = sorted({r['org'] for r in fitted if r['generation'] == gen})
        print(f"- {gen}: {e:.4f} ({', '.join(orgs)})")
    print(f"- fallback (every source once): {fallback:.4f}")
    stored = (efficiency.STEP_EFFICIENCY, efficiency.FALLBACK)
    print(f"stored in hetgpt/planner/efficiency.py: {stored}")
    predicted, pub = h100_over_a100()
    print(f"\nH100/A100 at MPT 1B (8 GPUs each): predicted {predicted:.2f}, published {pub:.2f} "
          f"({predicted / pub - 1:+.0%})")
    h, a = mixed_shares()
    print(f"plan.py configs/gpt_1p3b.py --gpus=2xH100-SXM,2xA100-80GB: an H100 {h}, an A100 {a} sequences: "
          f"{h / a:.2f} ({h / a / pub - 1:+.0%} of the published proportion)")
    print('\nsources:\n' + '\n'.join(f"- {ORGS[s]}: {s}" for s in dict.fromkeys([p[1] for p in PUBLISHED] + [FOUNDRY])))
