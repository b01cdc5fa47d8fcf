"""nanoGPT's own config files run unchanged on train.py, with the global batch nanoGPT would use.

The configs are written from the keys and values that nanoGPT's config/train_shakespeare_char.py,
config/train_gpt2.py, config/finetune_shakespeare.py and config/eval_gpt2.py set (facts of its
interface, karpathy/nanoGPT at 3adf61e). Each run adds command-line overrides only to make it small
enough for a CPU test (model shape, block_size, steps, evaluation size, device); every batch,
checkpoint, learning-rate and init key comes from the config. GPT-2 weights come from a Hugging
Face cache made here (a small random GPT2LMHeadModel stored under the hub's name), offline.
"""
import json
import math
import os
import pickle
import string
import subprocess
import sys

import numpy as np
import pytest
import torch

from trainer import ROOT, metrics, one_error_line, run_train

# (key, Python source of the value), in the order the files set them
SHAKESPEARE_CHAR = [
    ('out_dir', "'out-shakespeare-char'"), ('eval_interval', '250'), ('eval_iters', '200'),
    ('log_interval', '10'), ('always_save_checkpoint', 'False'), ('wandb_log', 'False'),
    ('wandb_project', "'shakespeare-char'"), ('wandb_run_name', "'mini-gpt'"),
    ('dataset', "'shakespeare_char'"), ('gradient_accumulation_steps', '1'), ('batch_size', '64'),
    ('block_size', '256'), ('n_layer', '6'), ('n_head', '6'), ('n_embd', '384'),
    ('dropout', '0.2'), ('learning_rate', '1e-3'), ('max_iters', '5000'),
    ('lr_decay_iters', '5000'), ('min_lr', '1e-4'), ('beta2', '0.99'), ('warmup_iters', '100')]
TRAIN_GPT2 = [
    ('wandb_log', 'True'), ('wandb_project', "'owt'"), ('wandb_run_name', "'gpt2-124M'"),
    ('batch_size', '12'), ('block_size', '1024'), ('gradient_accumulation_steps', '5 * 8'),
    ('max_iters', '600000'), ('lr_decay_iters', '600000'), ('eval_interval', '1000'),
    ('eval_iters', '200'), ('log_interval', '10'), ('weight_decay', '1e-1')]
FINETUNE_SHAKESPEARE = [  # (it starts with `import time`)
    ('out_dir', "'out-shakespeare'"), ('eval_interval', '5'), ('eval_iters', '40'),
    ('wandb_log', 'False'), ('wandb_project', "'shakespeare'"),
    ('wandb_run_name', "'ft-' + str(time.time())"), ('dataset', "'shakespeare'"),
    ('init_from', "'gpt2-xl'"), ('always_save_checkpoint', 'False'), ('batch_size', '1'),
    ('gradient_accumulation_steps', '32'), ('max_iters', '20'), ('learning_rate', '3e-5'),
    ('decay_lr', 'False')]
EVAL_GPT2 = [('batch_size', '8'), ('eval_iters', '500'), ('eval_only', 'True'),
             ('wandb_log', 'False'), ('init_from', "'gpt2'")]
CPU = ['--device=cpu', '--compile=False', '--dtype=float32']
GPT2_VOCAB = 50257
CHARS = string.ascii_letters + string.digits + ' .\n'  # shakespeare_char's 65 (as many)


def write_config(path, pairs, header=''):
    path.write_text(header + ''.join(f"{k} = {v}\n" for k, v in pairs))
    return str(path)


def hub_model(home, name):
    # A small GPT-2 (GPT-2's vocabulary and positions, 2 layers of 32) in a Hugging Face cache at
    # home, as the hub would have left it under `name`: what init_from='gpt2*' finds offline.
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=1024,
                                       vocab_size=GPT2_VOCAB)).eval()
    repo = home / 'hub' / f'models--{name}'
    model.save_pretrained(repo / 'snapshots' / ('0' * 40))
    (repo / 'refs').mkdir()
    (repo / 'refs' / 'main').write_text('0' * 40)
    return model


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp('nanogpt')
    rng = np.random.default_rng(0)
    # shakespeare_char as nanoGPT's prepare.py leaves it: 65 characters, meta.pkl beside the ids
    text = ''.join(rng.choice(list(CHARS), size=30_000))
    meta = {'vocab_size': len(CHARS), 'itos': dict(enumerate(CHARS)),
            'stoi': {c: i for i, c in enumerate(CHARS)}}
    ids = np.array([meta['stoi'][c] for c in text], dtype=np.uint16)
    d = root / 'data' / 'shakespeare_char'
    d.mkdir(parents=True)
    ids[:27_000].tofile(d / 'train.bin')
    ids[27_000:].tofile(d / 'val.bin')
    (d / 'meta.pkl').write_bytes(pickle.dumps(meta))
    # GPT-2 token ids for openwebtext and shakespeare; eval_gpt2's val set is one token repeated,
    # so that every validation sequence is the same and its loss can be computed independently
    for name in ('openwebtext', 'shakespeare'):
        d = root / 'data' / name
        d.mkdir(parents=True)
        rng.integers(0, GPT2_VOCAB, size=20_000).astype(np.uint16).tofile(d / 'train.bin')
        (np.zeros(4_000, np.uint16) if name == 'openwebtext' else
         rng.integers(0, GPT2_VOCAB, size=4_000).astype(np.uint16)).tofile(d / 'val.bin')
    hub = {name: hub_model(root / 'hf', name) for name in ('gpt2', 'gpt2-xl')}
    return root, hub


