"""Issue 23: what a checkpoint can make its reader do. DCP's .metadata is allow-listed (test_hardening);
here a checkpoint re-saved by DCP itself, its .metadata valid, with a pickled command as an optimizer's
lr or betas or in a weight's place, and a .metadata (or a symlink) pointing a shard at another run's
file or piping it through a stream transform. train.py resuming, sample.py and sample.py --export_hf
each refuse it in one line, run nothing and touch nothing; DCP's own planner and reader would not."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from trainer import (ROOT, TINY, latest_checkpoint, make_dataset, one_error_line, run_train, snapshot,
                     train_command)

RUN = TINY + ['--batch_size=4', '--eval_interval=100']
TEN = RUN + ['--max_iters=10', '--checkpoint_interval=1', '--keep_last=2']  # ckpt 9 and 10 kept
WPE = 'model.transformer.wpe.weight'  # (the embedding is tied: its own entry is read twice)

# The attacker: reads a real checkpoint with DCP, puts a gadget in, saves it with DCP again (or
# rewrites its .metadata with plain pickle). Each gadget touches PWNED in the reader's directory.
TAMPER = f"""
import os, pickle, shutil, subprocess, sys, warnings
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
warnings.simplefilter('ignore')
run, other, out = sys.argv[1:4]
ckpt, ckpt9 = os.path.join(run, 'ckpt_00000010'), os.path.join(other, 'ckpt_00000009')

class Gadget:  # pickles as a call of f(*args)
    def __init__(self, f, *args):
        self.f, self.args = f, args
    def __reduce__(self):
        return self.f, self.args

popen, system = Gadget(subprocess.Popen, ['touch', 'PWNED']), Gadget(os.system, 'touch PWNED')

def resaved(name, change):
    sd = _load_state_dict_from_keys(checkpoint_id=ckpt)
    change(sd)
    shutil.copytree(run, os.path.join(out, name))
    dcp.save(sd, checkpoint_id=os.path.join(out, name, 'ckpt_00000010'))

def metadata(name, change):
    shutil.copytree(run, os.path.join(out, name))
    path = os.path.join(out, name, 'ckpt_00000010', '.metadata')
    md = pickle.load(open(path, 'rb'))
    change(md, pickle.load(open(os.path.join(ckpt9, '.metadata'), 'rb')), os.path.dirname(path))
    pickle.dump(md, open(path, 'wb'))

def redirect(to):  # the position embedding's entry: in another run's shard, where it lies there
    def change(md, md9, _):
        key = next(k for k in md.storage_data if k.fqn == {WPE!r})
        md.storage_data[key] = md9.storage_data[key]
        md.storage_data[key].relative_path = to
    return change

def transform(md, md9, _):
    next(iter(md.storage_data.values())).transform_descriptors = ['zstd/1']

def raw_bytes(md, md9, ckpt):  # a weight's entry: bytes, a plain pickle appended to the shard
    fqn, shard = 'model.transformer.h.0.mlp.c_fc.weight', os.path.join(ckpt, '__0_0.distcp')
    gadget, offset = pickle.dumps(system, protocol=2), os.path.getsize(shard)
    open(shard, 'ab').write(gadget)
    md.state_dict_metadata[fqn] = BytesStorageMetadata()
    for key in [k for k in md.storage_data if k.fqn == fqn]:
        del md.storage_data[key]
    md.storage_data[MetadataIndex(fqn)] = _StorageInfo('__0_0.distcp', offset, len(gadget))

resaved('lr_popen', lambda sd: sd['optim']['param_groups'][0].update(lr=popen))
resaved('betas_system', lambda sd: sd['optim']['param_groups'][1].update(betas=system))
resaved('weight_popen', lambda sd: sd['model'].update({{'transformer.wte.weight': popen}}))
metadata('weight_raw_system', raw_bytes)
metadata('path_absolute', redirect(os.path.abspath(os.path.join(ckpt9, '__0_0.distcp'))))
metadata('path_dotdot', redirect('../ckpt_00000009/__0_0.distcp'))
metadata('transform', transform)
shutil.copytree(run, os.path.join(out, 'symlink'))
shard = os.path.join(out, 'symlink', 'ckpt_00000010', '__0_0.distcp')
os.remove(shard)
os.symlink(os.path.abspath(os.path.join(ckpt9, '__0_0.distcp')), shard)
"""
GADGETS = ['lr_popen', 'betas_system', 'weight_popen', 'weight_raw_system']
PATHS = ['path_absolute', 'path_dotdot', 'symlink']
PAYLOADS = GADGETS + PATHS + ['transform']

# DCP's own way in, as ckpt.py read checkpoints before: the model and AdamW state dicts of the
# checkpoint's shape, dcp.load with its DefaultLoadPlanner and FileSystemReader. For each checkpoint
# (in a directory of its own, where a gadget's PWNED lands) prints the position embedding's sum as
# read, or the error.
PLAIN_LOAD = f"""
import json, os, sys, warnings
sys.path.insert(0, {ROOT!r})
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from model import GPT, config_from, make_optimizer
from hetgpt.planner.costs import train_knobs
warnings.simplefilter('ignore')
dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)
read = {{}}
for name, path in zip(sys.argv[1::2], sys.argv[2::2]):
    os.makedirs(name)
    os.chdir(name)
    model = GPT(config_from(json.load(open(os.path.join(path, 'hetgpt.json')))['model_args']))
    model_sd, optim_sd = get_state_dict(model, make_optimizer(model, train_knobs()))
    try:
        dcp.load({{'model': model_sd, 'optim': optim_sd}}, checkpoint_id=path)
        read[name] = model.transformer.wpe.weight.sum().item()
    except BaseException as e:
        read[name] = repr(e)[:200]
    os.chdir('..')
