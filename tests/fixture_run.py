"""Runs train.py with faults injected, for the reliability tests (not a product feature).
usage: python tests/fixture_run.py train.py [args...]; the faults come from environment variables:
  HETGPT_TEST_NAN_STEPS=3,4   gradients become NaN at these optimizer steps (counted from 0 in this process)
  HETGPT_TEST_SAVE_FAIL=2     the 2nd checkpoint save of this process fails as on a full disk
  HETGPT_TEST_DIE_IN_SAVE=1:2  rank 1 dies (exit 1, as if killed) at the start of its 2nd checkpoint save, while
                              the other ranks are in it
  HETGPT_TEST_SLOW_SAVE=0.5   seconds to wait after a checkpoint's data is written, before it is made visible
  HETGPT_TEST_CUDA_GROUP=1    the default process group laid out as train.py lays it out for CUDA, with
                              gloo in NCCL's place, serving only what NCCL serves (CUDA tensors): host
                              tensors then need a CPU backend of their own, as on a GPU host. A value
                              other than 1 is a backend string to try instead ('nccl': before the fix).
  HETGPT_TEST_SLOW_RANK=1:0.05  rank 1's forward takes 0.05 s longer per sequence (a slower GPU); '*:0.05':
                              every rank's (a run slow enough to be interrupted at a chosen step)
  HETGPT_TEST_HIDDEN_MEM=1:0.1  rank 1's forward also fills 0.1 GiB per sequence of host memory for a moment
                              (memory the planner does not know of: the probe step finds it over budget)
"""
import errno
import os
import runpy
import sys
import time

import torch
import torch.distributed.checkpoint as dcp

nan_steps = {int(s) for s in os.environ.get('HETGPT_TEST_NAN_STEPS', '').split(',') if s}
save_fail = int(os.environ.get('HETGPT_TEST_SAVE_FAIL', 0))
slow_save = float(os.environ.get('HETGPT_TEST_SLOW_SAVE', 0))
die_rank, _, die_save = os.environ.get('HETGPT_TEST_DIE_IN_SAVE', '').partition(':')
calls = {'clip': 0, 'save': 0}
real_clip, real_save = torch.nn.utils.clip_grad_norm_, dcp.save


def clip(parameters, *args, **kwargs):
    parameters = list(parameters)
    if calls['clip'] in nan_steps:
        for p in parameters:
            if p.grad is not None:
                p.grad.fill_(float('nan'))
    calls['clip'] += 1
    return real_clip(parameters, *args, **kwargs)


def save(*args, **kwargs):
    calls['save'] += 1
    if die_rank == os.environ.get('RANK', '0') and calls['save'] == int(die_save):
        os._exit(1)
    if calls['save'] == save_fail:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    result = real_save(*args, **kwargs)
    time.sleep(slow_save)
    return result


torch.nn.utils.clip_grad_norm_, dcp.save = clip, save
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
cuda_group = os.environ.get('HETGPT_TEST_CUDA_GROUP')
if cuda_group:
    from hetgpt import hardware  # the module train.py imports: it reads BACKENDS[device type] from it
    backend = hardware.BACKENDS['cuda'] if cuda_group == '1' else cuda_group
    if ':' not in backend:  # one backend for the device types it serves: NCCL serves CUDA only
        backend = {'nccl': 'cuda:nccl', 'gloo': 'cpu:gloo,cuda:gloo'}[backend]
    hardware.BACKENDS['cpu'] = backend.replace('nccl', 'gloo')
slow_rank, _, delay = os.environ.get('HETGPT_TEST_SLOW_RANK', '').partition(':')
if slow_rank in ('*', os.environ.get('RANK', '0')):
    import model
    real_forward = model.GPT.forward

    def slow_forward(self, idx, *args, **kwargs):
        time.sleep(float(delay) * idx.size(0))
        return real_forward(self, idx, *args, **kwargs)
    model.GPT.forward = slow_forward
hidden_rank, _, gib = os.environ.get('HETGPT_TEST_HIDDEN_MEM', '').partition(':')
if hidden_rank == os.environ.get('RANK', '0'):
    import model
    unhidden_forward = model.GPT.forward

    def hungry_forward(self, idx, *args, **kwargs):
        torch.ones(int(float(gib) * 2**30 / 4 * idx.size(0)))  # touched, so resident, then freed
        return unhidden_forward(self, idx, *args, **kwargs)
    model.GPT.forward = hungry_forward
runpy.run_path(sys.argv[0], run_name='__main__')
