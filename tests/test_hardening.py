"""Issue 11: a tampered checkpoint runs nothing, a new run never deletes another's checkpoints, a
silent rank ends the job, one run per out_dir, metrics.jsonl survives tearing and full disks, every
knob is range-checked, signals at any moment, bad token ids at start-up, torn checkpoint metadata."""
import json
import math
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from trainer import (ROOT, TINY, latest_checkpoint, make_dataset, one_error_line, run_here, run_train,
                     snapshot, train_command, train_defaults, train_rules)
from hetgpt import knobs

RUN = TINY + ['--batch_size=4', '--eval_interval=100']
TEN = RUN + ['--max_iters=10', '--checkpoint_interval=1', '--keep_last=2']  # ckpt 9 and 10 kept


def env(**extra):
    return dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', **extra)


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp('hardening')
    make_dataset(root)
    run_train(root, *TEN, '--out_dir=ten')
    return root


# -----------------------------------------------------------------------------
# 1. Code execution from a checkpoint's metadata
def gadget(module, name, args):
    # A protocol-4 pickle calling module's attribute path `name` (STACK_GLOBAL) with args.
    def text(s):
        return pickle.SHORT_BINUNICODE + bytes([len(s)]) + s.encode()
    body = pickle.dumps(args, protocol=4)[2:-1]  # args alone: no PROTO, no STOP
    if body[:1] == pickle.FRAME:
        body = body[9:]
    return pickle.PROTO + b'\x04' + text(module) + text(name) + pickle.STACK_GLOBAL + body + \
        pickle.REDUCE + pickle.STOP


GADGETS = {  # walks from DCP's own metadata module to a command, as the report describes
    'popen_via_metadata': ('torch.distributed.checkpoint.metadata',
                           'torch._strobelight.cli_function_profiler.subprocess.Popen',
                           (['touch', 'PWNED'],)),
    'system_via_metadata': ('torch.distributed.checkpoint.metadata', 'os.system', ('touch PWNED',)),
    'exec_via_torch': ('torch', 'builtins.exec', ("open('PWNED', 'w')",)),
    'popen_plain': ('subprocess', 'Popen', (['touch', 'PWNED'],)),
}


@pytest.mark.parametrize('name', sorted(GADGETS))
def test_each_gadget_is_live_under_plain_pickle(tmp_path, name):
    # The payloads are real: Python's own unpickler runs them (in a throwaway process).
    (tmp_path / 'payload').write_bytes(gadget(*GADGETS[name]))
    code = "import pickle, time, torch.distributed.checkpoint.metadata; " \
           "pickle.load(open('payload', 'rb')); time.sleep(0.5)"
    subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=env(), capture_output=True)
    assert (tmp_path / 'PWNED').exists()