def env(root):
    return dict(HF_HOME=str(root / 'hf'), HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1',
                WANDB_MODE='disabled')


def checkpoint_iters(out):
    return sorted(int(d[5:]) for d in os.listdir(out) if d.startswith('ckpt_'))


def improving_evals(out):
    # the iterations > 0 whose val loss is below every earlier one: where nanoGPT saves when
    # always_save_checkpoint=False
    best, saved = math.inf, []
    for row in metrics(out):
        if 'val_loss' in row:
            if row['val_loss'] < best and row['iter'] > 0:
                saved.append(row['iter'])
            best = min(best, row['val_loss'])
    return saved


def test_train_shakespeare_char(work):
    root, _ = work
    cfg = write_config(root / 'train_shakespeare_char.py', SHAKESPEARE_CHAR)
    p = run_train(root, cfg, *CPU, '--n_layer=2', '--n_embd=96', '--block_size=64',
                  '--max_iters=6', '--eval_interval=2', '--eval_iters=1', '--keep_last=10',
                  env=env(root))
    # global batch 64 × 1 sequences of 64 tokens
    assert '4,096 tokens per step' in p.stdout
    rows = [r for r in metrics(root / 'out-shakespeare-char') if 'loss' in r]
    assert [r['tokens'] for r in rows] == [r['iter'] * 64 * 64 for r in rows] and rows
    # the vocabulary is meta.pkl's 65 characters: the parameter count of a 2-layer, 96-wide GPT
    # without biases (nanoGPT's default) on 65 tokens and 64 positions
    h, n = 96, 65 * 96 + 64 * 96 + 2 * (12 * 96 * 96 + 2 * 96) + 96
    assert f"{n:,} parameters" in p.stdout
    # always_save_checkpoint=False: a checkpoint at each evaluation that lowered the val loss
    out = root / 'out-shakespeare-char'
    assert checkpoint_iters(out) == improving_evals(out) != []
    assert 'checkpoint written to' in p.stdout
    # sample.py speaks the data set's characters, as nanoGPT's sample.py does with meta.pkl
    sample = [sys.executable, os.path.join(ROOT, 'sample.py'), f'--out_dir={out}',
              '--max_new_tokens=40', '--num_samples=1']
    s = subprocess.run(sample + ['--start=to be'], cwd=root, capture_output=True, text=True)
    assert s.returncode == 0, s.stderr
    text = s.stdout.split('---------------')[0]
    assert text.startswith('to be') and len(text.rstrip('\n')) >= 40 and set(text) <= set(CHARS)
    s = subprocess.run(sample + ['--start=to bé'], cwd=root, capture_output=True, text=True)
    errors = [line for line in s.stderr.splitlines() if not line.startswith('loaded ')]
    assert s.returncode == 2 and len(errors) == 1 and "'é'" in errors[0], s.stderr


def test_train_gpt2_keeps_nanogpts_global_batch_on_two_ranks(work):
    root, _ = work
    cfg = write_config(root / 'train_gpt2.py', TRAIN_GPT2)
    p = run_train(root, cfg, *CPU, '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16',
                  '--max_iters=2', '--eval_iters=1', '--log_interval=1', '--balance=even',
                  '--out_dir=out-gpt2', env=env(root), nproc=2)
    # nanoGPT: 12 sequences × 40 accumulation steps (20 on each of 2 ranks) = 480, in micro-batches
    # of 12: 240 sequences each in 20 micro-batches
    assert f"{480 * 16:,} tokens per step" in p.stdout
    assert '12×20' in p.stdout
    rows = {r['iter']: r for r in metrics(root / 'out-gpt2') if 'loss' in r}
    assert rows[2]['tokens'] == 2 * 480 * 16
    # nanoGPT's defaults that this config relies on: warmup_iters 2000 (lr at step 1 is
    # 6e-4 × 2 / 2001), dataset openwebtext, no biases
    assert rows[2]['lr'] == pytest.approx(6e-4 * 2 / 2001, rel=1e-9)
    saved = json.load(open(root / 'out-gpt2' / 'ckpt_00000002' / 'hetgpt.json'))
    assert saved['model_args']['bias'] is False and saved['config']['dataset'] == 'openwebtext'


