"""Helpers for the tests that run train.py: a small dataset, a launcher, checkpoint readers."""
import ast
import dataclasses
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import model  # noqa: E402
from hetgpt import knobs  # noqa: E402
from hetgpt.run import checkpoint  # noqa: E402
from hetgpt.run.metrics import read_rows  # noqa: E402

latest_checkpoint = checkpoint.latest

# A model small enough that a test step takes milliseconds; float32 and eager on CPU, no dropout. No biases:
# the key bias of attention has an exactly zero gradient (softmax ignores a shift), so AdamW turns
# its rounding noise into full-size updates that differ between any two summation orders.
TINY = ['--bias=False', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--vocab_size=256', '--device=cpu',
        '--dtype=float32', '--compile=False', '--dropout=0.0', '--eval_iters=2', '--log_interval=1', '--warmup_iters=2',
        '--learning_rate=3e-3', '--min_lr=3e-4', '--lr_decay_iters=20', '--dataset=synth']


def train_defaults():
    # train.py's knobs as written: GPTConfig's fields at model.py's defaults, then its own
    # module-level constants before it gathers them into `defaults` (read from its source:
    # importing it would train)
    found = {f.name: f.default for f in dataclasses.fields(model.GPTConfig)}
    for node in ast.parse(open(os.path.join(ROOT, 'train.py'), encoding='utf-8').read()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], 'id', None) == 'defaults':
            return found
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)
                and knobs.is_knob(node.targets[0].id, node.value.value)):
            found[node.targets[0].id] = node.value.value


def train_rules():
    # train.py's rules: the table it hands to configure (hetgpt/knobs.py)
    return dict(knobs.TRAIN)


def make_dataset(root, name='synth', n_train=40_000, n_val=4_000):
    # Bytes of a repetitive text as tokens (vocab 256): a model can learn it, so losses fall.
    rng = np.random.default_rng(0)
    words = [b'the ', b'cat ', b'sat ', b'on ', b'a ', b'mat ', b'and ', b'dog ', b'ran ', b'. ']
    text = b''.join(words[i] for i in rng.integers(0, len(words), size=(n_train + n_val) // 3))
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    d = os.path.join(root, 'data', name)
    os.makedirs(d, exist_ok=True)
    tokens[:n_train].tofile(os.path.join(d, 'train.bin'))
    tokens[n_train:n_train + n_val].tofile(os.path.join(d, 'val.bin'))
    return d


def reference_work(tmp_path_factory, name, common, batch):
    # A folder with the data set and the reference every strategy, split and dtype is checked
    # against: common run by one process, the batch in one micro-batch, in out_dir=reference
    root = tmp_path_factory.mktemp(name)
    make_dataset(root)
    run_train(root, *common, '--out_dir=reference', f'--micro_batch_size={batch}', '--plan=ddp')
    return root


def train_command(nproc=1, faults=False, torchrun_args=(), code=ROOT):
    # code: the repository whose train.py runs (an edited copy: edited_copy)
    script = [os.path.join(ROOT, 'tests', 'fixture_run.py')] if faults else []
    script.append(os.path.join(code, 'train.py'))
    if nproc == 1 and not torchrun_args:
        return [sys.executable] + script
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}',
            *torchrun_args] + script