print(json.dumps(read))
"""


def env():
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp('trust')
    make_dataset(root)
    run_train(root, *TEN, '--out_dir=ten')
    shutil.copytree(root / 'ten', root / 'other')  # another run: its ckpt 9, a step behind
    subprocess.run([sys.executable, '-c', TAMPER, root / 'ten', root / 'other', root / 'payloads'],
                   env=env(), check=True, capture_output=True, timeout=300)
    return root


@pytest.fixture(scope='module')
def plain(work):
    # Each payload (and the run's own and the other run's checkpoint) read by DCP's own planner
    # and reader, in one throwaway process: {name: the position embedding's sum, or the error}.
    where = {'own': latest_checkpoint(work / 'ten'), 'foreign': work / 'other' / 'ckpt_00000009',
             **{name: latest_checkpoint(work / 'payloads' / name) for name in GADGETS + PATHS}}
    args = [str(a) for name, path in where.items() for a in (name, path)]
    os.makedirs(work / 'plain')
    p = subprocess.run([sys.executable, '-c', PLAIN_LOAD] + args, cwd=work / 'plain', env=env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    time.sleep(0.5)  # a spawned command would have had time to run
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize('name', GADGETS)
def test_each_gadget_is_live_under_dcps_own_planner(work, plain, name):
    assert (work / 'plain' / name / 'PWNED').exists(), plain[name]


@pytest.mark.parametrize('name', PATHS)
def test_each_redirect_is_followed_by_dcps_own_reader(plain, name):
    # The position embedding comes from the other run's file: foreign weights, silently.
    assert plain[name] == plain['foreign'] != plain['own'], plain


# sample.py reads a checkpoint's model only, never its optimizer: a gadget there is never read.
# --export_hf reads it as sample.py does (ckpt.load_model), after importing transformers (slow):
# two payloads show it goes the same way.
OPTIMIZER = ['lr_popen', 'betas_system']
EXPORTED = ['weight_raw_system', 'path_absolute']
WHY = {'lr_popen': 'lr holds', 'betas_system': 'betas holds', 'weight_popen': 'not as a tensor',
       'weight_raw_system': 'not as a tensor', 'path_absolute': 'outside the checkpoint',
       'path_dotdot': 'outside the checkpoint', 'symlink': 'a link to a file outside',
       'transform': "transforms ['zstd/1']"}


@pytest.mark.parametrize('name', PAYLOADS)
def test_a_tampered_checkpoint_is_refused_runs_nothing_and_touches_nothing(work, tmp_path, name):
    # Through each entry point, at once (each in its own directory, on its own copy).
    sample = [sys.executable, os.path.join(ROOT, 'sample.py')]
    commands = {'train': train_command() + RUN + ['--max_iters=12', '--init_from=resume'],
                'sample': sample + ['--max_new_tokens=2', '--num_samples=1', '--device=cpu']}
    if name in EXPORTED:
        commands['export_hf'] = sample + ['--export_hf=hf']
    runs, before = {}, {}
    others = snapshot(work / 'other')
    for entry, cmd in commands.items():
        cwd = tmp_path / entry
        shutil.copytree(work / 'data', cwd / 'data')
        out = cwd / 'run'
        shutil.copytree(work / 'payloads' / name, out, symlinks=True)
        before[entry] = snapshot(out)
        runs[entry] = subprocess.Popen(cmd + [f'--out_dir={out}'], cwd=cwd, env=env(), text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for entry, p in runs.items():
        p.stdout, p.stderr = p.communicate(timeout=300)
    time.sleep(0.5)  # a spawned command would have had time to run
    for entry, p in runs.items():
        assert not (tmp_path / entry / 'PWNED').exists(), entry
        assert snapshot(tmp_path / entry / 'run') == before[entry], entry
        if entry == 'sample' and name in OPTIMIZER:
            assert p.returncode == 0 and 'ckpt_00000010' in p.stderr, p.stderr[-2000:]
            continue
        line = one_error_line(p)
        assert 'ckpt_00000010 is damaged' in line and WHY[name] in line, (entry, line)
    assert not (tmp_path / 'export_hf' / 'hf').exists()
    assert snapshot(work / 'other') == others


def test_a_clean_checkpoint_still_resumes(work, tmp_path):
    # Its optimizer's plain values through the new planner, then a step with them. (Sampling a clean
    # model: the optimizer payloads above; exactness of resuming: test_train, test_strategies.)
    out = tmp_path / 'ten'
    shutil.copytree(work / 'ten', out)
    p = run_train(work, *RUN, '--max_iters=11', f'--out_dir={out}', '--init_from=resume')
    assert 'resumed from' in p.stdout and latest_checkpoint(out).endswith('ckpt_00000011')
