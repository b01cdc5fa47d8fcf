"""
sample.py as a user runs it, on checkpoints in train.py's layout (tests/make_ckpt.py): streamed
text, prompt files, the one-line errors, and the HF export read back by transformers.
"""
import os
import subprocess
import sys

import pytest
import torch

from make_ckpt import make_checkpoint

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
    from data.prepare import gpt2_encoding
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
        y = model.generate(x, 100, temperature=1.0)
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


def one_line_error(r):
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr
    return lines[0]


def test_missing_prompt_file(run, tmp_path):
    out, _ = run
    r = sample(f'--out_dir={out}', f'--start=FILE:{tmp_path}/nope.txt')
    assert 'nope.txt' in one_line_error(r) and not r.stdout


def test_missing_checkpoint(tmp_path):
    assert 'python train.py configs/gpt_tiny.py' in one_line_error(sample(f'--out_dir={tmp_path}/none'))
    (tmp_path / 'empty' / 'ckpt_00000001.tmp').mkdir(parents=True)  # only an unfinished checkpoint
    assert 'train' in one_line_error(sample(f'--out_dir={tmp_path}/empty'))


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
