"""
The planner's predicted training throughput against published figures for the same model shape,
GPUs, batch and strategy (no GPU needed: the planner's dry run), and each row's compute by kind of
work (hetgpt/planner/timing.py: matmuls, attention, the other kernels' bytes, each at a published
micro-benchmark's rate). tests/test_plan.py holds: the H100/A100 ratio at MPT 1B within 15% of
the published 2.22; every PyTorch run at or below the kernels' rates (predicted 1.0-1.8x
published); llm.c's fused kernels and ZeRO-Offload's single V100 within 25%; for the MPT runs the change in tokens/s per GPU from
8 GPUs to 64 within 10% of the published change.

  python bench/published.py

Llama 3 8B is not a GPT-2, so it is planned as the GPT-2 shape with its FLOPs per token: 35 layers
of width 4096 (GPT-2's 12·h² per layer against Llama's 13.3·h² with SwiGLU 14336 and 8 KV heads over
32 layers), its vocabulary of 128,256 and sequence of 8192: 5.95e10 FLOPs per token against
torchtitan's own 5.79e10.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hetgpt.planner import search, timing  # noqa: E402
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
# as model FLOPs instead, 6 per parameter and token, it would be 623.)
ZERO_OFFLOAD_10B = GPTConfig(n_layer=50, n_embd=4096, n_head=32, vocab_size=50257, block_size=1024, bias=True)
ZERO_OFFLOAD = ("Ren et al., ZeRO-Offload, arXiv 2101.06840: 40 TFLOP/s on one V100 for 10B; DeepSpeed "
                "docs/_tutorials/zero-offload.md for its shape and batch (50 × 4096, batch 10, checkpointing)")


def megatron_flops_per_token(cfg, passes=4):
    layers, h, s, v = cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size
    return passes * 24 * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


# (what, source, config, GPUs, global batch in sequences, plan, micro-batch, published tokens/s
# for all GPUs). llm.c's ZeRO-1 (optimizer state sharded, weights and gradients whole) is
# planned as ddp: the same compute and all-reduce volume.
PUBLISHED = [
    ('torchtitan Llama 3.1 8B, eager', TORCHTITAN, LLAMA3_8B, ('H100-SXM', 8), 16, 'fsdp+ac', 2, 8 * 5762),
    ('torchtitan Llama 3.1 8B, torch.compile', TORCHTITAN, LLAMA3_8B, ('H100-SXM', 8), 16, 'fsdp+ac', 2,
     8 * 6667),
    ('llm.c GPT-2 124M', LLMC, GPT2_124M, ('A100-80GB', 8), 512, 'ddp', 64, 524288 / 0.300),
    ('llm.c GPT-2 350M', LLMC_350M, GPT2_350M, ('A100-80GB', 8), 512, 'ddp', 64, 524288 / 0.820),
    ('llm.c GPT-2 1558M', LLMC_1558M, GPT2_1558M, ('H100-SXM', 8), 1024, 'ddp', 16, 1048576 / 2.80),
    ('ZeRO-Offload 10B', ZERO_OFFLOAD, ZERO_OFFLOAD_10B, ('V100-32GB', 1), 10, 'fsdp+ac+offload', 10,
     40e12 / megatron_flops_per_token(ZERO_OFFLOAD_10B)),
]


# MosaicML's MPT runs (llm-foundry scripts/train/benchmarking/README.md, tables "H100 80GB BF16"
# and "A100 80GB with 1600 Gbps node-node interconnect (RoCE)"): FSDP FULL_SHARD (ZeRO-3), bf16,
# sequence 2048, the micro-batch and activation checkpointing given. MPT is GPT-2's block without
# biases and with ALiBi in place of learned positions (GPT-2's wpe adds 2048·h parameters, under
# 0.2%), vocabulary 50368; its sizes: (layers, width, heads).
FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md (MPT, FSDP FULL_SHARD, bf16, seq 2048)"
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
    layers, width, heads = MPT[size]
    return GPTConfig(n_layer=layers, n_embd=width, n_head=heads, vocab_size=50368, block_size=2048, bias=False)


def plan_mpt(size, gpu, n, micro, count, ac):
    # one of MPT_RUNS planned as it ran: 8 GPUs per node, its strategy and micro-batch forced
    ranks = [dict(device='cuda', gpu=gpu, node=i // 8) for i in range(n)]
    return search.make_plan(mpt(size), micro * count * n, ranks, plan='fsdp+ac' if ac else 'fsdp',
                             micro_batch_size=micro)


def kinds(cfg, gpu, shard, ac, micro):
    # a rank's compute at this micro-batch by kind of work, as shares of its kernels' seconds
    k = timing._kernels(cfg, gpu, 'bfloat16', shard, ac, micro)
    return ', '.join(f"{name} {t / sum(k.values()):.0%}" for name, t in k.items())


def compare():
    rows = []
    for what, source, cfg, (gpu, n), batch, strategy, micro, published in PUBLISHED:
        ranks = [dict(device='cuda', gpu=gpu, node=0) for _ in range(n)]
        p = search.make_plan(cfg, batch, ranks, plan=strategy, micro_batch_size=micro)
        auto = search.make_plan(cfg, batch, ranks)
        rows.append(dict(what=what, source=source, gpus=f"{n}×{gpu}", strategy=strategy, published=published,
                         predicted=p.tokens_per_sec, ratio=p.tokens_per_sec / published,
                         auto=f"{auto.strategy} {auto.tokens_per_sec:,.0f}",
                         kinds=kinds(cfg, gpu, 'fsdp' in strategy, '+ac' in strategy, micro)))
    return rows


def compare_mpt():
    # MPT_RUNS: published and predicted tokens/s per GPU (None where the plan does not fit)
    rows = []
    for size, gpu, n, micro, count, ac, published in MPT_RUNS:
        p = plan_mpt(size, gpu, n, micro, count, ac)
        predicted = p.tokens_per_sec / n if p.fits else None
        rows.append(dict(what=f"MPT {size}", gpus=f"{n}×{gpu}", run=f"{micro}×{count}{' ac' if ac else ''}",
                         published=published, predicted=predicted,
                         ratio=predicted and predicted / published,
                         kinds=kinds(mpt(size), gpu, True, ac, micro)))
    return rows


if __name__ == '__main__':
    print('| published run | GPUs | plan | published tok/s | predicted tok/s | predicted / published | plan=auto '
          '| compute by kind |')
    print('|---|---|---|---|---|---|---|---|')
    for r in compare():
        print(f"| {r['what']} | {r['gpus']} | {r['strategy']} | {r['published']:,.0f} | {r['predicted']:,.0f} "
              f"| {r['ratio']:.2f} | {r['auto']} | {r['kinds']} |")
    print('\n| MPT run (per GPU) | GPUs | micro×count | published tok/s | predicted tok/s | predicted / published '
          '| compute by kind |')
    print('|---|---|---|---|---|---|---|')
    for r in compare_mpt():
        predicted, ratio = ('does not fit', '-') if r['predicted'] is None else \
            (f"{r['predicted']:,.0f}", f"{r['ratio']:.2f}")
        print(f"| {r['what']} | {r['gpus']} | {r['run']} | {r['published']:,} | {predicted} | {ratio} "
              f"| {r['kinds']} |")
    print('\nsources:\n' + '\n'.join(f"- {s}" for s in dict.fromkeys([p[1] for p in PUBLISHED] + [FOUNDRY])))
