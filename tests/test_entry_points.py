"""
The contract every entry point keeps (sample.py, train.py, data/prepare.py, plan.py, plot.py): a
user's mistake is one line on stderr starting 'error: ' that says what to do, exit status 2, no
traceback, and nothing already saved is touched. Here: GPT-2 weights that are neither cached nor
downloadable (hf.from_pretrained, for train.py and sample.py), and folders that may not be written.
Each script's own mistakes are tested beside it (test_sample.py, test_prepare.py, ...).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from make_ckpt import make_checkpoint
from trainer import ROOT, TINY, make_dataset, one_error_line, plan_rows, train_command


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
    line = one_error_line(r)
    assert elapsed < 20, f"{elapsed:.0f} s: retried the hub"
    assert line.startswith('error: cannot load gpt2 from the Hugging Face hub (offline: ')
    assert ('HF_HUB_OFFLINE' if how == 'HF_HUB_OFFLINE' else '127.0.0.1:9') in line
    assert 'connect once' in line
    assert not out.exists() or not any(out.glob('ckpt_*'))


@pytest.mark.parametrize('script', ['sample.py', 'train.py'])
def test_without_transformers_gpt2_and_export_say_what_to_install(tmp_path, script):
    # The runtime set (requirements.txt) has no transformers: a package of that name that fails
    # to import stands in for its absence
    make_dataset(str(tmp_path))
    make_checkpoint(str(tmp_path / 'out'), n_layer=1, n_head=1, n_embd=8, block_size=8,
                    vocab_size=64)
    (tmp_path / 'hidden' / 'transformers').mkdir(parents=True)
    (tmp_path / 'hidden' / 'transformers' / '__init__.py').write_text(
        "raise ImportError('No module named transformers')\n")
    env = dict(no_hub(tmp_path, 'HF_HUB_OFFLINE'), PYTHONPATH=str(tmp_path / 'hidden'))
    cmd = ([sys.executable, os.path.join(ROOT, 'sample.py')] if script == 'sample.py'
           else train_command() + ['--dataset=synth', '--device=cpu', '--compile=False'])
    for how in ['--init_from=gpt2'] + (['--export_hf=hf'] if script == 'sample.py' else []):
        out = tmp_path / ('out' if script == 'sample.py' else 'fresh')
        r = subprocess.run(cmd + [how, f'--out_dir={out}'], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        line = one_error_line(r)
        assert 'needs transformers' in line and 'requirements-dev.txt' in line, line


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
    assert 'not writable' in one_error_line(r)
    assert os.listdir(run) == ['metrics.jsonl']


def test_prepare_into_a_folder_that_may_not_be_written(nobody, locked):
    with open(os.path.join(locked, 'notes.txt'), 'w') as f:
        f.write('some notes\n' * 20)
    os.chmod(locked, 0o555)
    cmd = [sys.executable, os.path.join(ROOT, 'data', 'prepare.py'), '--input', 'notes.txt',
           '--out_dir', locked]
    r = subprocess.run(nobody + cmd, cwd=locked, capture_output=True, text=True, timeout=60)
    assert 'not a writable directory' in one_error_line(r)
    assert os.listdir(locked) == ['notes.txt']


def test_export_into_a_folder_that_may_not_be_written(nobody, locked):
    os.chmod(locked, 0o555)
    r = subprocess.run(nobody + [sys.executable, 'sample.py', f'--export_hf={locked}/hf'],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert 'not a writable directory' in one_error_line(r)
    assert os.listdir(locked) == []


# -----------------------------------------------------------------------------
# Under torchrun every rank makes the same start-up checks: a mistake they all see is printed once
# (by local rank 0), one that a single rank sees by that rank, and a stop by a signal once.
def torchrun(cwd, *args, nproc=2, env=None):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', HF_HUB_OFFLINE='1',
               TRANSFORMERS_OFFLINE='1', TIKTOKEN_CACHE_DIR='', **(env or {}))
    t = time.time()
    r = subprocess.run(train_command(nproc) + list(TINY) + ['--max_iters=2', '--batch_size=6']
                       + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return r, r.stdout + r.stderr, time.time() - t


def error_lines(output):
    return [line for line in output.splitlines() if line.startswith('error: ')]


@pytest.mark.parametrize('arg,expected', [
    ('--n_layr=3', "error: unknown config key 'n_layr' in the command line; did you mean n_layer"),
    ('--dataset=absent', 'error: no data/absent/train.bin: run python data/prepare.py')])
def test_a_mistake_every_rank_sees_is_printed_once(tmp_path, arg, expected):
    make_dataset(str(tmp_path))
    r, output, elapsed = torchrun(tmp_path, '--out_dir=out', arg)
    assert r.returncode != 0
    # (rank 1 stays quiet: stopped by torchrun before its wait for that is over, else it would
    # print its line too, naming itself)
    assert len(error_lines(output)) == 1 and error_lines(output)[0].startswith(expected), output
    assert elapsed < 60, f"{elapsed:.0f} s"  # (torchrun kills a rank deaf to SIGTERM after 30 s)
    assert not (tmp_path / 'out').exists() or not any((tmp_path / 'out').glob('ckpt_*'))


def test_a_mistake_only_one_rank_sees_is_printed_by_that_rank(tmp_path):
    # HETGPT_MEM_GIB gives one number per local rank: rank 2 of 3 has none, ranks 0 and 1 go on
    make_dataset(str(tmp_path))
    r, output, _ = torchrun(tmp_path, '--out_dir=out', nproc=3,
                            env={'HETGPT_MEM_GIB': '8,8'})
    assert r.returncode != 0
    mine = [line for line in error_lines(output) if 'HETGPT_MEM_GIB' in line]
    assert mine == ["error: rank 2: HETGPT_MEM_GIB=8,8: give GiB > 0, one number or one per local "
                    "rank (this is local rank 2)"], output


def test_a_stop_while_starting_under_torchrun_is_one_line(tmp_path):
    make_dataset(str(tmp_path))
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    p = subprocess.Popen(train_command(2) + list(TINY) + ['--out_dir=out', '--max_iters=2'],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    # once both ranks handle SIGTERM (train.py's start-up handler: bit 15 of SigCgt), stop the
    # job as a scheduler would: torchrun's agent gets SIGTERM and sends it on to its ranks
    deadline, ready = time.time() + 120, False
    while not ready and time.time() < deadline and p.poll() is None:
        try:
            kids = open(f'/proc/{p.pid}/task/{p.pid}/children').read().split()
            masks = [int(re.search(r'SigCgt:\s*(\w+)', open(f'/proc/{k}/status').read())[1], 16)
                     for k in kids]
        except (OSError, TypeError):
            masks = []
        ready = len(masks) == 2 and all(m >> (signal.SIGTERM - 1) & 1 for m in masks)
        time.sleep(0.02)
    assert ready, 'the ranks never started'
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0
    assert error_lines(out + err) == ['error: stopped by SIGTERM while starting; nothing was '
                                      'written'], out + err
    assert not (tmp_path / 'out').exists() or not any((tmp_path / 'out').glob('ckpt_*'))


# -----------------------------------------------------------------------------
# plan.py reads a config's batch as train.py does: nanoGPT's gradient_accumulation_steps > 0 makes
# batch_size the micro-batch, and the global batch batch_size × gradient_accumulation_steps
def test_plan_reads_gradient_accumulation_as_nanogpt(tmp_path, capsys):
    import plan
    config = tmp_path / 'nano.py'
    config.write_text('batch_size = 12\ngradient_accumulation_steps = 40\nn_layer = 2\n'
                      'n_head = 2\nn_embd = 64\nblock_size = 128\n')
    assert plan.main([str(config), '--gpus', '2xA100-80GB']) == 0
    table = capsys.readouterr().out
    assert 'batch 480 × 128 tokens' in table  # 12 × 40, whatever the number of ranks
    rows = plan_rows(table, 'A100-80GB')
    assert sorted(rows) == [0, 1] and sum(share for share, *_ in rows.values()) == 480, table
    # micro-batches of 12, as nanoGPT's
    assert all(micro == 12 and share == 12 * count for share, micro, count, _ in rows.values())
    # without it, batch_size is the global batch as always
    config.write_text('batch_size = 12\nn_layer = 2\nn_head = 2\nn_embd = 64\nblock_size = 128\n')
    assert plan.main([str(config), '--gpus', '2xA100-80GB']) == 0
    assert 'batch 12 × 128 tokens' in capsys.readouterr().out


# A fresh interpreter runs the script as its command line does, then says whether torch was loaded
# by the time the script exited.
BEFORE_TORCH = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
finally:
    print('torch loaded' if 'torch' in sys.modules else 'no torch')
"""


