"""
sample.py as a user runs it, on checkpoints in train.py's layout (tests/make_ckpt.py): streamed
text, prompt files, the HF export read back by transformers, and the one-line errors: every knob
out of range, bad paths, damaged checkpoints.
"""
import ast
import json
import os
import pickle
import re
import runpy
import shutil
import subprocess
import sys

import pytest
import torch

from make_ckpt import make_checkpoint
from sample import generate
from trainer import one_error_line, run_here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sample(*args):
    env = {**os.environ, 'PYTHONIOENCODING': 'utf-8'}
    r = subprocess.run([sys.executable, 'sample.py', *args], cwd=ROOT, env=env, capture_output=True, timeout=120)
    # decoded here, not with text=True, whose newline translation would turn a sampled '\r' into '\n'
    r.stdout, r.stderr = r.stdout.decode('utf-8'), r.stderr.decode('utf-8')
    return r


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    # A run with an older checkpoint, the latest one, and a newer one still being written (.tmp),
    # whose weights differ: only the latest complete one may be used. Vocab 300 (under GPT-2's
    # 50257): the model emits mostly single-byte tokens, so UTF-8 characters split across tokens
    # and bytes that never make a character both come up in the streamed text.
    out = tmp_path_factory.mktemp('run')
    shape = dict(block_size=64, vocab_size=300, n_layer=2, n_head=2, n_embd=32)
    make_checkpoint(str(out), iter_num=5, seed=5, **shape)
    model, ckpt = make_checkpoint(str(out), iter_num=10, seed=10, **shape)
    make_checkpoint(str(out), iter_num=99, seed=99, **shape)
    os.rename(out / 'ckpt_00000099', out / 'ckpt_00000099.tmp')
    return out, model


def test_sample_streams_the_models_text(run, tmp_path):
    from hetgpt.data.tokenizer import gpt2_encoding
    out, model = run
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('x=1;\n', encoding='utf-8')  # ids under 300 only
    r = sample(f'--out_dir={out}', f'--start=FILE:{prompt}', '--num_samples=2', '--max_new_tokens=100',
               '--temperature=1.0', '--top_k=0', '--seed=7')
    assert r.returncode == 0, r.stderr
    assert 'ckpt_00000010' in r.stderr
    # the same text, sample after sample, as the latest checkpoint's model makes with the same seed
    enc = gpt2_encoding()
    x = torch.tensor([enc.encode(prompt.read_text(encoding='utf-8'))])
    assert x.max() < 300
    torch.manual_seed(7)
    expected = ''
    for _ in range(2):
        y = generate(model, x, 100, temperature=1.0)
        expected += enc.decode(y[0].tolist()) + '\n---------------\n'
    assert r.stdout == expected
    generated = r.stdout.split('x=1;\n', 1)[1]
    assert any(ord(ch) > 127 and ch != '\ufffd' for ch in generated)  # characters made of several tokens
    assert '\ufffd' in generated  # and bytes that make no character


def test_sample_greedy_with_and_without_cache(run):
    out, _ = run
    a, b = (sample(f'--out_dir={out}', '--start=Zq', '--num_samples=1', '--max_new_tokens=80',
                   '--temperature=0', f'--use_kv_cache={c}') for c in (True, False))
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout.startswith('Zq') and len(a.stdout) > 40
    assert a.stdout == b.stdout


def mistake(r, start=''):
    line = one_error_line(r)
    assert line.startswith('error: ' + start) and not r.stdout, (line, r.stdout)
    return line


def test_missing_prompt_file(run, tmp_path):
    out, _ = run
    r = sample(f'--out_dir={out}', f'--start=FILE:{tmp_path}/nope.txt')
    assert 'nope.txt' in mistake(r)


def test_missing_checkpoint(tmp_path):
    assert 'python train.py configs/gpt_tiny.py' in mistake(sample(f'--out_dir={tmp_path}/none'))
    (tmp_path / 'empty' / 'ckpt_00000001.tmp').mkdir(parents=True)  # only an unfinished checkpoint
    assert 'train' in mistake(sample(f'--out_dir={tmp_path}/empty'))


@pytest.mark.parametrize('bias', [True, False])
def test_export_hf(tmp_path, bias):
    from transformers import GPT2LMHeadModel
    # vocab padded to 50304 as train.py's; the export keeps GPT-2's 50257
    model, ckpt = make_checkpoint(str(tmp_path / 'run'), iter_num=3, block_size=64, vocab_size=50304,
                                  n_layer=2, n_head=2, n_embd=32, bias=bias)
    hf_dir = tmp_path / 'hf'
    r = sample(f'--init_from={ckpt}', f'--export_hf={hf_dir}')  # a checkpoint directory, not 'resume'
    assert r.returncode == 0, r.stderr
    assert (hf_dir / 'config.json').exists() and (hf_dir / 'model.safetensors').exists()
    hf = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    assert hf.config.vocab_size == 50257 and hf.config.n_positions == 64
    idx = torch.randint(0, 50257, (2, 64))
    with torch.no_grad():
        theirs = hf(idx).logits
        ours = model(idx)[0]
    torch.testing.assert_close(theirs, ours[:, :, :50257], atol=1e-4, rtol=0)


