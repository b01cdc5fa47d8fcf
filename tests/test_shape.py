"""
Issue 24: one check of the model's shape and the batch, whoever reads them: train.py's knobs,
plan.py's (train.py's knobs, defaults and rules, read from its source), and a checkpoint's
model_args (untrusted). A bad value is the same one line and exit 2 everywhere.
"""
import json
import os
import re
import subprocess
import sys
from dataclasses import fields

import pytest

from trainer import ROOT, train_defaults, train_rules
from hetgpt import knobs
from hetgpt.planner import search
from hetgpt.run import checkpoint
from model import GPTConfig
import plan

BATCH = ('batch_size', 'gradient_accumulation_steps', 'micro_batch_size')
PLANNED = BATCH + ('memory_fraction', 'max_iters', 'outer_interval',  # plan.py reads these too
                   'optimizer', 'muon_lr', 'muon_momentum', 'muon_weight_decay')
TINY_SHAPE = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=256, dropout=0.0,
                  bias=False, init_std=0.02)


def bad_values(rule, kind):
    # What the rule's text excludes, one step past each end (derived here, not by the code)
    if '|' in rule:  # choices: one that is none of them
        return ['+'.join(rule.split('|'))]
    if rule.startswith('>='):
        return [kind(float(rule.lstrip('>= ')) - 1)]
    if rule.startswith('>'):
        return [kind(float(rule.lstrip('> ')))] + [kind(float(rule.lstrip('> ')) - 1)]
    low, high = (float(x) for x in rule[1:-1].split(','))
    return [kind(low - 1) if rule[0] == '[' else kind(low),
            kind(high + 1) if rule[-1] == ']' else kind(high)]


def cases():
    # (knob, bad value) for every ranged knob plan.py reads too, and one indivisible width
    rules, defaults = train_rules(), train_defaults()
    out = [(k, v) for k in [f.name for f in fields(GPTConfig)] + list(PLANNED) if rules[k]
           for v in bad_values(rules[k], type(defaults[k]))]
    return out + [('n_embd', 30)]  # with n_head=4: 30 = 2 × 3 × 5


CASES = cases()


def test_the_rules_cover_the_shape_and_the_batch():
    assert set(knobs.SHAPE) == {f.name for f in fields(GPTConfig)}
    rules = train_rules()
    assert {k: rules[k] for k in knobs.SHAPE} == knobs.SHAPE  # train.py takes them as they are
    for key in BATCH:  # bounded by the planner's largest batch, 2**24
        assert rules[key].endswith(f', {2**24}]'), (key, rules[key])
    assert set(plan.KNOBS) == set(knobs.SHAPE) | set(PLANNED)
    assert {k for k, _ in CASES} == {k for k in plan.KNOBS if rules[k]}


TRAIN_CHILD = """
import io, json, os, runpy, sys
sys.path.insert(0, {root!r})
out = []
for argv in json.loads(sys.argv[1]):
    sys.argv, sys.stderr = ['train.py'] + argv, io.StringIO()
    try:
        runpy.run_path(os.path.join({root!r}, 'train.py'), run_name='__main__')
        code = 0
    except SystemExit as e:
        code = e.code
    out.append([code, sys.stderr.getvalue()])
sys.__stdout__.write(json.dumps(out) + '\\n')
"""


def bad_checkpoint(out_dir, knob, value):
    path = os.path.join(out_dir, 'ckpt_00000010')
    os.makedirs(path)
    args = {**TINY_SHAPE, knob: value, **({'n_head': 4} if (knob, value) == ('n_embd', 30) else {})}
    with open(os.path.join(path, 'hetgpt.json'), 'w') as f:
        json.dump({'iter': 10, 'model_args': args, 'config': {}}, f)
    return path


def error_line(code, err):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith('error: '), (code, err)
    return lines[0][len('error: '):]