@pytest.mark.parametrize('script, args, says', [
    ('train.py', ['configs/gpt_tiny.py', '--n_layer=0'], 'n_layer=0: must be in [1, 100000]'),
    ('train.py', ['--plan=fsdpx'], "plan='fsdpx': must be one of auto|ddp"),
    ('train.py', ['--learning_rat=1e-3'], "unknown config key 'learning_rat'"),
    ('train.py', ['--n_embd=30', '--n_head=4'], 'n_embd=30 is not divisible by n_head=4'),
    ('train.py', ['--batch_size=2', '--gradient_accumulation_steps=16777216'],
     'gradient_accumulation_steps=16777216: the global batch'),
    ('sample.py', ['--num_samples=0'], 'num_samples=0: must be in [1, 1000000]'),
    ('sample.py', ['--max_new_tokens=100000000'],
     'max_new_tokens=100000000: must be in [0, 100000]'),
    ('plan.py', ['configs/gpt_tiny.py', '--n_layer=0'], 'n_layer=0: must be in [1, 100000]'),
    ('plan.py', ['configs/gpt_tiny.py', '--gpus=2xA100'], 'which A100?'),
])
def test_a_knob_mistake_is_answered_before_torch_loads(script, args, says):
    # the same one line as the script gives, and torch never imported: a mistake costs a tenth
    # of a second, not the seconds torch takes to load (bench/RESULTS.md)
    p = subprocess.run([sys.executable, '-c', BEFORE_TORCH, script, *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert says in one_error_line(p) and p.stdout.splitlines()[-1] == 'no torch', (p.stdout,
                                                                                   p.stderr)
    direct = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert one_error_line(direct) == one_error_line(p)
