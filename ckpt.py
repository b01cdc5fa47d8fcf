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

from configurator import die

ALLOWED = {('torch', 'Size'), ('collections', 'OrderedDict'), ('torch.serialization', '_get_layout'),
           ('torch.distributed.checkpoint.filesystem', '_StorageInfo'), ('pathlib', 'PosixPath'),
           ('pathlib', 'WindowsPath')}


class MetadataUnpickler(pickle.Unpickler):

    def find_class(self, module, name):
        found = super().find_class(module, name) if module.startswith(('torch', 'collections', 'pathlib')) else None
        if ((module, name) in ALLOWED or isinstance(found, (torch.dtype, torch.memory_format))
                or (module == 'torch.distributed.checkpoint.metadata' and isinstance(found, type))):
            return found  # DCP's record classes, sizes, dtypes, a layout by name, paths
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")


# DCP's filesystem module calls pickle.load on the metadata stream: give it ours, the rest unchanged.
dcp_filesystem.pickle = types.SimpleNamespace(**{**vars(pickle), 'load': lambda f: MetadataUnpickler(f).load()})
# When the metadata cannot be read, DCP logs a traceback (on the root logger) before it raises; the
# callers report the damaged checkpoint themselves, in one line.
logging.getLogger().addFilter(lambda record: 'metadata is not found' not in record.getMessage())


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
        die(f"could not write checkpoint {tmp} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"{'the last complete one, ' + last[-1] + ', is intact' if last else 'no checkpoint was lost'}: "
            f"free space, then init_from=resume")
    if master:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in checkpoints(out_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load(path, model, optimizer, model_args):
    # Loads path into model and optimizer (wrapped or not) and returns its iteration.
    try:
        meta = json.load(open(os.path.join(path, 'hetgpt.json')))
        if meta['model_args'] != vars(model_args):
            diff = [f"{k}={meta['model_args'].get(k)} here {v}" for k, v in vars(model_args).items() if meta['model_args'].get(k) != v]
            die(f"{path} holds another model ({', '.join(diff)}); use its config, another out_dir, or init_from=scratch")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.load({'model': model_sd, 'optim': optim_sd}, checkpoint_id=path)
    except (Exception, CheckpointException) as e:  # (DCP's exception is a BaseException; die's is neither)
        die(f"checkpoint {path} is damaged ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
            f"move it away to resume from the one before, or use init_from=scratch")
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    return meta['iter']
