"""
The token files: opened and checked as untrusted input, once per file and
per batch, and the batches train.py reads from them.
"""
import hashlib
import json
import os
import pickle

import numpy as np
import torch

from hetgpt.errors import die


class Batches:
    """data/<dataset>/{train,val}.bin: a flat uint16 token file per split.

    The sequences of the global batch at step k are a fixed function of
    (seed, k), whatever the world size, split or micro-batching: resume
    and uneven splits are exact because every rank agrees on the batch
    and takes its own slice.
    """

    def __init__(self, dataset, block_size, vocab_size, seed, device):
        """Opens and checks both splits' token files (open_tokens)."""
        self.paths = {s: os.path.join('data', dataset, f'{s}.bin')
                      for s in ('train', 'val')}
        self.tokens = {s: open_tokens(p, block_size, vocab_size, dataset)
                       for s, p in self.paths.items()}
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.seed = seed
        self.device = device

    def offsets(self, split, step, n):
        """The n offsets of step's global batch in split's file (step -1:
        a fixed set)."""
        which = 1
        if split == 'train':
            which = 0
        seed = [self.seed, step + 1, which]
        high = len(self.tokens[split]) - self.block_size
        return np.random.default_rng(seed).integers(0, high, size=n)

    def get(self, split, offsets):
        """(x, y): the windows of block_size + 1 tokens at offsets, on the
        device.

        Each id is checked below vocab_size (a change to the file that the
        start-up check's sampled cache missed: one line, before a step
        uses it).
        """
        tokens, T = self.tokens[split], self.block_size
        windows = np.stack([tokens[i:i + T + 1] for i in offsets])
        check_batch(self.paths[split], windows, offsets, self.vocab_size)
        x = torch.from_numpy(windows[:, :-1].astype(np.int64))
        y = torch.from_numpy(windows[:, 1:].astype(np.int64))
        if self.device.startswith('cuda'):
            # from pinned memory the copy is asynchronous
            return tuple(t.pin_memory().to(self.device, non_blocking=True)
                         for t in (x, y))
        return x, y


# A flat uint16 token file, checked as untrusted input
class PlainUnpickler(pickle.Unpickler):
    """Unpickles dicts, strings and numbers only: no code can run."""

    def find_class(self, module, name):
        """Refuses every class or function a pickle names."""
        raise pickle.UnpicklingError(f"it refers to {module}.{name}")


def dataset_vocab(folder):
    """The folder's meta.pkl as a dict; None where there is none.

    nanoGPT's prepare scripts of other tokenizers (shakespeare_char: 65
    characters) leave meta.pkl = {'vocab_size', 'stoi', 'itos'} beside the
    tokens.
    """
    path = os.path.join(folder, 'meta.pkl')
    if not os.path.exists(path):
        return None
    try:
        with open(path, 'rb') as f:
            meta = PlainUnpickler(f).load()
    except Exception as e:
        # damaged, or a pickle that would import something
        die(f"cannot read {path} ({type(e).__name__}: {e}); it should be "
            f"a nanoGPT meta.pkl (a dict with vocab_size): prepare the "
            f"data again or remove it")
    vocab = None
    if isinstance(meta, dict):
        vocab = meta.get('vocab_size')
    if type(vocab) is not int or vocab < 1:
        die(f"{path} has no positive int vocab_size (got {vocab!r}): "
            f"prepare the data again")
    return meta


