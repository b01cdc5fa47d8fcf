"""Failures lose at most the steps since the last checkpoint; user mistakes get one line that says what to do."""
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import torch
import pytest

from trainer import (TINY, latest_checkpoint, load_params, make_dataset, max_rel_diff, one_error_line, run_train,
                     train_command, train_losses)

RUN = TINY + ['--batch_size=4', '--max_iters=12', '--eval_interval=4', '--checkpoint_interval=2', '--keep_last=2']


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp('reliability')
    make_dataset(root)
    run_train(root, *RUN, '--out_dir=straight')
    return root


@pytest.fixture(scope='module')
def straight2(work):
    # The same run on 2 ranks (balance=even), uninterrupted: what the runs stopped under torchrun
    # resume into, bit for bit
    run_train(work, *RUN, '--out_dir=straight2', '--balance=even', nproc=2)
    return work / 'straight2'


def same_as_straight(work, out_dir, tol=0.0):
    a, b = load_params(latest_checkpoint(work / 'straight')), load_params(latest_checkpoint(work / out_dir))
    assert max_rel_diff(b, a) <= tol
    la, lb = train_losses(work / 'straight'), train_losses(work / out_dir)
    assert la.keys() == lb.keys() and all(abs(la[k] - lb[k]) <= tol * abs(la[k]) for k in la)


def env(**faults):
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', **faults)


