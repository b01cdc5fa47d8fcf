"""
Checkpoints, for train.py, sample.py and the tests: writing them so that
none is ever half there, finding the complete ones, and reading them
safely (into a new model, or resuming a run).

A checkpoint is out_dir/ckpt_<iter:08d>/, written by
torch.distributed.checkpoint (DCP) under a .tmp name and renamed when
complete, plus hetgpt.json (iter, model shape, config). DCP reads tensors
with torch.load(weights_only=True), but its .metadata file with plain
pickle.load and every other entry (an optimizer's lr, betas, ...) with
torch.load(weights_only=False): either would run whatever a tampered file
asks for, and it opens whatever file the .metadata names. Importing this
module restricts the metadata's unpickling to the record types DCP writes
(its own dataclasses, torch sizes, dtypes and memory formats); read() is
the one way in for the rest: plain values only, from plain files in the
checkpoint's own directory.
"""
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import sys
import time
import types
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.filesystem as dcp_filesystem
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (get_state_dict,
                                                     set_state_dict)

from hetgpt import knobs
from hetgpt.errors import die, oneline
from model import GPT, config_from

# Every global DCP's metadata pickle names, exactly: a name is never
# walked through attributes ('os.system' reached from an allowed module),
# and nothing else in these modules is reachable.
ALLOWED = {
    ('torch', 'Size'), ('torch.serialization', '_get_layout'),
    ('collections', 'OrderedDict'), ('pathlib', 'PosixPath'),
    ('pathlib', 'WindowsPath'),
    ('torch.distributed.checkpoint.filesystem', '_StorageInfo')} | {
    ('torch.distributed.checkpoint.metadata', name) for name in (
        'Metadata', 'StorageMeta', 'MetadataIndex', 'TensorProperties',
        'ChunkStorageMetadata', 'TensorStorageMetadata',
        'BytesStorageMetadata', '_MEM_FORMAT_ENCODING')}


class MetadataUnpickler(pickle.Unpickler):
    """The unpickler of DCP's .metadata: the globals in ALLOWED only.

    torch's own weights_only unpickler would be the natural choice, but it
    does not read pickle protocol 4 (FRAME, STACK_GLOBAL), which is what
    DCP writes.
    """

    def find_class(self, module, name):
        """The global module.name when allowed; else raises
        UnpicklingError."""
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        # a dtype or memory format, by plain name
        if module == 'torch' and name.isidentifier():
            found = getattr(torch, name, None)
            if isinstance(found, (torch.dtype, torch.memory_format)):
                return found
        raise pickle.UnpicklingError(
            f"{module}.{name} is not allowed in a checkpoint's metadata")


# DCP's filesystem module calls pickle.load on the metadata stream: give
# it ours, the rest as is.
dcp_filesystem.pickle = types.SimpleNamespace(
    **{**vars(pickle), 'load': lambda f: MetadataUnpickler(f).load()})
# When the metadata cannot be read, DCP logs a traceback (on the root
# logger) before it raises; the callers report the damaged checkpoint
# themselves, in one line.
logging.getLogger().addFilter(
    lambda record: 'metadata is not found' not in record.getMessage())


def plain(x):
    """Whether x is None, bool, int, float, str, or lists, tuples and
    dicts of those: all an optimizer's param_groups hold (lr, betas, eps,
    amsgrad, foreach, fused, ..., its params' names)."""
    if type(x) in (list, tuple):
        return all(map(plain, x))
    if type(x) is dict:
        return all(plain(k) and plain(v) for k, v in x.items())
    return x is None or type(x) in (bool, int, float, str)


class Planner(dcp.DefaultLoadPlanner):
    """DCP's load planner, with non-tensor entries read safely.

    DCP's planner reads each non-tensor entry with
    torch.load(weights_only=False), a full pickle: a tampered lr runs a
    command. weights_only=True (hetgpt adds it no safe globals) calls only
    torch's tensor rebuilders and builds only containers, scalars and
    torch's types (tensors, sizes, dtypes, devices): no code, but more
    than param_groups hold, so plain() checks. A tensor's slot takes no
    bytes: its weight would stay as initialised, silently.
    """

    def load_bytes(self, read_item, value):
        """Sets a non-tensor entry from its bytes (value, a stream): plain
        values only, else raises ValueError."""
        fqn = read_item.dest_index.fqn
        if isinstance(self.state_dict.get(fqn), torch.Tensor):
            raise ValueError(f"{fqn} is stored as bytes, not as a tensor")
        try:
            value = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            # (whose message advises weights_only=False)
            found = re.search(r'Unsupported global: GLOBAL (\S+)', str(e))
            what = 'a pickle'
            if found:
                what = found[1]
            raise ValueError(f"{fqn} holds {what}, not plain "
                             f"values") from None
        if not plain(value):
            raise ValueError(f"{fqn} holds a {type(value).__name__}, not "
                             f"plain values")
        set_element(self.original_state_dict, self.mappings[fqn], value)