@pytest.mark.parametrize('entry', ['train', 'sample'])
@pytest.mark.parametrize('name', sorted(GADGETS))
def test_tampered_metadata_runs_nothing(work, tmp_path, entry, name, monkeypatch, capfd):
    out = tmp_path / 'run'
    shutil.copytree(work / 'ten', out)
    ckpt = latest_checkpoint(out)
    open(os.path.join(ckpt, '.metadata'), 'wb').write(gadget(*GADGETS[name]))
    before = snapshot(out)
    shutil.copytree(work / 'data', tmp_path / 'data')
    if entry == 'train':
        cmd = train_command() + RUN + ['--max_iters=12', f'--out_dir={out}', '--init_from=resume']
        p = subprocess.run(cmd, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    else:  # in this process (sample.py's damaged checkpoints as processes: test_sample), in tmp_path
        monkeypatch.chdir(tmp_path)
        p = run_here(monkeypatch, capfd, 'sample.py', f'--out_dir={out}', '--max_new_tokens=2')
    time.sleep(0.5)  # a spawned command would have had time to run
    assert 'damaged' in one_error_line(p) and 'not allowed' in p.stderr
    assert not (tmp_path / 'PWNED').exists()
    assert snapshot(out) == before


# -----------------------------------------------------------------------------
# 2. A new run over another run's checkpoints
def test_scratch_over_another_runs_checkpoints_is_refused_and_touches_nothing(work, tmp_path):
    out = tmp_path / 'ten'
    shutil.copytree(work / 'ten', out)
    assert sorted(os.listdir(out)) == ['ckpt_00000009', 'ckpt_00000010', 'measured.json', 'metrics.jsonl']
    before = snapshot(out)
    for init in ('scratch', 'gpt2'):
        p = run_train(work, *RUN, '--max_iters=4', '--checkpoint_interval=2', '--keep_last=2',
                      f'--out_dir={out}', f'--init_from={init}', check=False)
        assert 'init_from=auto' in one_error_line(p) and 'ckpt_00000010' in p.stderr
        assert snapshot(out) == before
    p = run_train(work, *RUN, '--max_iters=12', '--checkpoint_interval=2', '--keep_last=2',
                  f'--out_dir={out}', '--init_from=auto')
    assert 'resumed from' in p.stdout and 'ckpt_00000010' in p.stdout
    assert sorted(os.listdir(out)) == ['ckpt_00000010', 'ckpt_00000012', 'measured.json', 'metrics.jsonl']


def test_the_checkpoint_just_written_is_never_pruned(work, tmp_path):
    # Saving iter 4 into a directory whose other checkpoints are newer (9, 10) keeps 4 and the
    # newest other (keep_last=2): pruning by number alone deleted the one just written.
    out = tmp_path / 'older'
    shutil.copytree(work / 'ten', out)
    code = f"""
import sys; sys.path.insert(0, {ROOT!r})
import torch, torch.distributed as dist
from hetgpt.run import checkpoint
from model import GPT, GPTConfig
dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)
model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
opt = torch.optim.AdamW(model.parameters())
checkpoint.save({str(out)!r}, 4, model, opt, {{}}, keep_last=2)
dist.destroy_process_group()
"""
    subprocess.run([sys.executable, '-c', code], env=env(), check=True, capture_output=True)
    assert sorted(d for d in os.listdir(out) if d.startswith('ckpt')) == ['ckpt_00000004', 'ckpt_00000010']


# -----------------------------------------------------------------------------
# 3. A stalled rank
def rank_pids(torchrun_pid):
    # torchrun's worker processes, by their RANK.
    pids = {}
    for child in open(f'/proc/{torchrun_pid}/task/{torchrun_pid}/children').read().split():
        environ = open(f'/proc/{child}/environ', 'rb').read().split(b'\0')
        ranks = [e.split(b'=', 1)[1] for e in environ if e.startswith(b'RANK=')]
        if ranks:
            pids[int(ranks[0])] = int(child)
    return pids


def test_a_stopped_rank_is_named_and_torchrun_restarts_the_group_which_resumes(work):
    out = work / 'stalled'
    args = RUN + ['--max_iters=400', '--checkpoint_interval=5', '--balance=even', '--stall_timeout=3',
                  f'--out_dir={out.name}', '--init_from=auto', '--log_interval=1']
    cmd = train_command(2, torchrun_args=['--max-restarts=1']) + args
    p = subprocess.Popen(cmd, cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    stopped = None
    for line in p.stdout:
        if line.startswith('iter 12: loss') and stopped is None:
            stopped = rank_pids(p.pid)[1]
            os.kill(stopped, signal.SIGSTOP)  # as a frozen GPU or a swapped-out host would
            t_stop = time.time()
            break
    rest, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    named = [line for line in err.splitlines() if 'stopped answering' in line]
    assert named and 'rank 1 (' in named[0] and f'pid {stopped}' in named[0], err[-3000:]
    assert 'resumed from' in rest and 'iter 400: val loss' in rest
    assert time.time() - t_stop < 120  # seconds, not gloo's default 30 minutes


def test_ranks_whose_torchrun_agent_is_killed_stop_with_a_checkpoint_that_resumes(work):
    # kill -9 of torchrun's agent: its ranks (sessions of their own) would train on headless to
    # max_iters. Each notices its parent gone, they agree, checkpoint at the step's end and exit.
    out = work / 'orphans'
    args = RUN + ['--max_iters=100000', '--checkpoint_interval=1000', '--balance=even',
                  '--stall_timeout=3', f'--out_dir={out.name}']
    p = subprocess.Popen(train_command(2) + args, cwd=work, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    ranks = {}
    try:
        for line in p.stdout:
            if line.startswith('iter 5: loss'):
                ranks = rank_pids(p.pid)
                p.kill()  # the agent alone: the ranks are not in its process group
                break
        p.wait()
        # the pipes close when the last rank has exited (stall_timeout 3 s, and slack)
        rest, err = p.communicate(timeout=60)
    finally:
        for pid in ranks.values():  # (a test that fails leaves no headless rank)
            if os.path.exists(f'/proc/{pid}'):
                os.kill(pid, signal.SIGKILL)
    assert len(ranks) == 2 and all(not alive(pid) for pid in ranks.values())
    lines = [line for line in err.splitlines() if line.startswith('error: ')]
    assert len(lines) == 1 and f"torchrun's agent (pid {p.pid}) is gone" in lines[0], err[-3000:]
    at = int(lines[0].split('stopped at iter ')[1].split()[0])
    assert latest_checkpoint(out).endswith(f'ckpt_{at:08d}')
    resumed = run_train(work, *RUN, f'--max_iters={at + 2}', f'--out_dir={out.name}',
                        '--init_from=resume')
    assert f'at iter {at}' in resumed.stdout and latest_checkpoint(out).endswith(f'ckpt_{at + 2:08d}')


def alive(pid):
    # Whether process pid runs (a zombie waiting for init to reap it does not)
    try:
        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'
    except FileNotFoundError:
        return False


# -----------------------------------------------------------------------------
# 4. One run per out_dir
def test_a_second_run_on_the_same_out_dir_is_refused_while_the_first_runs(work):
    out = work / 'locked'
    first = subprocess.Popen(train_command() + RUN + ['--max_iters=100000', f'--out_dir={out.name}'],
                             cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    for line in first.stdout:
        if line.startswith('iter 2: loss'):
            break
    p = run_train(work, *RUN, '--max_iters=4', f'--out_dir={out.name}', '--init_from=auto', check=False)
    assert f'pid {first.pid}' in one_error_line(p) and 'in use' in p.stderr
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    assert first.returncode == 0 and not (out / '.lock').exists()


def test_a_stale_lock_from_a_dead_process_is_taken_over(work):
    out = work / 'stale'
    os.makedirs(out)
    dead = subprocess.Popen(['true'])
    dead.wait()
    import socket
    (out / '.lock').write_text(json.dumps({'pid': dead.pid, 'host': socket.gethostname(), 'start': '1'}))
    run_train(work, *RUN, '--max_iters=2', f'--out_dir={out.name}')
    assert not (out / '.lock').exists() and (out / 'ckpt_00000002').exists()
    (out / '.lock').write_text(json.dumps({'pid': 1, 'host': 'another-host', 'start': '1'}))
    p = run_train(work, *RUN, '--max_iters=3', f'--out_dir={out.name}', '--init_from=auto', check=False)
    assert 'another-host' in one_error_line(p) and '.lock' in p.stderr


# -----------------------------------------------------------------------------
# 5. metrics.jsonl
def test_a_torn_metrics_line_is_skipped_on_resume(work, tmp_path):
    out = tmp_path / 'torn'
    shutil.copytree(work / 'ten', out)
    with open(out / 'metrics.jsonl', 'a') as f:
        f.write('{"iter": 11, "tokens": 3')  # a kill -9 mid-append
    run_train(work, *RUN, '--max_iters=12', f'--out_dir={out}', '--init_from=resume')
    rows = [json.loads(line) for line in open(out / 'metrics.jsonl')]  # every line parses
    assert [r['iter'] for r in rows if 'loss' in r] == list(range(1, 13))


def test_a_full_disk_for_metrics_is_one_warning_and_training_goes_on(work):
    # A real write failure: the file size limit (RLIMIT_FSIZE) makes appends past it fail with
    # EFBIG, as a full disk fails them with ENOSPC. No checkpoints, so only metrics grow.
    out = work / 'fsize'

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1200, 1200))
    p = subprocess.run(train_command() + RUN + ['--max_iters=12', '--checkpoint_interval=0',
                       f'--out_dir={out.name}'], cwd=work, env=env(), capture_output=True, text=True,
                       preexec_fn=limit, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    warnings = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and 'cannot append' in warnings[0] and 'metrics.jsonl' in warnings[0]
    assert 'iter 12: loss' in p.stdout
    assert os.path.getsize(out / 'metrics.jsonl') <= 1200


# -----------------------------------------------------------------------------
# 6. Every knob's range, walked from train.py's own table
def train_knobs():
    return train_defaults(), train_rules()


def wrong_values(default, rule):
    # A value of the wrong type, and values the rule text excludes (derived here, not from the code).
    wrong_type = 3 if isinstance(default, str) else 'many' if not isinstance(default, bool) else 2
    if isinstance(default, str):
        return [wrong_type] + (['no such choice!'] if rule not in ('', '.+') else [''] if rule else [])
    out = [wrong_type, float('nan')] if isinstance(default, float) else [wrong_type]
    if rule.startswith('>='):
        out.append(type(default)(float(rule[2:]) - 1))
    elif rule.startswith('>'):
        out.append(type(default)(float(rule[1:])))
    elif rule and rule[0] in '[(':
        low, high = (float(x) for x in rule[1:-1].split(','))
        out += [type(default)(high) if rule[-1] == ')' else high + 1, low - 1 if rule[0] == '[' else low]
    return out


def test_every_knob_has_a_rule_and_each_wrong_value_is_one_line(capsys):
    defaults, rules = train_knobs()
    assert set(rules) == set(defaults), set(rules) ^ set(defaults)
    walked = 0
    for key, default in defaults.items():
        for value in wrong_values(default, rules[key]):
            argv = [f'--{key}={value}'] if not isinstance(value, (int, float)) or isinstance(
                default, (int, float)) else []
            if not argv:  # a number for a string knob: only a config file can say that
                path = os.path.join(ROOT, 'tests', f'.knob_{os.getpid()}.py')
                open(path, 'w').write(f'{key} = {value!r}\n')
                argv = [path]
            try:
                with pytest.raises(SystemExit) as e:
                    knobs.configure(defaults, argv, rules=rules)
            finally:
                if argv[0].endswith('.py'):
                    os.remove(argv[0])
            err = capsys.readouterr().err.strip().splitlines()
            assert e.value.code == 2 and len(err) == 1 and key in err[0], (key, value, err)
            walked += 1
    assert walked >= 2 * len(defaults)
    # and the defaults themselves pass
    assert knobs.configure(defaults, [], rules=rules) == defaults


@pytest.mark.parametrize('arg', ['--beta2=1.0', '--seed=-1', '--max_bad_steps=0', '--init_std=0',
                                 '--adam_eps=-1e-8', '--plan=zero3', '--learning_rate=inf'])
def test_range_mistakes_end_to_end(work, arg):
    p = run_train(work, *RUN, '--max_iters=2', '--out_dir=never', arg, check=False)
    assert arg.split('=')[0][2:] in one_error_line(p)
    assert not (work / 'never').exists()


# -----------------------------------------------------------------------------
# 7. Signals
def test_ctrl_c_while_starting_is_one_line_and_writes_nothing(work):
    out = work / 'interrupted_early'
    p = subprocess.Popen(train_command() + RUN + ['--max_iters=4', f'--out_dir={out.name}'], cwd=work,
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.7)  # importing torch
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    p.stderr = err
    assert 'SIGINT' in one_error_line(p)
    assert not out.exists() or snapshot(out) == {}


def test_ctrl_c_during_a_long_eval_stops_without_waiting_for_it(work):
    # The first evaluation (iter 0) of 32,000 sequences takes many seconds; Ctrl-C one second into
    # it ends it, runs to the end of the next step, saves and exits.
    out = work / 'interrupted_eval'
    args = RUN + ['--max_iters=100', '--eval_iters=4000', f'--out_dir={out.name}']
    p = subprocess.Popen(train_command() + args, cwd=work, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if 'parameters;' in line:  # the line before the first evaluation
            time.sleep(1.0)
            p.send_signal(signal.SIGINT)
            t0 = time.time()
            break
    rest, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert 'stopped by a signal' in rest and 'val loss' not in rest
    assert time.time() - t0 < 10
    assert latest_checkpoint(out).endswith('ckpt_00000001')


# -----------------------------------------------------------------------------
# 8. Token ids past vocab_size, anywhere in the file, found at start-up
def test_a_bad_token_id_anywhere_is_found_before_training(work, tmp_path):
    make_dataset(tmp_path, 'late')
    path = tmp_path / 'data' / 'late' / 'train.bin'
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[-7] = 300  # past vocab_size=256, near the end: a random batch would find it late or never
    tokens.tofile(path)
    p = run_train(tmp_path, *RUN, '--dataset=late', '--max_iters=2', '--out_dir=late', check=False)
    assert '300' in one_error_line(p) and 'train.bin' in p.stderr
    assert not os.path.exists(tmp_path / 'late' / 'metrics.jsonl')
    tokens[-7] = 1  # fixed: the cached maximum must not be believed for the new file
    time.sleep(0.01)
    tokens.tofile(path)
    run_train(tmp_path, *RUN, '--dataset=late', '--max_iters=2', '--out_dir=late')


# -----------------------------------------------------------------------------
# 9. Torn or inconsistent checkpoint metadata
@pytest.mark.parametrize('damage', ['iter_text', 'model_args_int', 'json_list', 'iter_mismatch',
                                    'torn_json', 'no_distcp'])
def test_inconsistent_checkpoint_metadata_is_one_line_and_nothing_is_touched(work, tmp_path, damage):
    out = tmp_path / 'run'
    shutil.copytree(work / 'ten', out)
    ckpt = latest_checkpoint(out)
    meta_path = os.path.join(ckpt, 'hetgpt.json')
    meta = json.load(open(meta_path))
    broken = {'iter_text': {**meta, 'iter': '10'}, 'model_args_int': {**meta, 'model_args': 3},
              'json_list': [meta], 'iter_mismatch': {**meta, 'iter': 7}}
    if damage in broken:
        json.dump(broken[damage], open(meta_path, 'w'))
    elif damage == 'torn_json':
        open(meta_path, 'w').write(json.dumps(meta)[:40])
    else:
        for f in os.listdir(ckpt):
            if f.endswith('.distcp'):
                os.remove(os.path.join(ckpt, f))
    before = snapshot(out)
    p = run_train(work, *RUN, '--max_iters=12', f'--out_dir={out}', '--init_from=resume', check=False)
    assert 'damaged' in one_error_line(p) and 'ckpt_00000010' in p.stderr
    assert snapshot(out) == before


# -----------------------------------------------------------------------------
# 9. Resuming another run's way: another dataset, past max_iters; a short stall_timeout
def test_a_resume_on_another_dataset_is_one_line_and_goes_on_only_when_asked(work, tmp_path):
    out = tmp_path / 'run'
    shutil.copytree(work / 'ten', out)
    shutil.copytree(work / 'data' / 'synth', work / 'data' / 'other', dirs_exist_ok=True)
    before = snapshot(out)
    args = RUN + ['--max_iters=12', f'--out_dir={out}', '--init_from=resume', '--dataset=other']
    p = run_train(work, *args, check=False)
    line = one_error_line(p)
    assert "dataset='synth'" in line and 'new_dataset=True' in line, line
    assert snapshot(out) == before
    p = run_train(work, *args, '--new_dataset=True')
    assert 'iter 12: loss' in p.stdout and latest_checkpoint(out).endswith('ckpt_00000012')


def test_a_resume_with_another_optimizer_is_one_line(work, tmp_path):
    # an AdamW run resumed with optimizer=muon: its state is AdamW's, not a damaged checkpoint
    out = tmp_path / 'run'
    shutil.copytree(work / 'ten', out)
    before = snapshot(out)
    p = run_train(work, *RUN, '--max_iters=12', f'--out_dir={out}', '--init_from=auto',
                  '--optimizer=muon', check=False)
    line = one_error_line(p)
    assert "optimizer='adamw'" in line and 'damaged' not in line, line
    assert snapshot(out) == before


def test_a_resume_on_other_data_of_the_same_size_is_one_line(work, tmp_path):
    # the checkpoint's data replaced by other tokens of the same size, its times kept (cp -p over
    # it): the resume says so in one line and touches nothing (new_dataset=True and checkpoints
    # from before digests: tests/test_data_content.py)
    shutil.copytree(work / 'ten', tmp_path / 'run')
    shutil.copytree(work / 'data', tmp_path / 'data')
    path = tmp_path / 'data' / 'synth' / 'train.bin'
    st = path.stat()
    np.roll(np.fromfile(path, dtype=np.uint16), 1).tofile(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = snapshot(tmp_path / 'run')
    p = run_train(tmp_path, *RUN, '--max_iters=12', '--out_dir=run', '--init_from=resume',
                  check=False)
    line = one_error_line(p)
    assert 'trained on other data: data/synth/train.bin holds other content' in line, line
    assert 'new_dataset=True' in line and snapshot(tmp_path / 'run') == before


@pytest.mark.parametrize('max_iters', [10, 5])
def test_a_resume_past_max_iters_says_so_and_touches_nothing(work, tmp_path, max_iters):
    out = tmp_path / 'run'
    shutil.copytree(work / 'ten', out)
    before = snapshot(out)
    p = run_train(work, *RUN, f'--max_iters={max_iters}', f'--out_dir={out}', '--init_from=auto')
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1 and 'is at iter 10' in lines[0] and 'nothing to train' in lines[0], p.stdout
    assert p.stderr.strip() == '' and snapshot(out) == before


def test_a_short_stall_timeout_does_not_end_a_slow_start_up(work):
    # Compiling makes the start-up of 2 ranks take many seconds with every rank alive: with
    # stall_timeout=1 only a silent rank may end it (before: "a hung device?" on every rank).
    out = work / 'short_stall'
    p = run_train(work, *RUN, '--max_iters=6', f'--out_dir={out.name}', '--compile=True',
                  '--stall_timeout=1', '--balance=even', nproc=2, check=False)
    assert p.returncode == 0 and 'no progress' not in p.stderr, p.stderr[-3000:]
    assert latest_checkpoint(out).endswith('ckpt_00000006')


def test_a_stall_timeout_below_the_plans_step_is_one_line_before_training(work):
    # A batch whose predicted step is many times the tiny model's: stall_timeout=1 would end the
    # healthy run as "a hung device?"; refused after planning, before any step or file.
    out = work / 'short_stall_refused'
    p = run_train(work, *RUN, '--batch_size=8192', '--max_iters=2', '--stall_timeout=1',
                  f'--out_dir={out.name}', check=False)
    line = one_error_line(p)
    assert line.startswith('error: stall_timeout=1 ') and 'predicted at' in line
    assert int(line.split('at least ')[1].split()[0]) > 1
    assert not out.exists() or snapshot(out) == {}


@pytest.mark.parametrize('step,exchange', [(0.4, 0.0), (2.5, 30.0)])
def test_every_run_bound_refuses_below_its_least_value_and_takes_it(capsys, step, exchange):
    # knobs.run_bounds: each knob the run bounds, walked: one below the least value it names is
    # one line naming the knob; that value and 0 (off) pass.
    defaults = dict(train_defaults(), outer_interval=10)
    bounds = knobs.run_bounds(defaults, step, exchange)
    assert bounds
    for key, (least, _) in bounds.items():
        named = None
        for value in (math.ceil(least) - 1, math.ceil(least), 0):
            config = dict(defaults, **{key: value})
            if value and value < least:
                with pytest.raises(SystemExit) as e:
                    knobs.check_run(config, step, exchange)
                err = capsys.readouterr().err.strip().splitlines()
                assert e.value.code == 2 and len(err) == 1 and key in err[0], err
                named = int(err[0].split('at least ')[1].split()[0])
            else:
                knobs.check_run(config, step, exchange)
        assert named == math.ceil(least) >= step + exchange
