"""
Sample from a trained model, printing tokens as they come; or, with --export_hf=DIR, write the
model as a transformers GPT-2 directory instead.
  python sample.py --out_dir=out/tiny --start="def main(" --num_samples=3
  python sample.py --init_from=gpt2 --start=FILE:prompt.txt --max_new_tokens=100
  python sample.py --out_dir=out/tiny --export_hf=hf/tiny
"""
import codecs
import json
import os
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp

from ckpt import checkpoints
import hf
from configurator import configure, die, is_knob
from model import GPT, config_from

# -----------------------------------------------------------------------------
init_from = 'resume'   # 'resume' (the latest checkpoint in out_dir), a checkpoint directory, a
                       # transformers GPT-2 directory, or 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl'
out_dir = 'out/tiny'
start = '\n'           # the prompt; 'FILE:path' reads it from a file; '' starts from <|endoftext|>
num_samples = 3
max_new_tokens = 200
temperature = 0.8      # 0 is greedy, 1 samples the model's own distribution, above 1 is wilder
top_k = 200            # sample among the top_k most likely tokens only; 0 keeps them all
seed = 1337
device = 'cpu'
use_kv_cache = True
export_hf = ''         # a directory: write the model there as a transformers GPT-2, don't sample
# -----------------------------------------------------------------------------
globals().update(configure({k: v for k, v in globals().items() if is_knob(k, v)}))
# DCP warns that it loads in a single process without a process group: that is the intent here.
warnings.filterwarnings('ignore', message='torch.distributed is disabled')


def latest_checkpoint(path):
    # A checkpoint directory itself, or the newest complete one in a run's out_dir.
    if os.path.isfile(os.path.join(path, 'hetgpt.json')):
        return path
    return (checkpoints(path) or [None])[-1]


def load_checkpoint(ckpt):
    args = json.load(open(os.path.join(ckpt, 'hetgpt.json')))['model_args']
    # Our vocab is padded from GPT-2's 50257 to 50304 for faster matmuls. The extra rows are never
    # targets, so drop them: sampling can't pick an id the tokenizer can't decode, and the HF
    # export gets GPT-2's own shape.
    n_vocab = 50257 if args['vocab_size'] == 50304 else args['vocab_size']
    model = GPT(config_from({**args, 'vocab_size': n_vocab}))
    sd = model.state_dict()
    del sd['lm_head.weight']  # tied to wte: loading one is loading both
    wte = sd['transformer.wte.weight'] = torch.empty(args['vocab_size'], args['n_embd'])
    dcp.load({'model': sd}, checkpoint_id=ckpt)  # one process, in place, no process group needed
    with torch.no_grad():
        model.transformer.wte.weight.copy_(wte[:n_vocab])
    return model


# the prompt's file first: a typo should not wait for a big model to load
if start.startswith('FILE:') and not export_hf:
    try:
        start = open(start[5:], encoding='utf-8').read()
    except OSError as e:
        die(f"cannot read the prompt file '{start[5:]}' ({e.strerror})")

# the model
if init_from in ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl') or os.path.isfile(os.path.join(init_from, 'config.json')):
    # OpenAI's GPT-2 from the HF hub (or its cache), or a transformers directory like --export_hf's
    try:
        model = hf.from_pretrained(init_from)
    except Exception as e:  # offline with nothing cached, a broken directory, ...
        die(f"cannot load '{init_from}' with transformers ({type(e).__name__}: {str(e).splitlines()[0]})")
else:
    where = out_dir if init_from == 'resume' else init_from
    ckpt = latest_checkpoint(where)
    if ckpt is None:
        die(f"no checkpoint in {where}: train a model first (python train.py configs/gpt_tiny.py)")
    model = load_checkpoint(ckpt)
    print(f"loaded {ckpt}", file=sys.stderr)
model.eval().to(device)

if export_hf:
    hf.save_hf(model, export_hf)
    print(f"wrote {export_hf} (config.json, model.safetensors)")
    raise SystemExit

from data.prepare import gpt2_encoding
enc = gpt2_encoding()
ids = enc.encode(start, allowed_special={'<|endoftext|>'}) or [enc.eot_token]
if max(ids) >= model.config.vocab_size:  # a toy model with fewer tokens than GPT-2's
    die(f"the prompt has token id {max(ids)}, past this model's vocab_size {model.config.vocab_size}")
x = torch.tensor([ids], dtype=torch.long, device=device)

# Seeded here, after the model is built, so a seed gives the same text whatever the init path.
torch.manual_seed(seed)
for _ in range(num_samples):
    # One character may be split across tokens (GPT-2 works on bytes): an incremental decoder
    # holds an incomplete UTF-8 sequence until its last byte comes, and bytes that can never
    # make a character print as U+FFFD, as tiktoken's own decode does.
    utf8 = codecs.getincrementaldecoder('utf-8')(errors='replace')
    print(start, end='', flush=True)
    on_token = lambda t: print(utf8.decode(enc.decode_single_token_bytes(t[0].item())), end='', flush=True)
    model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None,
                   use_cache=use_kv_cache, on_token=on_token)
    print(utf8.decode(b'', final=True))
    print('---------------')