def test_each_bad_shape_is_the_same_line_from_train_plan_and_a_checkpoint(tmp_path, capsys):
    # train.py: each case as a config would give it, and as a checkpoint to resume would; one
    # process runs them all (train.py stops at the check, before any device or data)
    shape_args = [f'--{k}={v}' for k, v in TINY_SHAPE.items()]
    argvs = []
    for i, (knob, value) in enumerate(CASES):
        extra = ['--n_head=4'] if (knob, value) == ('n_embd', 30) else []
        argvs.append([f'--out_dir={tmp_path}/never{i}', f'--{knob}={value}'] + extra)
        if knob in knobs.SHAPE:
            bad_checkpoint(tmp_path / f'run{i}', knob, value)
            argvs.append([f'--out_dir={tmp_path}/run{i}', '--init_from=resume'] + shape_args)
    p = subprocess.run([sys.executable, '-c', TRAIN_CHILD.format(root=ROOT), json.dumps(argvs)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore'))
    assert p.returncode == 0, p.stderr[-3000:]
    train = iter(json.loads(p.stdout.splitlines()[-1]))
    for i, (knob, value) in enumerate(CASES):
        said = error_line(*next(train))
        assert said.startswith((f'{knob}={value}', f'{knob}={value!r}')) and not os.path.exists(tmp_path / f'never{i}')
        if (knob, value) == ('n_embd', 30):
            divisors = [h for h in range(1, 31) if 30 % h == 0][-6:]
            assert said == f"n_embd=30 is not divisible by n_head=4; pick n_head among {divisors}"
        extra = ['--n_head=4'] if (knob, value) == ('n_embd', 30) else []
        with pytest.raises(SystemExit) as e:  # plan.py: the same line
            plan.main(['configs/gpt_tiny.py', f'--{knob}={value}'] + extra)
        assert error_line(e.value.code, capsys.readouterr().err) == said
        if knob not in knobs.SHAPE:
            continue
        # a checkpoint of that shape: resumed by train.py, loaded by sample.py's loader
        path = str(tmp_path / f'run{i}' / 'ckpt_00000010')
        resumed = error_line(*next(train))
        with pytest.raises(SystemExit) as e:
            checkpoint.load_model(path)
        loaded = error_line(e.value.code, capsys.readouterr().err)
        assert resumed == loaded == f"checkpoint {path} is damaged (ValueError: model_args " \
            f"{said}); move it away to use the one before it, or use another out_dir"
    assert next(train, None) is None


@pytest.mark.parametrize('knob,value,says', [
    ('n_layer', '2', "n_layer='2' is not int"), ('n_layer', True, 'n_layer=True is not int'),
    ('n_head', 2.0, 'n_head=2.0 is not int'), ('bias', 'no', "bias='no' is not bool"),
    ('dropout', float('nan'), 'dropout=nan: must be a finite number'),
    ('vocab_size', None, 'vocab_size is missing')])
def test_a_checkpoint_of_another_type_is_one_line(tmp_path, capsys, knob, value, says):
    path = bad_checkpoint(tmp_path, knob, value)  # (json writes nan as NaN, and reads it back)
    with pytest.raises(SystemExit) as e:
        checkpoint.load_model(path)
    assert f"model_args {says})" in error_line(e.value.code, capsys.readouterr().err)


def test_a_checkpoint_without_dropout_and_init_std_is_read():
    # (no part of the weights' shapes: older checkpoints lack them)
    assert knobs.fault({k: v for k, v in TINY_SHAPE.items() if k not in ('dropout', 'init_std')}) \
        is None


# -----------------------------------------------------------------------------
# plan.py's knobs are train.py's: its defaults (bias=False, nanoGPT's) and its rules
def test_plan_takes_train_defaults(tmp_path, monkeypatch):
    empty = tmp_path / 'empty.py'
    empty.write_text('')
    seen = {}

    class Seen(Exception):
        pass

    def make_plan(cfg, batch, ranks, **kw):
        seen.update(vars(cfg), batch=batch, micro=kw['micro_batch_size'])
        raise Seen

    monkeypatch.setattr(search, 'make_plan', make_plan)  # (plan.py imports it when called)
    with pytest.raises(Seen):
        plan.main([str(empty)])
    defaults = train_defaults()
    assert {f.name: seen[f.name] for f in fields(GPTConfig)} == \
        {f.name: defaults[f.name] for f in fields(GPTConfig)}
    assert seen['bias'] is False and GPTConfig.bias is True  # the model's own default differs
    assert (seen['batch'], seen['micro']) == (defaults['batch_size'], 0)
    # --help says so too
    helped = subprocess.run([sys.executable, 'train.py', '--help'], cwd=ROOT, capture_output=True,
                            text=True, timeout=60).stdout
    assert re.search(r'^  bias = False\b', helped, re.M)


def test_plan_counts_train_default_model_without_biases(tmp_path, capsys):
    # A model of train.py's defaults but small: its parameters counted here, biases or not
    empty = tmp_path / 'empty.py'
    empty.write_text('')
    L, h, s, V = 1, 64, 16, 64
    no_bias = V * h + s * h + L * (12 * h * h + 2 * h) + h  # wte (tied), wpe, blocks, ln_f
    with_bias = no_bias + L * 11 * h + h
    assert plan.main([str(empty), f'--n_layer={L}', f'--n_embd={h}', '--n_head=2',
                      f'--block_size={s}', f'--vocab_size={V}', '--batch_size=2']) == 0
    out = capsys.readouterr().out
    assert f'{no_bias:,} parameters' in out and f'{with_bias:,}' not in out
