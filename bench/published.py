"""
The planner's predicted training throughput against published figures for the same model shape,
GPUs, batch and strategy (no GPU needed: the planner's dry run). tests/test_plan.py holds each
within 25%.

  python bench/published.py

Llama 3 8B is not a GPT-2, so it is planned as the GPT-2 shape with its FLOPs per token: 35 layers
of width 4096 (GPT-2's 12·h² per layer against Llama's 13.3·h² with SwiGLU 14336 and 8 KV heads over
32 layers), its vocabulary of 128,256 and sequence of 8192: 5.95e10 FLOPs per token against
torchtitan's own 5.79e10.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hetgpt import planner  # noqa: E402
from model import GPTConfig  # noqa: E402

LLAMA3_8B = GPTConfig(n_layer=35, n_embd=4096, n_head=32, vocab_size=128256, block_size=8192, bias=False)
GPT2_124M = GPTConfig(n_layer=12, n_embd=768, n_head=12, vocab_size=50304, block_size=1024, bias=True)
TORCHTITAN = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, table 1: 8 H100 (Grand Teton, "
              "96 GB HBM2e at 500 W), FSDP, bf16, selective activation checkpointing, local batch 2, seq 8192")
LLMC = ("karpathy/llm.c scripts/run_gpt2_124M.sh: 'steps in ~300ms/iter' of 524,288 tokens on 8 A100 80GB SXM, "
        "bf16, cuDNN attention, no recompute, ZeRO-1, micro-batch 64 × 1024 per GPU")

# (what, source, config, GPUs, global batch in sequences, plan, published tokens/s for all GPUs)
PUBLISHED = [
    ('torchtitan Llama 3.1 8B, eager', TORCHTITAN, LLAMA3_8B, ('H100-SXM', 8), 16, 'fsdp+ac', 8 * 5762),
    ('torchtitan Llama 3.1 8B, torch.compile', TORCHTITAN, LLAMA3_8B, ('H100-SXM', 8), 16, 'fsdp+ac', 8 * 6667),
    ('llm.c GPT-2 124M', LLMC, GPT2_124M, ('A100-80GB', 8), 512, 'ddp', 524288 / 0.300),
]


def compare():
    rows = []
    for what, source, cfg, (gpu, n), batch, strategy, published in PUBLISHED:
        ranks = [dict(device='cuda', gpu=gpu, node=0) for _ in range(n)]
        p = planner.make_plan(cfg, batch, ranks, plan=strategy)
        auto = planner.make_plan(cfg, batch, ranks)
        rows.append(dict(what=what, source=source, gpus=f"{n}×{gpu}", strategy=strategy, published=published,
                         predicted=p.tokens_per_sec, ratio=p.tokens_per_sec / published,
                         auto=f"{auto.strategy} {auto.tokens_per_sec:,.0f}"))
    return rows


if __name__ == '__main__':
    print('| published run | GPUs | plan | published tok/s | predicted tok/s | predicted / published | plan=auto |')
    print('|---|---|---|---|---|---|---|')
    for r in compare():
        print(f"| {r['what']} | {r['gpus']} | {r['strategy']} | {r['published']:,.0f} | {r['predicted']:,.0f} "
              f"| {r['ratio']:.2f} | {r['auto']} |")
    print('\nsources:\n' + '\n'.join(f"- {s}" for s in dict.fromkeys(p[1] for p in PUBLISHED)))