def run_train(cwd, *args, nproc=1, check=True, timeout=600, env=None, faults=False, code=ROOT):
    cmd = train_command(nproc, faults, code=code)
    # (env: a variable at None is left unset: OMP_NUM_THREADS=None runs as a user's plain command)
    full_env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    full_env.update(env or {})
    full_env = {k: v for k, v in full_env.items() if v is not None}
    p = subprocess.run(cmd + list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and p.returncode != 0:
        raise AssertionError(f"train.py failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


def one_error_line(p):
    # A user mistake's outcome: exit 2 and one `error: ...` line on stderr, no traceback. The one
    # check of it for a process (p: a CompletedProcess, or a Popen with its output read into
    # p.stdout and p.stderr as text); a test adds what its case says about the line.
    lines = p.stderr.splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith('error: ') and 'Traceback' not in p.stderr, p.stderr
    return lines[0]


def run_here(monkeypatch, capfd, script, *args):
    # A script (sample.py) run in this process, as its command line runs it, where torch is imported
    # already (~0.1 s, not ~2.5 s): its exit status and output as a process's. For mistakes that end
    # it (SystemExit); each such mistake has an end to end test as a process too.
    import runpy
    import pytest
    monkeypatch.setattr(sys, 'argv', [script, *args])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(os.path.join(ROOT, script), run_name='__main__')
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(sys.argv, e.value.code, out, err)


# A row of the plan table: its rank (or a span of ranks that print alike, "0-3"), node(s),
# device, dtype, share, micro-batch × count, ac
PLAN_ROW = r'^\s*(\d+)(?:-(\d+))?\s+[\d-]+\s+{}\s+(?:bf16|fp16|fp32)\s+(\d+)\s+(\d+)×(\d+)\s+(yes|no)\s+pred'


def plan_rows(stdout, device='cpu'):
    # rank -> (share, micro-batch, count of micro-batches, ac) for each rank on `device` (cpu, or
    # a GPU's name) in the plan table
    rows = {}
    for m in re.finditer(PLAN_ROW.format(re.escape(device)), stdout, re.M):
        for rank in range(int(m[1]), int(m[2] or m[1]) + 1):
            rows[rank] = (int(m[3]), int(m[4]), int(m[5]), m[6] == 'yes')
    return rows


def snapshot(out):
    # Every file under out with its bytes: "nothing saved was touched" compares two of these.
    return {os.path.relpath(os.path.join(d, f), out): open(os.path.join(d, f), 'rb').read()
            for d, _, files in os.walk(out) for f in files if f != '.lock'}


def edited_copy(dest, name, old, new, more=()):
    # hetgpt's root .py files and package copied into dest, with `old` replaced by `new` in file
    # `name` (and each (old, new) of more after it): a researcher's edit (or another machine's
    # code), run from dest/train.py
    import glob
    import shutil
    os.makedirs(dest, exist_ok=True)
    for f in glob.glob(os.path.join(ROOT, '*.py')):
        shutil.copy(f, dest)
    shutil.copytree(os.path.join(ROOT, 'hetgpt'), os.path.join(dest, 'hetgpt'),
                    ignore=shutil.ignore_patterns('__pycache__'), dirs_exist_ok=True)
    path = os.path.join(dest, name)
    text = open(path).read()
    for old, new in [(old, new), *more]:
        assert old in text, (name, old)
        text = text.replace(old, new)
    open(path, 'w').write(text)
    return dest


def load_params(ckpt_dir):
    return checkpoint.load_model(ckpt_dir, trim_vocab=False).state_dict()  # as saved


def saved_tensors(ckpt_dir):
    # Every tensor of a checkpoint's model, by name, as its .metadata records them: whatever
    # model.py wrote it (an edited one's buffers included), read without building the model
    import torch
    entries = checkpoint.Reader(ckpt_dir).read_metadata().state_dict_metadata
    sd = {k[len('model.'):]: torch.empty(tuple(m.size), dtype=m.properties.dtype)
          for k, m in entries.items() if k.startswith('model.') and hasattr(m, 'size')}
    checkpoint.read(ckpt_dir, {'model': sd})
    return sd


def max_rel_diff(a, b):
    # |a - b| / |b| over all parameters as one vector. Per element it would not be meaningful: AdamW
    # divides by sqrt(v), so a gradient that is near zero turns summation-order noise into updates.
    assert a.keys() == b.keys()
    num = sum(((a[k] - b[k]).double() ** 2).sum() for k in b) ** 0.5
    return (num / sum((b[k].double() ** 2).sum() for k in b) ** 0.5).item()


def metrics(out_dir):
    return read_rows(os.path.join(out_dir, 'metrics.jsonl'))


def train_losses(out_dir):
    return {r['iter']: r['loss'] for r in metrics(out_dir) if 'loss' in r}
