"""
The contract every entry point keeps (sample.py, train.py, data/prepare.py, plan.py, plot.py): a
user's mistake is one line on stderr starting 'error: ' that says what to do, exit status 2, no
traceback, and nothing already saved is touched. Here: GPT-2 weights that are neither cached nor
downloadable (hf.from_pretrained, for train.py and sample.py), and folders that may not be written.
Each script's own mistakes are tested beside it (test_sample.py, test_prepare.py, ...).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from trainer import ROOT, make_dataset, train_command


def mistake(r):
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), r.stderr
    assert 'Traceback' not in r.stderr
    return lines[0]


def no_hub(tmp_path, how):
    # An empty Hugging Face cache, and a hub that is either switched off or not listening
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('HF_', 'HUGGINGFACE_', 'TRANSFORMERS_'))}
    env.update(HF_HOME=str(tmp_path / 'hf_home'), OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    if how == 'HF_HUB_OFFLINE':
        env['HF_HUB_OFFLINE'] = '1'
    else:
        env['HF_ENDPOINT'] = 'http://127.0.0.1:9'  # the discard port: nothing listens there
    return env


@pytest.mark.parametrize('how', ['HF_HUB_OFFLINE', 'HF_ENDPOINT'])
@pytest.mark.parametrize('script', ['sample.py', 'train.py'])
def test_gpt2_offline_fails_fast_in_one_line(tmp_path, script, how):
    make_dataset(str(tmp_path))  # train.py reads data/synth/ from its working directory
    out = tmp_path / 'out'
    cmd = ([sys.executable, os.path.join(ROOT, 'sample.py')] if script == 'sample.py'
           else train_command() + ['--dataset=synth', '--device=cpu', '--compile=False'])
    t = time.time()
    r = subprocess.run(cmd + ['--init_from=gpt2', f'--out_dir={out}'], cwd=tmp_path,
                       env=no_hub(tmp_path, how), capture_output=True, text=True, timeout=120)
    elapsed = time.time() - t
    line = mistake(r)
    assert elapsed < 20, f"{elapsed:.0f} s: retried the hub"
    assert line.startswith('error: cannot load gpt2 from the Hugging Face hub (offline: ')
    assert ('HF_HUB_OFFLINE' if how == 'HF_HUB_OFFLINE' else '127.0.0.1:9') in line
    assert 'connect once' in line
    assert not out.exists() or not any(out.glob('ckpt_*'))


@pytest.fixture
def nobody():
    # root may write anywhere whatever the modes say: the unwritable folders are tested as nobody
    if os.geteuid() != 0:
        yield []
        return
    prefix = ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups']
    probe = prefix + [sys.executable, '-c', 'import numpy']
    if not shutil.which('setpriv') or subprocess.run(probe, capture_output=True).returncode:
        pytest.skip('cannot run as an unprivileged user here')
    yield prefix


@pytest.fixture
def locked():
    # a folder others may read but not write (pytest's tmp_path is private to its owner)
    d = tempfile.mkdtemp()
    os.chmod(d, 0o755)
    yield d
    for root, dirs, _ in os.walk(d):
        os.chmod(root, 0o755)
    shutil.rmtree(d)


def test_plot_into_a_folder_that_may_not_be_written(nobody, locked):
    run = os.path.join(locked, 'run')
    os.mkdir(run)
    with open(os.path.join(run, 'metrics.jsonl'), 'w') as f:
        f.write(json.dumps(dict(iter=0, tokens=100, loss=5.0, lr=1e-3)) + '\n')
    os.chmod(run, 0o555)
    r = subprocess.run(nobody + [sys.executable, 'plot.py', run], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert 'not writable' in mistake(r)
    assert os.listdir(run) == ['metrics.jsonl']


def test_prepare_into_a_folder_that_may_not_be_written(nobody, locked):
    with open(os.path.join(locked, 'notes.txt'), 'w') as f:
        f.write('some notes\n' * 20)
    os.chmod(locked, 0o555)
    cmd = [sys.executable, os.path.join(ROOT, 'data', 'prepare.py'), '--input', 'notes.txt',
           '--out_dir', locked]
    r = subprocess.run(nobody + cmd, cwd=locked, capture_output=True, text=True, timeout=60)
    assert 'not a writable directory' in mistake(r)
    assert os.listdir(locked) == ['notes.txt']


def test_export_into_a_folder_that_may_not_be_written(nobody, locked):
    os.chmod(locked, 0o555)
    r = subprocess.run(nobody + [sys.executable, 'sample.py', f'--export_hf={locked}/hf'],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert 'not a writable directory' in mistake(r)
    assert os.listdir(locked) == []
