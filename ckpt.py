"""
Checkpoints, for train.py and sample.py: writing them so that none is ever half there, finding the
complete ones, and reading them safely.

A checkpoint is out_dir/ckpt_<iter:08d>/, written by torch.distributed.checkpoint (DCP) under a
.tmp name and renamed when complete, plus hetgpt.json (iter, model shape, config). DCP reads tensors
with torch.load(weights_only=True) but its .metadata file with plain pickle.load, which would run
whatever a tampered file asks for. Importing this module restricts that unpickling to the record
types DCP writes (its own dataclasses, torch sizes, dtypes and memory formats).
"""
import json
import logging
import os
import pickle
import re
import shutil
import types

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.filesystem as dcp_filesystem
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from configurator import die, oneline

# Every global DCP's metadata pickle names, exactly: a name is never walked through attributes
# ('os.system' reached from an allowed module), and nothing else in these modules is reachable.
ALLOWED = {('torch', 'Size'), ('torch.serialization', '_get_layout'), ('collections', 'OrderedDict'),
           ('pathlib', 'PosixPath'), ('pathlib', 'WindowsPath'),
           ('torch.distributed.checkpoint.filesystem', '_StorageInfo')} | {
    ('torch.distributed.checkpoint.metadata', name) for name in (
        'Metadata', 'StorageMeta', 'MetadataIndex', 'TensorProperties', 'ChunkStorageMetadata',
        'TensorStorageMetadata', 'BytesStorageMetadata', '_MEM_FORMAT_ENCODING')}


class MetadataUnpickler(pickle.Unpickler):
    # torch's own weights_only unpickler would be the natural choice, but it does not read pickle
    # protocol 4 (FRAME, STACK_GLOBAL), which is what DCP writes.

    def find_class(self, module, name):
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == 'torch' and name.isidentifier():  # a dtype or memory format, by plain name
            found = getattr(torch, name, None)
            if isinstance(found, (torch.dtype, torch.memory_format)):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")


# DCP's filesystem module calls pickle.load on the metadata stream: give it ours, the rest unchanged.
dcp_filesystem.pickle = types.SimpleNamespace(**{**vars(pickle), 'load': lambda f: MetadataUnpickler(f).load()})
# When the metadata cannot be read, DCP logs a traceback (on the root logger) before it raises; the
# callers report the damaged checkpoint themselves, in one line.
logging.getLogger().addFilter(lambda record: 'metadata is not found' not in record.getMessage())


def why(e):
    # One line for an error of DCP's: the first rank's own exception, not the wrapper's traceback.
    if isinstance(e, CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]
    return oneline(e)


def checkpoints(out_dir):
    # The complete checkpoints in out_dir, oldest first; a .tmp one is being written or was abandoned.
    if not os.path.isdir(out_dir):
        return []
    return sorted(os.path.join(out_dir, d) for d in os.listdir(out_dir) if re.fullmatch(r'ckpt_\d{8}', d))


def save(out_dir, step, model, optimizer, meta, keep_last):
    # Every rank writes its shard (DCP: loads under any strategy and world size) into ckpt_<step>.tmp;
    # rank 0 adds hetgpt.json ({iter, **meta}) and renames it once complete, then drops old ones.
    final = os.path.join(out_dir, f'ckpt_{step:08d}')
    tmp, master = final + '.tmp', dist.get_rank() == 0
    if master:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp.save({'model': model_sd, 'optim': optim_sd}, checkpoint_id=tmp)
        if master:
            with open(os.path.join(tmp, 'hetgpt.json'), 'w') as f:
                json.dump({'iter': step, **meta}, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
    except (Exception, CheckpointException) as e:  # a full disk, a quota: the last complete one is still there
        last = checkpoints(out_dir)
        die(f"could not write checkpoint {tmp} ({why(e)}); "
            f"{'the last complete one, ' + last[-1] + ', is intact' if last else 'no checkpoint was lost'}: "
            f"free space, then init_from=resume")
    if master:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        others = [c for c in checkpoints(out_dir) if c != final]  # the one just written stays
        for old in others[:len(others) - (keep_last - 1)]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load(path, model, optimizer, model_args):
    # Loads path into model and optimizer (wrapped or not) and returns its iteration.
    try:
        meta = json.load(open(os.path.join(path, 'hetgpt.json')))
        if not (isinstance(meta.get('model_args'), dict) and type(meta.get('iter')) is int
                and f"ckpt_{meta['iter']:08d}" == os.path.basename(path)):
            raise ValueError("hetgpt.json has no int iter matching the directory or no model_args")
        if meta['model_args'] != vars(model_args):
            diff = [f"{k}={meta['model_args'].get(k)} here {v}" for k, v in vars(model_args).items() if meta['model_args'].get(k) != v]
            die(f"{path} holds another model ({', '.join(diff)}); use its config or another out_dir")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.load({'model': model_sd, 'optim': optim_sd}, checkpoint_id=path)
    except (Exception, CheckpointException) as e:  # (DCP's exception is a BaseException; die's is neither)
        die(f"checkpoint {path} is damaged ({why(e)}); "
            f"move it away to resume from the one before, or use another out_dir")
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    return meta['iter']