class Reader(dcp.FileSystemReader):
    """DCP's reader, confined to the checkpoint's own files.

    DCP opens whatever path the .metadata names (an absolute one,
    ../another_run/__0_0.distcp) and pipes it through the stream
    transforms it names: read only files directly in the checkpoint's
    directory (symlinks resolved), as they are; hetgpt writes no
    transforms.
    """

    def set_up_storage_reader(self, metadata, *args, **kwargs):
        """DCP's, once every file metadata names is checked; raises
        ValueError for one outside the checkpoint or with transforms."""
        home = os.path.realpath(self.path)
        for info in metadata.storage_data.values():
            name = getattr(info, 'relative_path', None)
            if not (type(info) is dcp_filesystem._StorageInfo
                    and type(name) is str
                    and name == os.path.basename(name)
                    and name not in ('', '.', '..')):
                raise ValueError(f"its .metadata names the file {name!r}, "
                                 f"outside the checkpoint")
            found = os.path.realpath(os.path.join(home, name))
            if os.path.dirname(found) != home:
                raise ValueError(f"its {name} is a link to a file outside "
                                 f"the checkpoint")
            # (torch >= 2.12)
            transforms = getattr(info, 'transform_descriptors', None)
            if transforms:
                raise ValueError(f"its .metadata asks for transforms "
                                 f"{transforms}")
        super().set_up_storage_reader(metadata, *args, **kwargs)


def read(path, state_dict):
    """Reads checkpoint path into state_dict ({'model': ..., 'optim':
    ...}, or a part of it): every read of a checkpoint's shards goes
    through here. Raises, for the callers to report."""
    # DCP warns it loads in one process: that is the intent
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore',
                                message='torch.distributed is disabled')
        dcp.load(state_dict, storage_reader=Reader(path),
                 planner=Planner())


def first_failure(e):
    """The first rank's own exception, from DCP's, which holds each
    rank's; e itself if it is not DCP's."""
    if isinstance(e, CheckpointException) and e.failures:
        return next(iter(e.failures.values()))[0]
    return e


def why(e):
    """One line for an error of DCP's: the first rank's own exception,
    not the wrapper's traceback."""
    return oneline(first_failure(e))


def lost_peer(e):
    """Whether e is a collective that failed because another rank is gone
    (killed, out of memory, its machine lost), rather than this rank's
    own trouble."""
    e = first_failure(e)
    if isinstance(e, dist.DistError):
        return True
    return bool(re.search(r'(closed|reset) by peer', str(e)))


def checkpoints(out_dir):
    """The complete checkpoints in out_dir, oldest first; a .tmp one is
    being written or abandoned."""
    if not os.path.isdir(out_dir):
        return []
    found = [d for d in os.listdir(out_dir)
             if re.fullmatch(r'ckpt_\d{8}', d)]
    return sorted(os.path.join(out_dir, d) for d in found)


# A checkpoint's health (hetgpt/run/optim.py, BadSteps): it is known good
# once the step that starts from its weights has had a finite loss and
# gradients on every rank, said by a file beside DCP's (whose reader opens
# only the files its .metadata names); known bad when the bad steps that
# stop a run started from its weights, and then set aside under a name
# checkpoints() does not match (resume and sample.py pass it by), nothing
# deleted.
GOOD = 'good.json'


def confirm(path, by_iter):
    """Marks checkpoint path known good (on rank 0): the step from its
    weights to iter by_iter completed. Atomic; a failure to write it (a
    full disk) leaves the checkpoint as it was, unmarked."""
    tmp = os.path.join(path, GOOD + '.tmp')
    try:
        with open(tmp, 'w') as f:
            json.dump({'checked_by_iter': by_iter}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(path, GOOD))
    except OSError:
        pass


def is_good(path):
    """Whether checkpoint path is marked known good (confirm)."""
    return os.path.isfile(os.path.join(path, GOOD))


