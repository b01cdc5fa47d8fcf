"""
Checkpoint files, for train.py and sample.py: where the complete ones are, and reading them safely.

A checkpoint is out_dir/ckpt_<iter:08d>/, written by torch.distributed.checkpoint (DCP) under a
.tmp name and renamed when complete, plus hetgpt.json (iter, model shape, config). DCP reads tensors
with torch.load(weights_only=True) but its .metadata file with plain pickle.load, which would run
whatever a tampered file asks for. Importing this module restricts that unpickling to the record
types DCP writes (its own dataclasses, torch sizes, dtypes and memory formats).
"""
import logging
import os
import pickle
import re
import types

import torch
import torch.distributed.checkpoint.filesystem as dcp_filesystem

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