@pytest.mark.parametrize('moment', ['mid-checkpoint', 'early', 'late'])
def test_kill_9_anywhere_then_resume_is_exact(work, moment):
    # Each checkpoint waits 0.3 s between writing its data and becoming visible, so that the kill can
    # land inside a checkpoint; 'early' and 'late' kill at other (seeded random) moments.
    out = work / f'killed_{moment}'
    cmd = train_command(faults=True) + RUN + [f'--out_dir={out.name}', '--init_from=auto']
    p = subprocess.Popen(cmd, cwd=work, env=env(HETGPT_TEST_SLOW_SAVE='0.3'), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    rng = np.random.default_rng(len(moment))
    if moment == 'mid-checkpoint':
        while not (out / 'ckpt_00000004.tmp' / '.metadata').exists() and time.time() < deadline:
            time.sleep(0.005)
    else:
        while not (out / 'metrics.jsonl').exists() and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.5) if moment == 'early' else rng.uniform(1.0, 2.0))
    p.send_signal(signal.SIGKILL)
    p.wait()
    if moment == 'mid-checkpoint':  # the half-written checkpoint is not taken for a complete one
        assert (out / 'ckpt_00000004.tmp').exists() and not (out / 'ckpt_00000004').exists()
    run_train(work, *RUN, f'--out_dir={out.name}', '--init_from=auto')
    assert not any(d.endswith('.tmp') for d in os.listdir(out))
    same_as_straight(work, out.name)


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])  # preemption, Slurm, Ctrl-C
def test_signal_checkpoints_at_the_end_of_the_step_and_exits_0(work, sig):
    out = work / f'preempted_{sig.name}'
    cmd = train_command(faults=True) + RUN + [f'--out_dir={out.name}', '--checkpoint_interval=100']
    p = subprocess.Popen(cmd, cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith('iter 3: loss'):
            p.send_signal(sig)
            break
    rest, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert 'stopped by a signal' in rest
    stopped_at = int(latest_checkpoint(out).rsplit('_', 1)[1])
    assert 3 <= stopped_at < 12
    run_train(work, *RUN, f'--out_dir={out.name}', '--init_from=resume')
    same_as_straight(work, out.name)


def test_torchrun_restarts_after_a_rank_dies_and_training_resumes_by_itself(work, straight2):
    out = work / 'restarted'
    common = RUN + [f'--out_dir={out.name}', '--init_from=auto', '--balance=even']
    cmd = train_command(2, faults=True, torchrun_args=['--max-restarts=1']) + common
    p = subprocess.Popen(cmd, cwd=work, env=env(HETGPT_TEST_SLOW_SAVE='0.2'), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (out / 'ckpt_00000004').exists() and time.time() < deadline:
        time.sleep(0.01)
    children = open(f'/proc/{p.pid}/task/{p.pid}/children').read().split()
    os.kill(int(children[-1]), signal.SIGKILL)  # one of the two ranks
    log, _ = p.communicate(timeout=300)
    assert p.returncode == 0, log[-3000:]
    assert 'resumed from' in log
    a, b = load_params(latest_checkpoint(straight2)), load_params(latest_checkpoint(out))
    assert max_rel_diff(b, a) == 0.0


def test_non_finite_gradients_skip_the_update_then_stop_after_k(work):
    p = run_train(work, *RUN, '--out_dir=nan_once', faults=True, env={'HETGPT_TEST_NAN_STEPS': '5'})
    assert 'iter 6: 1 of the last 1 updates skipped: loss or gradients not finite' in p.stdout
    assert all(torch.isfinite(v).all() for v in load_params(latest_checkpoint(work / 'nan_once')).values())
    p = run_train(work, *RUN, '--out_dir=nan_many', '--max_bad_steps=3', check=False, faults=True,
                  env={'HETGPT_TEST_NAN_STEPS': '5,6,7,8,9,10,11'})
    assert 'by iter 7' in one_error_line(p)
    # The checkpoint due after a skipped step (6) is not written: those weights had just failed a step
    # (tests/test_health.py). The one before, which a step passed, is named and is the latest.
    assert 'iter 6: no checkpoint' in p.stdout
    assert 'the last good checkpoint is nan_many/ckpt_00000004' in p.stderr
    assert latest_checkpoint(work / 'nan_many').endswith('ckpt_00000004')
    assert all(torch.isfinite(v).all() for v in load_params(latest_checkpoint(work / 'nan_many')).values())


def test_full_disk_during_a_save_keeps_the_last_checkpoint(work):
    p = run_train(work, *RUN, '--out_dir=full', check=False, faults=True, env={'HETGPT_TEST_SAVE_FAIL': '3'})
    line = one_error_line(p)
    assert 'No space left' in line and 'ckpt_00000004' in line, line
    assert latest_checkpoint(work / 'full').endswith('ckpt_00000004')
    run_train(work, *RUN, '--out_dir=full', '--init_from=resume')
    same_as_straight(work, 'full')


def test_a_rank_lost_during_a_save_is_named_as_such_and_the_last_checkpoint_kept(work):
    # Rank 1 dies as the 2nd save (iter 4) begins; rank 0, inside DCP's collectives, must not blame
    # its disk ("free space") for a peer that is gone
    p = run_train(work, *RUN, '--out_dir=lost', nproc=2, check=False, faults=True,
                  env={'HETGPT_TEST_DIE_IN_SAVE': '1:2'})
    assert p.returncode != 0
    errors = [line for line in p.stderr.splitlines() if line.startswith('error:')]
    assert len(errors) == 1 and errors[0].startswith(
        'error: rank 0: a collective failed, another rank is probably gone'), p.stderr[-3000:]
    assert latest_checkpoint(work / 'lost').endswith('ckpt_00000002')
    run_train(work, *RUN, '--out_dir=lost', '--init_from=resume')
    same_as_straight(work, 'lost', tol=1e-5)


@pytest.fixture(scope='module')
def two_ranks_to_6(work):
    # 6 of RUN's steps on 2 ranks: its checkpoint at 6, copied by each world size that resumes it
    run_train(work, *RUN, '--out_dir=two_ranks_to_6', '--max_iters=6', '--balance=even', nproc=2)
    return work / 'two_ranks_to_6'


@pytest.mark.parametrize('world', [1, 3])
def test_checkpoint_from_two_ranks_resumes_on_another_world_size(work, two_ranks_to_6, world):
    out = f'elastic_{world}'
    shutil.copytree(two_ranks_to_6, work / out)
    run_train(work, *RUN, f'--out_dir={out}', '--init_from=resume', '--balance=even', nproc=world)
    same_as_straight(work, out, tol=1e-5)


@pytest.mark.parametrize('how', ['SIGTERM', 'Ctrl-C', 'SIGUSR1'])
def test_a_signal_to_torchrun_checkpoints_and_torchrun_exits_as_readme_says(work, how, request):
    # A scheduler's SIGTERM to torchrun's agent, Ctrl-C in its terminal (SIGINT to its process
    # group), Slurm's SIGUSR1 to that group with the flag README gives: every rank checkpoints at
    # the end of its step; torchrun's own exit code is the one README states; the run resumes
    # exactly (SIGTERM and Ctrl-C: the ranks' side of SIGUSR1 is test_signal_checkpoints...).
    import re
    out = work / f'torchrun_{how}'
    common = RUN + [f'--out_dir={out.name}', '--init_from=auto', '--balance=even']
    flag = ['--signals-to-handle=SIGTERM,SIGINT,SIGUSR1'] if how == 'SIGUSR1' else []
    p = subprocess.Popen(train_command(2, torchrun_args=flag) + common + ['--checkpoint_interval=100'],
                         cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    for line in p.stdout:
        if line.startswith('iter 3: loss'):
            if how == 'SIGTERM':
                p.send_signal(signal.SIGTERM)
            else:
                os.killpg(p.pid, signal.SIGINT if how == 'Ctrl-C' else signal.SIGUSR1)
            break
    log, _ = p.communicate(timeout=120)
    assert 'stopped by a signal; checkpoint saved' in log, log[-3000:]
    readme = open(os.path.join(os.path.dirname(__file__), '..', 'README.md')).read()
    stated = re.search(r'signal torchrun itself.*?torchrun exits (\d)', readme, re.S)
    assert stated and p.returncode == int(stated[1]), (p.returncode, log[-3000:])
    number = {'SIGTERM': 15, 'Ctrl-C': 2, 'SIGUSR1': 10}[how]
    assert f"Received {number} death signal" in log
    assert 3 <= int(latest_checkpoint(out).rsplit('_', 1)[1]) < 12
    if how == 'SIGUSR1':
        assert '--signals-to-handle=SIGTERM,SIGINT,SIGUSR1' in readme
        return
    run_train(work, *common, nproc=2)
    a = load_params(latest_checkpoint(request.getfixturevalue('straight2')))
    assert max_rel_diff(load_params(latest_checkpoint(out)), a) == 0.0