def test_finetune_shakespeare_from_the_hub_cache(work):
    root, _ = work
    cfg = write_config(root / 'finetune_shakespeare.py', FINETUNE_SHAKESPEARE, 'import time\n')
    p = run_train(root, cfg, *CPU, '--block_size=32', '--max_iters=6', '--eval_iters=1',
                  '--log_interval=1', '--keep_last=10', env=env(root))
    assert f"{32 * 32:,} tokens per step" in p.stdout  # 1 × 32 sequences
    out = root / 'out-shakespeare'
    lrs = [r['lr'] for r in metrics(out) if 'lr' in r]
    assert lrs == [3e-5] * 6  # decay_lr=False: constant, no warmup
    assert checkpoint_iters(out) == improving_evals(out)  # (none: lr 3e-5 on random tokens)
    # the model is the cache's gpt2-xl (2 layers of 32, biases, 1024 positions), not the defaults
    h = 32
    assert f"{GPT2_VOCAB * h + 1024 * h + 2 * (12 * h * h + 13 * h) + 2 * h:,} parameters" in p.stdout


def test_finetune_shakespeare_without_the_weights_stops_in_one_line(work, tmp_path):
    root, _ = work
    cfg = write_config(root / 'finetune_shakespeare.py', FINETUNE_SHAKESPEARE, 'import time\n')
    p = run_train(root, cfg, *CPU, '--out_dir=out-ft-offline', check=False, timeout=120,
                  env=dict(env(root), HF_HOME=str(tmp_path)))
    line = one_error_line(p)
    assert 'gpt2-xl' in line and 'offline' in line, line
    assert not (root / 'out-ft-offline').exists() or not checkpoint_iters(root / 'out-ft-offline')


def test_eval_gpt2_evaluates_once_and_writes_no_checkpoint(work):
    root, hub = work
    cfg = write_config(root / 'eval_gpt2.py', EVAL_GPT2)
    p = run_train(root, cfg, *CPU, '--block_size=64', '--eval_iters=1', '--out_dir=out-eval',
                  env=env(root))
    assert f"{8 * 64:,} tokens per step" in p.stdout
    vals = [r['val_loss'] for r in metrics(root / 'out-eval') if 'val_loss' in r]
    assert len(vals) == 1 and p.stdout.count('val loss') == 1
    assert checkpoint_iters(root / 'out-eval') == [] and 'iter 1:' not in p.stdout
    # every validation sequence is 65 zeros: the loss of the hub model itself on one of them
    with torch.no_grad():
        x = torch.zeros(1, 65, dtype=torch.long)
        expected = hub['gpt2'](x, labels=x).loss.item()
    assert vals[0] == pytest.approx(expected, abs=1e-4)


class RunsCode:  # a pickle that would run a command when loaded
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def bad_meta_pkl(root, meta):
    d = root / 'data' / 'chars'
    d.mkdir(parents=True)
    np.arange(200, dtype=np.uint16).tofile(d / 'train.bin')
    np.arange(200, dtype=np.uint16).tofile(d / 'val.bin')
    ran = root / 'ran'
    (d / 'meta.pkl').write_bytes({'gadget': pickle.dumps({'vocab_size': 65, 'x': RunsCode(ran)}),
                                  'no_vocab': pickle.dumps({'stoi': {}}),
                                  'garbage': b'not a pickle'}[meta])
    return d, ran


@pytest.mark.parametrize('meta', ['gadget', 'no_vocab', 'garbage'])
def test_a_bad_meta_pkl_is_one_line_and_runs_nothing(tmp_path, monkeypatch, capsys, meta):
    # meta.pkl is untrusted input: it is unpickled with no globals allowed. Its one reader
    # (corpus.dataset_vocab, as train.py and sample.py call it) here; end to end: the test below
    from hetgpt.data import corpus
    d, ran = bad_meta_pkl(tmp_path, meta)
    monkeypatch.chdir(tmp_path)  # (where a command run would write)
    with pytest.raises(SystemExit) as e:
        corpus.dataset_vocab(os.path.join('data', 'chars'))
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert e.value.code == 2 and not out and len(lines) == 1 and lines[0].startswith('error: '), err
    assert 'meta.pkl' in lines[0] and not ran.exists(), err


def test_a_meta_pkl_that_would_run_a_command_ends_train_py_in_one_line(tmp_path):
    _, ran = bad_meta_pkl(tmp_path, 'gadget')
    p = run_train(tmp_path, '--dataset=chars', *CPU, '--n_layer=1', '--n_head=1', '--n_embd=8',
                  '--block_size=8', check=False, timeout=120)
    assert 'meta.pkl' in one_error_line(p)
    assert not ran.exists() and not (tmp_path / 'out').exists()