# -----------------------------------------------------------------------------
# user mistakes: one line on stderr starting 'error: ', exit status 2, nothing written

def knobs_and_rules():
    # sample.py's knobs (its module-level constants before its first function), read from its
    # source: it runs at import, so it is not imported; and the rules it hands to configure
    # (hetgpt/knobs.py's SAMPLE).
    from hetgpt.knobs import SAMPLE
    tree = ast.parse(open(os.path.join(ROOT, 'sample.py')).read())
    knobs = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            return knobs, dict(SAMPLE)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Constant):
            knobs[node.targets[0].id] = node.value.value
    raise AssertionError('sample.py has no function')


def out_of_range(rule, default):
    # Values just outside a rule, derived from its text: '> 0' -> 0, '>= 1' -> 0, '[0, 9]' -> -1
    # and 10, a pattern -> a string it does not match.
    num = type(default) if type(default) in (int, float) else None
    if bound := re.fullmatch(r'(>=?)\s*(\S+)', rule):
        low = float(bound[2])
        return [num(low if bound[1] == '>' else low - 1)]
    if interval := re.fullmatch(r'([\[(])\s*([^,]+),\s*([^\])]+)([\])])', rule):
        low, high = float(interval[2]), float(interval[3])
        return [num(low - 1 if interval[1] == '[' else low),
                num(high + 1 if interval[4] == ']' else high)]
    if rule and isinstance(default, str):
        return [next(s for s in ('no-such-choice', '') if not re.fullmatch(rule, s))]
    assert rule == '', f"a rule this test cannot read: {rule!r}"
    return []


def test_every_knob_has_a_rule_and_every_rule_holds(run, tmp_path, monkeypatch, capfd):
    # (in this process: sample.py's mistakes as processes are the tests around this one)
    out, _ = run
    knobs, rules = knobs_and_rules()
    assert len(knobs) >= 11 and set(knobs) == set(rules), set(knobs) ^ set(rules)
    ran = 0
    for knob, default in knobs.items():
        # a value of the wrong type: on the command line, or from a config file for a string knob
        # (the command line keeps any text as a string)
        if isinstance(default, str):
            (tmp_path / f'{knob}.py').write_text(f'{knob} = 3\n')
            wrong = str(tmp_path / f'{knob}.py')
        else:
            wrong = f'--{knob}=' + {bool: '3', int: '1.5', float: 'abc'}[type(default)]
        for arg in [wrong] + [f'--{knob}={v}' for v in out_of_range(rules[knob], default)]:
            # against a real checkpoint: a value that slipped through would sample, and exit 0
            r = run_here(monkeypatch, capfd, 'sample.py', f'--out_dir={out}', '--max_new_tokens=2',
                         '--num_samples=1', arg)
            mistake(r, f'{knob}=')
            ran += 1
    assert ran >= 20


def test_prompt_and_paths_checked_before_loading(run, tmp_path, monkeypatch, capfd):
    # (in this process: the prompt file's and the checkpoint's mistakes as processes are
    # test_missing_prompt_file and test_missing_checkpoint; the export's, test_entry_points)
    out, _ = run
    monkeypatch.chdir(ROOT)
    sample = lambda *args: run_here(monkeypatch, capfd, 'sample.py', *args)  # noqa: E731
    latin1 = tmp_path / 'latin1.txt'
    latin1.write_bytes('café'.encode('latin-1'))
    assert 'not UTF-8' in mistake(sample(f'--out_dir={out}', f'--start=FILE:{latin1}'))
    assert 'not a directory' in mistake(sample(f'--init_from={tmp_path}/nope'))
    saved = tmp_path / 'saved.txt'
    saved.write_text('keep me')
    for target, why in ((saved, 'is a file'), (tmp_path, 'holds other files'),
                        (saved / 'sub', 'not a writable directory')):
        assert why in mistake(sample(f'--out_dir={out}', f'--export_hf={target}'), 'export_hf=')
    assert saved.read_text() == 'keep me' and not (tmp_path / 'config.json').exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a host without CUDA')
def test_cuda_without_cuda(run):
    out, _ = run
    assert '--device=cpu' in mistake(sample(f'--out_dir={out}', '--device=cuda'), 'device=cuda')


