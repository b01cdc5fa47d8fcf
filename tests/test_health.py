"""Issue 48: checkpoints only of healthy weights. A checkpoint is known good once the step that starts
from its weights has a finite loss and gradients on every rank (marked good.json; rotation keeps the
newest such); none is written after a step that did not complete (its loss, gradients or outer step
not finite) or of weights that are not finite; when bad steps stop the run, the checkpoints whose
weights started them and never passed a step are set aside (ckpt_*.bad: resume and sample.py pass
them by, nothing is deleted), and the error names the one init_from=resume takes. Each test walks
its rows: an absurd learning rate on resume, the runs of skipped steps (NaN gradients, and float16),
and local steps' outer step (its knobs' bounds, a result float32 cannot hold, a finite one that
ruins the weights)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from trainer import (ROOT, TINY, latest_checkpoint, load_params, make_dataset, max_rel_diff,
                     one_error_line, run_train, train_defaults, train_losses, train_rules)
from hetgpt import knobs
from hetgpt.run.checkpoint import checkpoints, is_good

RUN = TINY + ['--batch_size=4', '--eval_interval=100', '--checkpoint_interval=2', '--keep_last=2']


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    # The straight run: 10 steps, every checkpoint kept (4, 6, 8, 10 and the rest)
    root = tmp_path_factory.mktemp('health')
    make_dataset(root)
    run_train(root, *RUN, '--max_iters=10', '--keep_last=100', '--out_dir=straight')
    return root


def written(stdout):
    # The iters whose checkpoint the log says was written
    return [int(line.split()[1][:-1]) for line in stdout.splitlines()
            if line.startswith('iter ') and ': checkpoint written to ' in line]


def finite(ckpt):
    return all(torch.isfinite(v).all() for v in load_params(ckpt).values())


def at_6(work, name):
    # The straight run's out_dir as it was at iter 6 (checkpoints 4 and 6, its metrics), as a run
    # killed right after writing 6 leaves it: 6 not yet known good (no good.json)
    out = work / name
    os.makedirs(out)
    for c in ('ckpt_00000004', 'ckpt_00000006'):
        shutil.copytree(work / 'straight' / c, out / c)
    shutil.copy(work / 'straight' / 'metrics.jsonl', out)
    os.remove(out / 'ckpt_00000006' / 'good.json')
    return out


@pytest.mark.parametrize('interval, keep', [(1, 1), (2, 2)])
def test_an_absurd_learning_rate_on_resume_keeps_the_good_checkpoint(work, interval, keep):
    # Resumed from 6 at learning_rate=1e30: the step from 6's weights is finite (6 is then known
    # good) and its update ruins them (weights ~1e30, finite); every step after is NaN. Checkpoints
    # every step (interval 1, keep_last 1): 7, of the ruined weights, is written and rotation keeps
    # 6; nothing after 7, and at the stop 7 goes aside. Every 2 steps: nothing is written. Either
    # way the error names 6, the latest checkpoint (what init_from=resume and sample.py read) is 6,
    # and resuming it at the learning rate of the straight run is the straight run, exactly.
    out = at_6(work, f'absurd_{interval}')
    p = run_train(work, *RUN, f'--out_dir={out.name}', '--init_from=resume', '--max_iters=20',
                  '--learning_rate=1e30', '--min_lr=0', f'--checkpoint_interval={interval}',
                  f'--keep_last={keep}', check=False)
    line = one_error_line(p)
    assert 'by iter 11' in line and f'the last good checkpoint is {out.name}/ckpt_00000006' in line, line
    assert written(p.stdout) == ([7] if interval == 1 else [])
    assert (f'iter 8: no checkpoint: not finite after the last step (loss or gradients, or the '
            f'weights), so these weights are not known good; the last good checkpoint is '
            f'{out.name}/ckpt_00000006') in p.stdout
    # (keep_last 1: 4 pruned when 7 was written)
    left = ['ckpt_00000006', 'ckpt_00000007.bad'] if interval == 1 else ['ckpt_00000004',
                                                                          'ckpt_00000006']
    assert sorted(set(os.listdir(out)) - {'measured.json'}) == left + ['metrics.jsonl']
    if interval == 1:
        assert 'ckpt_00000007 set aside as .bad' in line
        ruined = load_params(str(out / 'ckpt_00000007.bad'))
        assert max(v.abs().max() for v in ruined.values()) > 1e20
    assert latest_checkpoint(out).endswith('ckpt_00000006') and is_good(latest_checkpoint(out))
    p = run_train(work, *RUN, f'--out_dir={out.name}', '--init_from=resume', '--max_iters=10')
    assert f'resumed from {out.name}/ckpt_00000006' in p.stdout
    assert max_rel_diff(load_params(latest_checkpoint(out)),
                        load_params(str(work / 'straight' / 'ckpt_00000010'))) == 0.0
    assert train_losses(out) == train_losses(work / 'straight')


# (name, extra arguments, the steps whose gradients are NaN (from 0), max_bad_steps,
#  the iters written, the iters due but refused, the error's words (None: no error), out_dir after)
STREAKS = [
    # 3 skipped steps: the checkpoints due at 4 and 6 are refused, one is written at 7 (its step
    # completed), then 8; 2 (known good) was kept until 7 was
    ('streak', [], '3,4,5', 5, [2, 7, 8], [4, 6], None, ['ckpt_00000007', 'ckpt_00000008']),
    # the bad steps start from 2's weights and stop the run: 2 goes aside, no checkpoint is left
    ('stopped', [], '2,3,4', 3, [2], [4], ['by iter 4', 'ckpt_00000002 set aside as .bad',
                                           'no checkpoint is left', 'init_from=auto'],
     ['ckpt_00000002.bad']),
    # float16: a run's first steps skipped (as the loss scale's search skips them; its halvings
    # add to max_bad_steps) refuse the checkpoints due then, not the ones after
    ('float16', ['--dtype=float16', '--plan=ddp'], '0,1,2,3,4,5', 3, [7, 8], [2, 4, 6], None,
     ['ckpt_00000007', 'ckpt_00000008']),
]


def test_a_run_of_skipped_steps_writes_no_checkpoint(work):
    for name, extra, nan, most, wrote, refused, error, left in STREAKS:
        p = run_train(work, *RUN, *extra, f'--out_dir={name}', '--max_iters=8',
                      f'--max_bad_steps={most}', check=False, faults=True,
                      env={'HETGPT_TEST_NAN_STEPS': nan})
        if error:
            line = one_error_line(p)
            assert all(words in line for words in error), (name, line)
        else:
            assert p.returncode == 0, (name, p.stderr[-3000:])
        assert written(p.stdout) == wrote, (name, p.stdout)
        for it in refused:
            assert f'iter {it}: no checkpoint: not finite after the last step' in p.stdout, (name, it)
        assert sorted(set(os.listdir(work / name)) - {'measured.json'}) == left + ['metrics.jsonl'], name
        for c in checkpoints(str(work / name)):
            assert finite(c)


def two_nodes(cwd, args, check=True):
    # Two machines of one rank each, without torchrun (the cheapest way): two processes of
    # train.py that meet at a TCP store on loopback, each its own node (LOCAL_WORLD_SIZE=1).
    # Returns rank 0's CompletedProcess.
    from elastic_run import free_port
    port, procs = free_port(), []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', MASTER_ADDR='127.0.0.1',
                   MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE='2', LOCAL_RANK='0',
                   LOCAL_WORLD_SIZE='1')
        procs.append(subprocess.Popen([sys.executable, os.path.join(ROOT, 'train.py'), *args],
                                      cwd=cwd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    done = []
    for q in procs:
        out, err = q.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(q.args, q.returncode, out, err))
    if check:
        assert all(d.returncode == 0 for d in done), [d.stderr[-3000:] for d in done]
    return done[0]


LOCAL = RUN + ['--batch_size=8', '--balance=1,1', '--decay_lr=False']


def step_loss(cwd, ckpt, k):
    # The mean token loss of ckpt's model on step k's whole batch (the seed's, corpus.Batches)
    from hetgpt.data.corpus import Batches
    here = os.getcwd()
    os.chdir(cwd)
    try:
        data = Batches('synth', 32, 256, 1337, 'cpu')
    finally:
        os.chdir(here)
    from hetgpt.run.checkpoint import load_model
    model = load_model(ckpt, trim_vocab=False)
    x, y = data.get('train', data.offsets('train', k, 8))
    with torch.no_grad():
        _, loss = model(x, y, reduction='sum')
    return loss.item() / (8 * 32)


def test_the_outer_step_is_bounded_and_checked(work, capsys):
    # Its knobs: what float32 can apply (knobs.TRAIN), refused at once one past the bounds
    defaults, rules = train_defaults(), train_rules()
    for arg, ok in (('--outer_lr=16777216', True), ('--outer_lr=16777217', False),
                    ('--outer_lr=1e30', False), ('--outer_lr=6e-08', True),
                    ('--outer_lr=5e-08', False), ('--outer_momentum=0.99999994', True),
                    ('--outer_momentum=0.99999997', False)):
        if ok:
            knobs.configure(defaults, [arg], rules=rules)
            continue
        with pytest.raises(SystemExit) as e:
            knobs.configure(defaults, [arg], rules=rules)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and arg[2:] in err[0].replace('+', ''), err
    # end to end (1e30 passed before, then a traceback at the first outer step)
    p = run_train(work, *LOCAL, '--outer_interval=2', '--outer_lr=1e30', '--out_dir=never',
                  check=False)
    assert 'outer_lr' in one_error_line(p) and not (work / 'never').exists()
    # Two machines, rounds of 2 steps, to iter 6 (a round's end: every node's weights the anchor)
    base = work / 'local'
    two_nodes(work, [*LOCAL, '--outer_interval=2', '--max_iters=6', f'--out_dir={base.name}'])
    assert checkpoints(str(base))[-1].endswith('ckpt_00000006')
    # Rows, each resumed from 6 with rounds of 1 step, a checkpoint every step, keep_last 1:
    # learning_rate=1e32 moves the weights to ~1e32 (finite) and the outer step at the largest
    # outer_lr makes them inf: not applied, the nodes back at the anchor (6's weights: the next
    # step's loss is theirs), a bad step; no checkpoint is written, 6 is known good and named.
    # At a normal learning rate that outer_lr applies a finite change that ruins the weights
    # (~1e5): its checkpoint is written, the steps after it fail, and it does not survive.
    for name, extra, says in (
            ('inf', ['--learning_rate=1e32'], ['1 outer step(s) not applied']),
            ('ruin', [], [])):
        out = work / f'outer_{name}'
        shutil.copytree(base, out)
        p = two_nodes(work, [*LOCAL, '--outer_interval=1', '--outer_lr=16777216', '--max_iters=16',
                             '--checkpoint_interval=1', '--keep_last=1', '--max_bad_steps=3',
                             '--init_from=resume', f'--out_dir={out.name}', *extra], check=False)
        line = one_error_line(p)
        assert 'outer steps' in line and 'outer_lr' in line, line
        assert f'the last good checkpoint is {out.name}/ckpt_00000006' in line, line
        assert all(words in p.stdout for words in says), (name, p.stdout)
        assert latest_checkpoint(out).endswith('ckpt_00000006') and is_good(latest_checkpoint(out))
        if name == 'inf':
            assert written(p.stdout) == [] and 'set aside' not in line
            losses = train_losses(out)
            want = step_loss(work, str(out / 'ckpt_00000006'), 7)
            assert abs(losses[8] - want) < 1e-5 * want, (losses, want)
        else:
            assert written(p.stdout), p.stdout
    # and the good checkpoint trains on
    two_nodes(work, [*LOCAL, '--outer_interval=2', '--max_iters=10', '--init_from=resume',
                     '--out_dir=outer_inf'])
    assert latest_checkpoint(work / 'outer_inf').endswith('ckpt_00000010')
    assert finite(latest_checkpoint(work / 'outer_inf'))
