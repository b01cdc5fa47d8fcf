"""
Writes a checkpoint in train.py's layout, for tests that must not wait on training:
out_dir/ckpt_{iter:08d}/ holding a torch.distributed.checkpoint of {"model": state_dict} and
hetgpt.json = {"iter", "model_args", "config"}.
"""
import dataclasses
import json
import os
import warnings

import torch
import torch.distributed.checkpoint as dcp

from model import GPT, GPTConfig


def make_checkpoint(out_dir, iter_num=10, seed=0, **model_args):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**model_args))
    ckpt = os.path.join(out_dir, f"ckpt_{iter_num:08d}")
    with warnings.catch_warnings():  # "no process group: saving in a single process", as intended
        warnings.simplefilter('ignore')
        # train.py also saves its optimizer state under "optim"; sampling never reads it
        dcp.save({"model": model.state_dict(), "optim": {"step": torch.tensor(iter_num)}}, checkpoint_id=ckpt)
    args = dataclasses.asdict(model.config)
    with open(os.path.join(ckpt, 'hetgpt.json'), 'w') as f:
        json.dump({"iter": iter_num, "model_args": args, "config": {**args, "out_dir": out_dir}}, f)
    return model.eval(), ckpt