def open_tokens(path, block_size, vocab_size, dataset):
    """The token file at path as a read-only uint16 memmap, checked: it
    exists, is whole, holds more than block_size + 1 tokens, each below
    vocab_size."""
    if not os.path.exists(path):
        die(f"no {path}: run python data/prepare.py --dataset {dataset} "
            f"(or --input FILES --name {dataset})")
    if not os.path.isfile(path):
        what = 'not regular'
        if os.path.isdir(path):
            what = 'a directory'
        die(f"{path} is not a file ({what}): move it away and run "
            f"python data/prepare.py for {dataset} again")
    if os.path.getsize(path) % 2:
        die(f"{path} has an odd number of bytes: it is truncated or not "
            f"uint16; run data/prepare.py again")
    try:
        if os.path.getsize(path):
            tokens = np.memmap(path, dtype=np.uint16, mode='r')
        else:
            tokens = np.zeros(0, np.uint16)
        if len(tokens) <= block_size + 1:
            die(f"{path} has {len(tokens)} tokens, fewer than "
                f"block_size+1={block_size + 1}; lower block_size or "
                f"prepare more data")
        top = max_token(path, tokens)
    except OSError as e:  # unreadable (permissions, an I/O error)
        die(f"cannot read {path} ({e.strerror or e}); check its "
            f"permissions or prepare it again")
    if top >= vocab_size:
        die(f"{path} holds token id {top}, not below "
            f"vocab_size={vocab_size}: wrong tokenizer or dtype, or raise "
            f"vocab_size")
    return tokens


# Every token id of a file below vocab_size, checked once (chunked,
# vectorised) and the file's largest id cached next to it, keyed by its
# size, modification time and content: a blake2b of SAMPLES blocks of
# SAMPLE_BYTES, the first, the last and the rest evenly spaced between (the
# whole file when they cover it), about 4 MB read whatever the file's size.
# The content key catches a file copied over another of the same size with
# its times kept (cp -p, rsync -t); a change that falls between the blocks
# is what check_batch meets, before a step uses it.
SAMPLES, SAMPLE_BYTES = 66, 1 << 16


def content_key(path, size):
    """The hex blake2b of the file's size and its SAMPLES blocks (the
    whole file when they cover it)."""
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, 'rb') as f:
        if size <= SAMPLES * SAMPLE_BYTES:
            for block in iter(lambda: f.read(1 << 20), b''):
                h.update(block)
        else:
            for i in range(SAMPLES):
                f.seek(i * (size - SAMPLE_BYTES) // (SAMPLES - 1))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def max_token(path, tokens, chunk=1 << 26):
    """The largest token id of the file at path (tokens: its contents),
    from its cache path.max.json when that matches the file, else counted
    and cached."""
    st = os.stat(path)
    key = {'size': st.st_size, 'mtime_ns': st.st_mtime_ns,
           'blake2b': content_key(path, st.st_size)}
    cache = path + '.max.json'
    try:
        with open(cache) as f:
            cached = json.load(f)
        if isinstance(cached, dict):
            if {k: cached.get(k) for k in key} == key:
                return int(cached['max'])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    top = max((int(tokens[i:i + chunk].max())
               for i in range(0, len(tokens), chunk)), default=0)
    # a read-only data directory just means checking again next time
    try:
        with open(cache + f'.{os.getpid()}', 'w') as f:
            json.dump({**key, 'max': top}, f)
        os.replace(cache + f'.{os.getpid()}', cache)
    except OSError:
        pass
    return top


def check_batch(path, windows, offsets, vocab_size):
    """windows, once each id is seen below vocab_size.

    A batch as train.py takes it: row r holds the tokens of the file at
    path from offsets[r] on. One max() per batch; only a bad id is looked
    for, and named with its offset in tokens. (Under torchrun each rank
    checks its own rows; die prints the line once.)
    """
    if windows.size and int(windows.max()) >= vocab_size:
        rows, cols = np.nonzero(windows >= vocab_size)
        at = np.asarray(offsets, dtype=np.int64)[rows] + cols
        first = int(np.argmin(at))
        bad = int(windows[rows[first], cols[first]])
        die(f"{path} holds token id {bad} at offset {int(at[first])}, "
            f"not below vocab_size={vocab_size}: the file changed where "
            f"its cached check ({path}.max.json) samples none of it; no "
            f"step used it: delete that file to check it whole at "
            f"start-up, or prepare the data again")
    return windows