def newest_good(out_dir):
    """The newest complete checkpoint in out_dir marked known good, or
    None."""
    return next((c for c in reversed(checkpoints(out_dir)) if is_good(c)),
                None)


def set_aside(path):
    """Renames checkpoint path to path.bad (.bad.2, ... if taken): out of
    checkpoints()'s sight, kept. Returns the new name (None: it could not
    be renamed)."""
    for n in range(1, 1000):
        bad = path + ('.bad' if n == 1 else f'.bad.{n}')
        if os.path.lexists(bad):
            continue
        try:
            os.rename(path, bad)
        except OSError:
            return None
        return bad
    return None


def save(out_dir, step, model, optimizer, meta, keep_last, outer=None,
         keep=None):
    """Writes the checkpoint of step, from every rank.

    Every rank writes its shard (DCP: loads under any strategy and world
    size) into ckpt_<step>.tmp; rank 0 adds hetgpt.json ({iter, **meta})
    and renames it once complete, then drops old ones beyond keep_last,
    but never keep (the newest checkpoint known good: the one just
    written is not known good yet). Returns the checkpoint's path, and on
    rank 0 its size and seconds (size). outer: local steps' entries
    (hetgpt/run/local_steps.py: each node's own state, the outer state).
    """
    start = time.time()
    final = os.path.join(out_dir, f'ckpt_{step:08d}')
    tmp, master = final + '.tmp', dist.get_rank() == 0
    if master:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        state = {'model': model_sd, 'optim': optim_sd}
        if outer:
            state = outer.entries(state)
        dcp.save(state, checkpoint_id=tmp)
        if master:
            with open(os.path.join(tmp, 'hetgpt.json'), 'w') as f:
                json.dump({'iter': step, **meta}, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
    except (Exception, CheckpointException) as e:
        # a full disk, a quota: the last one is intact
        if lost_peer(e):
            # not this disk's fault: hetgpt.run.process_group's
            # excepthook says so, in one line
            raise first_failure(e) from None
        last = checkpoints(out_dir)
        if last:
            kept = f"the last complete one, {last[-1]}, is intact"
        else:
            kept = "no checkpoint was lost"
        die(f"could not write checkpoint {tmp} ({why(e)}); {kept}: free "
            f"space, then init_from=resume")
    if master:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        # the one just written stays, and the newest known good
        others = [c for c in checkpoints(out_dir) if c != final]
        kept = keep and os.path.abspath(keep)
        for old in others[:len(others) - (keep_last - 1)]:
            if os.path.abspath(old) != kept:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    if not master:
        return final, None
    return final, size(final, start)  # (rank 0 says it)


def size(path, since):
    """'1.23 GB in 4.5 s': checkpoint path's files as this machine has
    them, and the seconds since `since` (time.time()) that its save or
    load took."""
    n = sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    if n >= 1e9:
        amount = f"{n / 1e9:.2f} GB"
    else:
        amount = f"{n / 1e6:.1f} MB"
    return f"{amount} in {time.time() - since:.1f} s"


def latest(path):
    """A checkpoint directory itself, or the newest complete one in a
    run's out_dir; None if none."""
    marks = ('hetgpt.json', '.metadata')
    if any(os.path.isfile(os.path.join(path, f)) for f in marks):
        return path
    try:
        return (checkpoints(path) or [None])[-1]
    except OSError as e:
        die(f"cannot read {path} ({e.strerror})")


def read_meta(path):
    """Checkpoint path's hetgpt.json, checked: a damaged or tampered file
    must not become a traceback, nor a model of another shape. Raises,
    for the loaders to report."""
    with open(os.path.join(path, 'hetgpt.json')) as f:
        meta = json.load(f)
    if not (isinstance(meta, dict) and type(meta.get('iter')) is int
            and isinstance(meta.get('model_args'), dict)):
        raise ValueError("hetgpt.json holds no int iter and model_args "
                         "object")
    if not isinstance(meta.get('config', {}), dict):
        raise ValueError("hetgpt.json's config is not an object")
    # sample.py may read a renamed copy
    name = os.path.basename(os.path.normpath(path))
    own = f"ckpt_{meta['iter']:08d}"
    if re.fullmatch(r'ckpt_\d{8}', name) and name != own:
        raise ValueError(f"hetgpt.json has iter {meta['iter']}, not the "
                         f"directory's")
    # (the check of a config's shape too)
    bad = knobs.fault(meta['model_args'])
    if bad:
        raise ValueError(f"model_args {bad}")
    return meta


def _dims(shape):
    """'768×2304': a shape, said."""
    return '×'.join(map(str, shape))


def mismatch(path, model_sd, meta):
    """Refuses checkpoint path when its weights are not model_sd's.

    Its weights' names and shapes come from its .metadata. In one line:
    as written by another model when model.py is not the one that wrote
    it (the digest its fingerprint recorded), else as damaged. Raises,
    for the callers. (An entry that is not a tensor there is the
    reader's to refuse: Planner.load_bytes.)
    """
    metadata = Reader(path).read_metadata().state_dict_metadata
    saved = {k[len('model.'):]: getattr(m, 'size', None)
             for k, m in metadata.items() if k.startswith('model.')}
    here = {k: v.shape for k, v in model_sd.items()
            if isinstance(v, torch.Tensor)}
    found = [f"{k} {_dims(saved[k])} there, {_dims(v)} here"
             for k, v in here.items()
             if saved.get(k) is not None and tuple(saved[k]) != tuple(v)]
    found += [f"{k} only here" for k in here if k not in saved]
    found += [f"{k} only there" for k in saved if k not in here]
    if not found:
        return
    diff = ', '.join(found[:2])
    if len(found) > 2:
        diff += f"; {len(found) - 2} more"
    code = None
    if isinstance(meta.get('fingerprint'), dict):
        code = meta['fingerprint'].get('code')
    with open(sys.modules[GPT.__module__].__file__, 'rb') as f:
        mine = hashlib.sha256(f.read()).hexdigest()[:16]
    if isinstance(code, dict) and code.get('model.py') not in (None, mine):
        die(f"checkpoint {path} was written by another model.py ({diff}); "
            f"use the code that wrote it, or another out_dir")
    raise ValueError(f"its weights are not its model_args' ({diff})")


def damaged(path, e):
    """Dies: checkpoint path is damaged (e: what reading it raised)."""
    die(f"checkpoint {path} is damaged ({why(e)}); move it away to use the "
        f"one before it, or use another out_dir")


def load_model(path, trim_vocab=True):
    """The model of checkpoint path, built as hetgpt.json says, for
    sampling, export and tests.

    A vocab padded from GPT-2's 50257 to 50304 (faster matmuls) loses its
    extra rows (unless trim_vocab=False, the checkpoint as saved): they
    are never targets, sampling can't pick an id the tokenizer can't
    decode, and HF gets its shape.
    """
    try:
        meta = read_meta(path)
        args = meta['model_args']
        n_vocab = args['vocab_size']
        if trim_vocab and n_vocab == 50304:
            n_vocab = 50257
        model = GPT(config_from({**args, 'vocab_size': n_vocab}))
        sd = model.state_dict()
        # tied to wte: loading one is loading both
        del sd['lm_head.weight']
        wte = torch.empty(args['vocab_size'], args['n_embd'])
        sd['transformer.wte.weight'] = wte
        # (saved, though tied)
        mismatch(path, {**sd, 'lm_head.weight': wte}, meta)
        read(path, {'model': sd})
    except (Exception, CheckpointException) as e:
        # (DCP's exception is a BaseException)
        damaged(path, e)
    with torch.no_grad():
        model.transformer.wte.weight.copy_(wte[:n_vocab])
    return model


def load(path, model, optimizer, model_args, outer=None):
    """Loads checkpoint path into model and optimizer (wrapped or not).

    Returns its hetgpt.json (checked), and its size and seconds (size).
    outer: local steps' entries, as save wrote them.
    """
    start = time.time()
    try:
        meta = read_meta(path)
        saved = meta['model_args']
        if saved != vars(model_args):
            diff = ', '.join(f"{k}={saved.get(k)} here {v}"
                             for k, v in vars(model_args).items()
                             if saved.get(k) != v)
            die(f"{path} holds another model ({diff}); use its config or "
                f"another out_dir")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        mismatch(path, model_sd, meta)
        state, stored = {'model': model_sd, 'optim': optim_sd}, None
        if outer:  # (the checkpoint's top-level keys: what it holds)
            metadata = Reader(path).read_metadata().state_dict_metadata
            stored = {k.split('.')[0] for k in metadata}
            state = outer.entries(state, stored)
        read(path, state)
    except (Exception, CheckpointException) as e:
        # (die's SystemExit is neither)
        damaged(path, e)
    set_state_dict(model, optimizer, model_state_dict=model_sd,
                   optim_state_dict=optim_sd)
    if outer:
        outer.loaded(stored)
    return meta, size(path, start)