def damage(ckpt, how):
    meta = json.loads((ckpt / 'hetgpt.json').read_text())
    args = meta['model_args']
    if how == 'no hetgpt.json':
        (ckpt / 'hetgpt.json').unlink()
    elif how == 'hetgpt.json not JSON':
        (ckpt / 'hetgpt.json').write_text('{"iter": 10, "model_')
    elif how == 'hetgpt.json a list':
        (ckpt / 'hetgpt.json').write_text('[10]')
    elif how.startswith('model_args'):
        change = {'model_args 3': lambda: meta.update(model_args=3),
                  'model_args no n_layer': lambda: args.pop('n_layer'),
                  'model_args vocab_size a string': lambda: args.update(vocab_size='300'),
                  'model_args bias a string': lambda: args.update(bias='yes'),
                  'model_args n_head 0': lambda: args.update(n_head=0),
                  'model_args other shape': lambda: args.update(n_embd=64)}[how]
        change()
        (ckpt / 'hetgpt.json').write_text(json.dumps(meta))
    elif how == 'no .metadata':
        (ckpt / '.metadata').unlink()
    elif how == '.metadata garbage':
        (ckpt / '.metadata').write_bytes(b'\x00garbage')
    elif how == '.metadata runs code':  # a pickle that would call os.system when loaded
        (ckpt / '.metadata').write_bytes(
            pickle.dumps(Evil(f'touch {ckpt}/pwned'), protocol=4))
    else:
        shards = list(ckpt.glob('*.distcp'))
        assert shards
        for f in shards:
            if how == 'no shard':
                f.unlink()
            else:  # 'shard truncated'
                os.truncate(f, f.stat().st_size // 3)


class Evil:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return os.system, (self.cmd,)


DAMAGE = ['no hetgpt.json', 'hetgpt.json not JSON', 'hetgpt.json a list', 'model_args 3',
          'model_args no n_layer', 'model_args vocab_size a string', 'model_args bias a string',
          'model_args n_head 0', 'model_args other shape', 'no .metadata', '.metadata garbage',
          '.metadata runs code', 'no shard', 'shard truncated']


def damaged_copy(run, tmp_path, how):
    out, _ = run
    ckpt = tmp_path / 'ckpt_00000010'
    shutil.copytree(out / 'ckpt_00000010', ckpt)
    damage(ckpt, how)
    return ckpt, {p.name: p.read_bytes() for p in ckpt.iterdir()}


@pytest.mark.parametrize('how', DAMAGE)
def test_damaged_checkpoint_in_process(run, tmp_path, how, monkeypatch, capfd):
    # sample.py run in this process, where torch is imported already: ~0.1 s, not ~2.5 s, a case
    ckpt, before = damaged_copy(run, tmp_path, how)
    monkeypatch.setattr(sys, 'argv', ['sample.py', f'--init_from={ckpt}', '--max_new_tokens=2'])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(os.path.join(ROOT, 'sample.py'), run_name='__main__')
    out, err = capfd.readouterr()
    assert e.value.code == 2 and not out
    assert err.splitlines() == [err.strip()], err
    assert err.startswith(f'error: checkpoint {ckpt} is damaged ('), err
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before  # nothing written, or run


@pytest.mark.parametrize('how', ['no hetgpt.json', 'model_args 3', 'shard truncated'])
def test_damaged_checkpoint(run, tmp_path, how):
    ckpt, before = damaged_copy(run, tmp_path, how)
    # as init_from=resume finds it: the latest in out_dir
    assert f'checkpoint {ckpt} is damaged (' in mistake(sample(f'--out_dir={tmp_path}'))
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before


@pytest.mark.parametrize('block_size,prompt', [(16384, 1), (65536, 70000), (1024, 1)])
def test_max_new_tokens_past_the_block_is_bounded_by_the_positions_it_recomputes(block_size, prompt,
                                                                                capsys):
    # Past block_size every new token recomputes the whole block (generate crops, no cache): the
    # largest max_new_tokens that check_sample takes is the one whose positions past the block stay
    # within knobs.SAMPLE_POSITIONS; one more is one line naming it. The static cap (SAMPLE's rule)
    # is walked by test_every_knob_has_a_rule_and_every_rule_holds.
    from hetgpt import knobs
    cap = int(knobs.SAMPLE['max_new_tokens'].strip('[]').split(',')[1])
    fits = [n for n in (0, 1, cap // 2, cap) if (prompt + n - block_size) * block_size
            <= knobs.SAMPLE_POSITIONS]
    for n in fits:
        knobs.check_sample(n, block_size, prompt)
    if len(fits) == 4:
        return  # (this block never meets the bound under the cap)
    with pytest.raises(SystemExit):
        knobs.check_sample(cap, block_size, prompt)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('error: max_new_tokens=') and 'block_size' in err[0]
    most = int(err[0].split('use at most ')[1].replace(',', ''))
    assert (prompt + most - block_size) * block_size <= knobs.SAMPLE_POSITIONS
    assert (prompt + most + 1 - block_size) * block_size > knobs.SAMPLE_POSITIONS
    knobs.check_sample(most, block_size, prompt)


def test_max_new_tokens_past_the_block_end_to_end(tmp_path):
    # A model of block 16,384: 100,000 new tokens recompute the whole block 83,617 times. One line
    # once the checkpoint is read (after the one saying which), nothing sampled. (The static cap,
    # before torch loads: test_entry_points test_a_knob_mistake_is_answered_before_torch_loads.)
    make_checkpoint(str(tmp_path), block_size=16384, vocab_size=300, n_layer=1, n_head=1, n_embd=8)
    r = sample(f'--out_dir={tmp_path}', '--max_new_tokens=100000', '--device=cpu')
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 2 and lines[0].startswith('loaded '), r.stderr
    assert lines[1].startswith('error: max_new_tokens=100000: ') and 'block_size=16384' in lines[1]
    assert r.stdout == '' and 'Traceback' not in r.stderr
