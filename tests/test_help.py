"""
-h and --help of every entry point: exit 0 and say what the script takes. train.py and sample.py
list every knob with its default and the comment beside it in the file, at once (no torch
import). The knobs expected here come from the script itself (the defaults it hands to
configure(), dumped by running it), and the comments from its lines read here with a regular
expression, not from the help's own reader.
"""
import ast
import os
import re
import subprocess
import sys
import time

import pytest

from trainer import ROOT

ENV = dict(os.environ, HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', TIKTOKEN_CACHE_DIR='',
           OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')

# Runs a script until it calls configure(), which prints the defaults it was given and exits.
DUMP = """
import json, runpy, sys
from hetgpt import knobs
def dump(defaults, *args, **kwargs):
    print(json.dumps(defaults))
    sys.exit(0)
knobs.configure = dump
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def run(*args, env=ENV):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def defaults_of(script):
    import json
    r = run('-c', DUMP, script)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def comments_of(script, field=False):
    # {knob: its comment} from the file's lines: 'name = value  # text', then indented '# more';
    # field: a dataclass's '    name: type = value  # text' (model.py's GPTConfig)
    found, last = {}, None
    head = r'    (\w+): \w+ = ' if field else r'(\w+) = '
    for line in open(os.path.join(ROOT, script), encoding='utf-8'):
        knob = re.match(head + r'[^#]*?(?:#\s*(.*))?$', line.rstrip('\n'))
        more = re.match(r'\s+#\s*(.*)$', line)
        if knob:
            last = knob[1]
            found.setdefault(last, knob[2] or '')
        elif more and last:
            found[last] += ' ' + more[1]
        else:
            last = None
    return found


def knobs_in_help(text):
    # {knob: (default as shown, comment, group)} from a help text: '  name = default  comment'
    # lines, their indented continuation lines, under group lines at column 0
    found, last, group = {}, None, None
    for line in text.splitlines():
        head = re.match(r'  (\w+) = (.*?)(?:  +(\S.*))?$', line)
        if head:
            last = head[1]
            found[last] = [head[2], head[3] or '', group]
        elif last and re.match(r' {4,}\S', line):
            found[last][1] += ' ' + line.strip()
        else:
            last = None
            if line and not line.startswith(' '):
                group = line
    return {k: tuple(v) for k, v in found.items()}


@pytest.mark.parametrize('script', ['train.py', 'sample.py'])
def test_help_lists_every_knob_with_its_default_and_comment(script):
    r = run(script, '--help')
    assert r.returncode == 0 and not r.stderr, r.stderr
    shown, defaults = knobs_in_help(r.stdout), defaults_of(script)
    assert sorted(shown) == sorted(defaults)
    for name, (default, comment, _) in shown.items():
        value = ast.literal_eval(default)
        assert value == defaults[name] and type(value) is type(defaults[name]), (name, default)
    # train.py's model knobs: GPTConfig's fields, with train.py's default and comment where it
    # sets one
    comments = {**(comments_of('model.py', field=True) if script == 'train.py' else {}),
                **comments_of(script)}
    for name in defaults:
        assert shown[name][1] == comments[name], name
    lines = r.stdout.splitlines()
    assert lines[0] == f"usage: python {script} [CONFIG.py ...] [--key=value ...]"
    assert '--key=value' in r.stdout and 'configs/' in r.stdout and 'hetgpt/knobs.py' in r.stdout


def test_train_help_keeps_the_files_groups_and_known_comments():
    shown = knobs_in_help(run('train.py', '--help').stdout)
    assert [shown[k][2].split(':')[0] for k in ('out_dir', 'n_layer', 'batch_size', 'device')] == \
        ['I/O', 'model', 'optimizer', 'system']
    assert shown['batch_size'][:2] == ('32', 'sequences per step, all ranks together')
    assert shown['grad_clip'][:2] == ('1.0', '0 disables clipping')
    assert shown['learning_rate'][:2] == ('6e-4', '')  # as written in the file
    # a comment line that goes on from the knob above belongs to it (sample.py's init_from)
    init_from = knobs_in_help(run('sample.py', '-h').stdout)['init_from']
    assert init_from[1].startswith("'resume' (the latest checkpoint in out_dir)")
    assert init_from[1].endswith('or gpt2, gpt2-medium, gpt2-large, gpt2-xl')


def test_train_help_is_instant_and_imports_no_torch(tmp_path):
    # a torch that cannot be imported comes first on the path: --help must not need it
    (tmp_path / 'torch').mkdir()
    (tmp_path / 'torch' / '__init__.py').write_text("raise SystemExit('torch was imported')\n")
    env = dict(ENV, PYTHONPATH=str(tmp_path))
    t = time.perf_counter()
    r = run('train.py', '--help', env=env)
    elapsed = time.perf_counter() - t
    assert r.returncode == 0 and 'torch was imported' not in r.stderr and 'n_layer = 12' in r.stdout
    assert elapsed < 2, f"{elapsed:.2f} s"  # (0.16 s measured; a second process start at most)
    r = run('train.py', '--device=cpu', env=env)  # the fake is seen when train.py does import it
    assert r.returncode != 0 and 'torch was imported' in r.stderr


@pytest.mark.parametrize('script', ['train.py', 'sample.py'])
def test_h_is_help_wherever_it_stands(script):
    full = run(script, '--help').stdout
    for args in (['-h'], ['configs/gpt_tiny.py', '--device=cpu', '-h'], ['--n_layr=3', '--help']):
        r = run(script, *args)
        assert r.returncode == 0 and r.stdout == full, (args, r.stderr)


def test_plot_help():
    for flag in ('-h', '--help'):
        r = run('plot.py', flag)
        assert r.returncode == 0 and not r.stderr, r.stderr
        assert r.stdout.startswith('usage: python plot.py OUT_DIR') and 'loss.png' in r.stdout


def test_prepare_help():
    for flag in ('-h', '--help'):
        r = run(os.path.join('data', 'prepare.py'), flag)
        assert r.returncode == 0 and not r.stderr, r.stderr
        for option in ('--dataset', '--input', '--name', '--out_dir', '--val_fraction', '--limit'):
            assert option in r.stdout
        assert 'python data/prepare.py --dataset pydocs' in r.stdout


def test_plan_help_and_its_examples_are_true(capsys, monkeypatch):
    import plan
    r = run('plan.py', '--help')
    assert r.returncode == 0 and not r.stderr, r.stderr
    for option in ('--gpus', '--host_mem', '--nodes', '--plan', '--micro_batch_size', '--dtype'):
        assert option in r.stdout
    assert re.search(r'2xcpu\s+--host_mem', r.stdout)  # CPU ranks need it: the help says so
    examples = [line.split()[2:] for line in r.stdout.splitlines()
                if line.startswith('  python plan.py ')]
    assert len(examples) >= 3 and any('2xcpu' in e for e in examples)
    monkeypatch.chdir(ROOT)
    for args in examples:  # each one runs and fits (exit 0; 1 would be "does not fit")
        assert plan.main(args) == 0, (args, capsys.readouterr())
    assert run('plan.py', '-h').stdout == r.stdout


def test_plan_says_which_gpus_it_assumed(capsys):
    import plan
    tiny = os.path.join(ROOT, 'configs', 'gpt_tiny.py')
    assert plan.main([tiny]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('no --gpus given: planned for 1xH200')
    assert 'choose with --gpus' in out[0]
    assert ' H200 ' in out[3]  # the table's one rank
    assert plan.main([tiny, '--gpus', '1xA100-80GB']) == 0
    assert 'no --gpus' not in capsys.readouterr().out


def test_plan_says_which_host_memory_it_used(capsys):
    # train.py's table says stated or MemAvailable (tests/test_train.py); plan.py's says given or not
    import plan
    tiny = os.path.join(ROOT, 'configs', 'gpt_tiny.py')
    assert plan.main([tiny, '--gpus', '2xA100-80GB']) == 0
    assert 'host memory: not checked' in capsys.readouterr().out.splitlines()
    assert plan.main([tiny, '--gpus', '2xA100-80GB', '--host_mem', '512']) == 0
    assert 'host memory: 512 GiB per node, given (--host_mem)' in capsys.readouterr().out.splitlines()
