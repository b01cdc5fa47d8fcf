"""
Sample from a trained model, printing tokens as they come; or, with --export_hf=DIR, write the
model as a transformers GPT-2 directory instead.
  python sample.py --out_dir=out/tiny --start="def main(" --num_samples=3
  python sample.py --init_from=gpt2 --start=FILE:prompt.txt --max_new_tokens=100
  python sample.py --out_dir=out/tiny --export_hf=hf/tiny
"""
import codecs
import os
import sys
import time

from hetgpt import knobs
from hetgpt.errors import die, oneline
from hetgpt.knobs import answer_help, configure, is_knob

# -----------------------------------------------------------------------------
init_from = 'resume'   # 'resume' (the latest checkpoint in out_dir), a checkpoint directory, a
                       # transformers GPT-2 directory, or gpt2, gpt2-medium, gpt2-large, gpt2-xl
out_dir = 'out/tiny'
start = '\n'           # the prompt; 'FILE:path' reads it from a file; '' starts from <|endoftext|>
num_samples = 3
max_new_tokens = 200
temperature = 0.8      # 0 is greedy, 1 samples the model's own distribution, above 1 is wilder
top_k = 200            # sample among the top_k most likely tokens only; 0 keeps them all
seed = 1337
device = 'auto'        # 'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', 'mps'
use_kv_cache = True
export_hf = ''         # a directory: write the model there as a transformers GPT-2, don't sample
# -----------------------------------------------------------------------------


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True,
             on_token=None, n_ids=None):
    # Appends max_new_tokens to idx (B, T). temperature 0 is greedy. on_token(tokens (B, 1)) is
    # called as each position is chosen, so callers can print as they come. n_ids: choose among
    # the first n_ids only (the ones the tokenizer can decode; a vocabulary may be padded).
    import torch
    import torch.nn.functional as F
    c, caches = model.config, None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if use_cache and idx.size(1) <= c.block_size:
                if caches is None:  # prefill: run the whole prompt once
                    caches = model.new_caches(idx.size(0))
                    logits, _ = model(idx, caches=caches, last_only=True)
                else:
                    logits, _ = model(idx[:, -1:], caches=caches, last_only=True)
            else:
                # Past block_size the positions of every kept token shift, so the cached
                # keys are stale: recompute the last block_size tokens, as without a cache.
                logits, _ = model(idx[:, -c.block_size:], last_only=True)
            logits = logits[:, -1, :n_ids]
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float('inf')
                idx_next = torch.multinomial(F.softmax(logits.float(), dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            if on_token is not None:
                on_token(idx_next)
    return idx


# The script: run as `python sample.py ...` (tests and benchmarks import generate above).
if __name__ == '__main__':
    answer_help(__file__)  # --help: the knobs above, read from this file
    globals().update(configure({k: v for k, v in globals().items() if is_knob(k, v)}, rules=knobs.SAMPLE))
    GPT2 = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')

    # The mistakes that need no model are reported before the slow imports: the prompt file,
    # where the model comes from, where it goes.
    if start.startswith('FILE:') and not export_hf:
        try:
            with open(start[5:], encoding='utf-8') as f:
                start = f.read()
        except OSError as e:
            die(f"cannot read the prompt file '{start[5:]}' ({e.strerror})")
        except UnicodeDecodeError as e:
            die(f"the prompt file '{start[5:]}' is not UTF-8 text (byte {e.start}); "
                f"save it as UTF-8")
    if init_from not in ('resume',) + GPT2 and not os.path.isdir(init_from):
        die(f"init_from={init_from!r} is not a directory: give resume (out_dir's latest "
            f"checkpoint), a checkpoint or transformers directory, or {', '.join(GPT2)}")
    if export_hf:
        if os.path.exists(export_hf) and not os.path.isdir(export_hf):
            die(f"export_hf={export_hf!r} is a file: give a directory (it gets config.json and "
                f"model.safetensors)")
        if (os.path.isdir(export_hf) and os.listdir(export_hf)
                and not os.path.isfile(os.path.join(export_hf, 'config.json'))):
            die(f"export_hf={export_hf!r} holds other files: give a new or empty directory")
        parent = os.path.abspath(export_hf)
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            die(f"export_hf={export_hf!r} cannot be written ({parent} is not a writable directory)")

    import torch

    from hetgpt.run import checkpoint, hf
    if export_hf:
        hf.need_transformers('--export_hf')  # before any work

    if device == 'auto':
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device.startswith('cuda') and not torch.cuda.is_available():
        die(f"device={device} but this torch sees no CUDA device; use --device=cpu")
    if device.startswith('cuda:') and int(device[5:]) >= torch.cuda.device_count():
        die(f"device={device} but this host has {torch.cuda.device_count()} CUDA devices")
    if device == 'mps' and not torch.backends.mps.is_available():
        die("device=mps but this torch sees no MPS device; use --device=cpu")

    # the model, and the data set it was trained on (for nanoGPT's character-level meta.pkl)
    dataset = None
    if init_from in GPT2 or os.path.isfile(os.path.join(init_from, 'config.json')):
        # OpenAI's GPT-2 from the HF hub (or its cache), or a transformers directory (--export_hf)
        model = hf.from_pretrained(init_from)
    else:
        where = out_dir if init_from == 'resume' else init_from
        path = checkpoint.latest(where)
        if path is None:
            die(f"no checkpoint in {where}: train a model first "
                f"(python train.py configs/gpt_tiny.py)")
        began = time.time()
        model = checkpoint.load_model(path)
        print(f"loaded {path} ({checkpoint.size(path, began)})", file=sys.stderr)
        dataset = (checkpoint.read_meta(path).get('config') or {}).get('dataset')
    model.eval().to(device)

    if export_hf:
        try:
            written, no_tokenizer = hf.save_hf(model, export_hf)
        except OSError as e:  # a full disk, a directory that went away
            die(f"cannot write {export_hf} ({oneline(e)})")
        why = f"; weights only, no tokenizer: {no_tokenizer}" if no_tokenizer else ""
        print(f"wrote {export_hf} ({', '.join(written)}{why})")
        raise SystemExit

    # The codec: nanoGPT's characters where the data set has its meta.pkl, else GPT-2's BPE
    from hetgpt.data import corpus
    chars = isinstance(dataset, str) and corpus.dataset_vocab(os.path.join('data', dataset))
    if chars and 'stoi' in chars:
        stoi, itos = chars['stoi'], chars.get('itos')
        if not (isinstance(stoi, dict) and isinstance(itos, dict)
                and all(isinstance(c, str) and isinstance(i, int) for c, i in stoi.items())
                and all(isinstance(itos.get(i), str) for i in range(len(itos)))):
            die(f"data/{dataset}/meta.pkl has no stoi/itos maps of characters and ids: prepare "
                f"the data again")
        unknown = sorted(set(start) - set(stoi))
        if unknown:
            die(f"the prompt has characters not in data/{dataset}/meta.pkl: "
                f"{''.join(unknown)!r}; use only the data set's characters")
        ids, n_ids = [stoi[c] for c in start] or [stoi.get('\n', 0)], len(itos)
        token_bytes = lambda i: itos[i].encode('utf-8')
    else:
        from hetgpt.data.tokenizer import gpt2_encoding
        try:
            enc = gpt2_encoding()
        except ValueError as e:  # a BPE file of the repository altered
            die(str(e))
        ids = enc.encode(start, allowed_special={'<|endoftext|>'}) or [enc.eot_token]
        n_ids, token_bytes = enc.n_vocab, enc.decode_single_token_bytes
    if max(ids) >= model.config.vocab_size:  # a toy model with fewer tokens than GPT-2's
        die(f"the prompt has token id {max(ids)}, past this model's vocab_size "
            f"{model.config.vocab_size}")
    knobs.check_sample(max_new_tokens, model.config.block_size, len(ids))  # (past the block)
    x = torch.tensor([ids], dtype=torch.long, device=device)

    # Seeded here, after the model is built, so a seed gives the same text whatever the init path.
    torch.manual_seed(seed)
    for _ in range(num_samples):
        # One character may be split across tokens (GPT-2 works on bytes): an incremental decoder
        # holds an incomplete UTF-8 sequence until its last byte comes, and bytes that can never
        # make a character print as U+FFFD, as tiktoken's own decode does.
        utf8 = codecs.getincrementaldecoder('utf-8')(errors='replace')
        print(start, end='', flush=True)
        on_token = lambda t: print(utf8.decode(token_bytes(t[0].item())), end='', flush=True)
        generate(model, x, max_new_tokens, temperature=temperature, top_k=top_k or None,
                 use_cache=use_kv_cache, on_token=on_token, n_ids=n_ids)
        print(utf8.decode(b'', final=True))
        print('---------------')
