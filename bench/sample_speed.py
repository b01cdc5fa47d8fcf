"""
Generation speed with and without the KV cache, random init, float32, greedy, batch 1.
  python bench/sample_speed.py                      # gpt_tiny's shape, then GPT-2 124M's
  python bench/sample_speed.py --big_new_tokens=500  # 124M for 500 tokens too: ~10 min on 2 cores
Prints markdown rows for bench/RESULTS.md. gpt_tiny's shape as measured has block_size 256 (the
config's is 128 since 2026-12-06), so 500 new tokens slide
the window past it: from there on the cache can't be used (learned positions shift) and both paths
recompute the last block_size tokens each step.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hetgpt.knobs import configure, is_knob
from model import GPT, GPTConfig
from sample import generate

# -----------------------------------------------------------------------------
max_new_tokens = 500
prompt_len = 1
big = True             # also GPT-2 124M (12 layers, 768 wide, block 1024)
big_new_tokens = 200   # 124M without the cache recomputes the whole context per token: 500 takes
                       # ~10 min on 2 cores, 200 about 2
repeats = 3            # best of, both ways: a shared machine's other work only ever slows a run
big_repeats = 1
device = 'cpu'
seed = 1337
# -----------------------------------------------------------------------------
globals().update(configure({k: v for k, v in globals().items() if is_knob(k, v)}))

shapes = [('gpt_tiny (4L, 128, block 256)', GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256),
           max_new_tokens, repeats)]
if big:
    shapes.append(('GPT-2 124M (12L, 768, block 1024)', GPTConfig(), big_new_tokens, big_repeats))

print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {device}, prompt {prompt_len} token(s), "
      f"greedy, float32, vocab 50304", file=sys.stderr)
print("| model | new tokens | no cache tok/s | KV cache tok/s | ratio |")
print("|---|---|---|---|---|")
for name, config, new_tokens, n in shapes:
    torch.manual_seed(seed)
    model = GPT(config).eval().to(device)
    prompt = torch.randint(0, 50257, (1, prompt_len), device=device)
    generate(model, prompt, 8, temperature=0)  # warm up the allocator and kernels
    rates, outs = {False: 0.0, True: 0.0}, {}
    for _ in range(n):
        for use_cache in (False, True):  # interleaved, so a burst of other load hits both alike
            t0 = time.perf_counter()
            outs[use_cache] = generate(model, prompt, new_tokens, temperature=0, use_cache=use_cache)
            rates[use_cache] = max(rates[use_cache], new_tokens / (time.perf_counter() - t0))
    # Same tokens both ways, or the speed-up would be meaningless. (Random init gives near-equal
    # logits, so a rounding difference could flip one argmax: reported, not fatal.)
    same = torch.equal(outs[False], outs[True])
    print(f"| {name} | {new_tokens} | {rates[False]:.1f} | {rates[True]:.1f} | "
          f"{rates[True] / rates[False]:.1f}x |" + ("" if same else " (outputs differ)"), flush=True)
