"""train.py end to end on CPU: exact gradients across ranks, exact resume, falling loss, bad input."""
import os
import shutil

import pytest
import torch

from trainer import (TINY, latest_checkpoint, load_params, make_dataset, max_rel_diff, metrics, one_error_line,
                     run_train, train_losses)


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp('train')
    make_dataset(root)
    for name in ('empty', 'odd', 'noval'):  # broken datasets for the bad-input tests
        d = make_dataset(root, name)
        open(os.path.join(d, 'train.bin'), 'wb').close() if name == 'empty' else None
        open(os.path.join(d, 'train.bin'), 'ab').write(b'x') if name == 'odd' else None
        os.remove(os.path.join(d, 'val.bin')) if name == 'noval' else None
    open(root / 'a_file', 'w').close()
    (root / 'bad_key.py').write_text("n_layer = 2\nlearnig_rate = 1e-3\n")
    (root / 'bad_code.py').write_text("n_layer = 1 / 0\n")
    return root


def test_two_ranks_with_accumulation_match_one_process(work):
    # Global batch 8: one process in one micro-batch against 2 gloo ranks × 2 micro-batches of 2.
    common = TINY + ['--batch_size=8', '--max_iters=3', '--eval_interval=100', '--balance=even']
    run_train(work, *common, '--out_dir=one', '--micro_batch_size=8')
    run_train(work, *common, '--out_dir=two', '--micro_batch_size=2', nproc=2)
    one, two = load_params(latest_checkpoint(work / 'one')), load_params(latest_checkpoint(work / 'two'))
    assert max_rel_diff(two, one) < 1e-6
    l1, l2 = train_losses(work / 'one'), train_losses(work / 'two')
    assert sorted(l1) == sorted(l2) == [1, 2, 3]
    for it in l1:  # the logged loss is the whole batch's, reduced over ranks
        assert abs(l1[it] - l2[it]) <= 1e-6 * abs(l1[it])


def test_resume_continues_exactly(work):
    common = TINY + ['--batch_size=4', '--eval_interval=2', '--checkpoint_interval=3']
    run_train(work, *common, '--out_dir=straight', '--max_iters=6')
    run_train(work, *common, '--out_dir=halves', '--max_iters=3')
    p = run_train(work, *common, '--out_dir=halves', '--max_iters=6', '--init_from=resume')
    # the load and the save say how big the checkpoint is (its files, measured here) and how long
    import re
    mb = sum(f.stat().st_size for f in (work / 'halves' / 'ckpt_00000006').iterdir()) / 1e6
    assert re.search(r'resumed from \S+ckpt_00000003 \([\d.]+ MB in [\d.]+ s\) at iter 3', p.stdout)
    assert re.search(rf'checkpoint written to \S+ckpt_00000006 \({mb:.1f} MB in [\d.]+ s\)', p.stdout)
    a, b = load_params(latest_checkpoint(work / 'straight')), load_params(latest_checkpoint(work / 'halves'))
    assert all((a[k] == b[k]).all() for k in a)
    assert metrics(work / 'straight') != [] and train_losses(work / 'straight') == train_losses(work / 'halves')
    vals = lambda d: {r['iter']: r['val_loss'] for r in metrics(d) if 'val_loss' in r}
    straight, halves = vals(work / 'straight'), vals(work / 'halves')  # halves also evaluated at its stop
    assert straight == {it: halves[it] for it in straight}


def test_loss_falls_and_log_line_has_progress(work):
    # with wandb on and no network, API key or login: it logs offline and never stops the run
    no_login = {'WANDB_API_KEY': '', 'NETRC': str(work / 'no_netrc')}
    p = run_train(work, *TINY, '--batch_size=8', '--max_iters=40', '--eval_interval=20', '--out_dir=falls',
                  '--log_interval=10', '--wandb_log=True', env=no_login)
    losses = train_losses(work / 'falls')
    assert losses[40] < losses[10] - 0.5, losses
    line = [ln for ln in p.stdout.splitlines() if ln.startswith('iter 40: loss')][0]
    for word in ('tok/s', 'mfu n/a', 'mem', 'eta', 'lr'):
        assert word in line
    assert 'host memory: ' in p.stdout and ', available now (/proc/meminfo MemAvailable)' in p.stdout
    row = [r for r in metrics(work / 'falls') if r.get('loss') is not None][-1]
    assert {'iter', 'loss', 'lr', 'tokens_per_sec', 'mfu'} <= set(row)
    assert any(d.startswith('offline-run') for d in os.listdir(work / 'falls' / 'wandb'))
    # resumed, the same W&B run goes on: its id is kept in out_dir
    run_train(work, *TINY, '--batch_size=8', '--max_iters=42', '--eval_interval=20', '--out_dir=falls',
              '--log_interval=10', '--wandb_log=True', '--init_from=resume', env=no_login)
    kept = (work / 'falls' / 'wandb_id').read_text().strip()
    runs = [d for d in os.listdir(work / 'falls' / 'wandb') if d.startswith('offline-run')]
    assert len(runs) == 2 and all(d.endswith('-' + kept) for d in runs), (kept, runs)


def test_wandb_is_online_when_logged_in(tmp_path, monkeypatch):
    # `wandb login` writes the key into ~/.netrc for wandb's host: that is logged in, as
    # WANDB_API_KEY is; another host's entry is not
    from hetgpt.run.metrics import wandb_logged_in
    monkeypatch.delenv('WANDB_API_KEY', raising=False)
    monkeypatch.delenv('WANDB_BASE_URL', raising=False)
    netrc = tmp_path / 'netrc'
    monkeypatch.setenv('NETRC', str(netrc))
    assert not wandb_logged_in()  # no such file
    netrc.write_text('machine example.com\n  login user\n  password abc\n')
    netrc.chmod(0o600)
    assert not wandb_logged_in()
    netrc.write_text('machine api.wandb.ai\n  login user\n  password ' + 'k' * 40 + '\n')
    assert wandb_logged_in()
    monkeypatch.setenv('WANDB_BASE_URL', 'https://wandb.example.com')  # a server of one's own
    assert not wandb_logged_in()
    monkeypatch.setenv('WANDB_API_KEY', 'k' * 40)
    assert wandb_logged_in()


def test_training_imports_neither_wandb_nor_datasets_unless_asked(work):
    # train.py as its command line runs it, in a process that says at its end which of the
    # optional packages were imported: none of them without wandb_log (wandb costs about 0.9 CPU-s
    # of start-up, datasets 1.4: bench/RESULTS.md)
    import subprocess
    import sys
    from trainer import ROOT
    code = ("import runpy, sys\n"
            "sys.argv = sys.argv[1:]; sys.path.insert(0, sys.argv[0].rpartition('/')[0])\n"
            "try: runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "finally: print('imported', sorted("
            "{'wandb', 'datasets', 'pandas', 'transformers'} & set(sys.modules)))")
    p = subprocess.run([sys.executable, '-c', code, os.path.join(ROOT, 'train.py'), *TINY,
                        '--batch_size=8', '--max_iters=1', '--out_dir=lean'], cwd=work,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore'))
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == 'imported []', p.stdout + p.stderr


def test_keep_last_keeps_n_checkpoints(work):
    run_train(work, *TINY, '--batch_size=2', '--max_iters=4', '--checkpoint_interval=1', '--keep_last=2',
              '--out_dir=keep', '--eval_interval=100')
    assert sorted(os.listdir(work / 'keep')) == ['ckpt_00000003', 'ckpt_00000004', 'measured.json', 'metrics.jsonl']


# Mistakes that configure() meets (a typo'd key, a value of the wrong type or out of its rule, a
# config file that cannot be read or run): checked in this process, knobs.configure with the
# defaults and RULES train.py hands it (read from train.py as test_hardening reads them). The others
# go past configure() into train.py's own checks: each a process. (The end to end contract for a
# configure() mistake: test_hardening's test_range_mistakes_end_to_end.)
CONFIG_MISTAKES = [
    (['--lerning_rate=1e-3'], ['unknown config key', 'learning_rate']),
    (['--batch_size=eight'], ['batch_size', 'expected int']),
    (['--n_layer=0'], ['n_layer', '[1, 100000]']),
    (['--plan=zero3'], ['plan', 'fsdp']),
    (['--max_iters'], ['--key=value']),
    (['--batch_size=-4'], ['batch_size', '[1, 16777216]']),
    (['--learning_rate=-1.0'], ['learning_rate']),
    (['--warmup_iters=-1'], ['warmup_iters']),
    (['--weight_decay=-0.1'], ['weight_decay']),
    (['--dropout=1.5'], ['dropout']),
    (['--memory_fraction=0.0'], ['memory_fraction']),
    (['--dtype=float8'], ['dtype', 'bfloat16']),
    (['--device=tpu'], ['device', 'cpu']),
    (['--init_from=scrach'], ['init_from', 'scratch']),
    (['--init_device=gpu'], ['init_device', 'meta']),
    (['nothere.py'], ['cannot read config file', 'configs/']),
    (['bad_key.py'], ['unknown config key', 'learning_rate', 'bad_key.py']),
    (['bad_code.py'], ['does not run', 'ZeroDivisionError']),
]


@pytest.mark.parametrize('args, words', CONFIG_MISTAKES)
def test_bad_config_is_one_line(work, args, words, monkeypatch, capsys):
    from hetgpt import knobs
    from test_hardening import train_knobs
    defaults, rules = train_knobs()
    monkeypatch.chdir(work)  # where the config files are, as for train.py
    with pytest.raises(SystemExit) as e:
        knobs.configure(defaults, [*TINY, '--batch_size=2', '--max_iters=1', *args], rules=rules)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert e.value.code == 2 and not out and len(lines) == 1 and lines[0].startswith('error: '), err
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize('args, words', [
    (['--n_embd=30', '--n_head=4'], ['not divisible']),
    (['--dataset=nothere'], ['python data/prepare.py']),
    (['--balance=1,2,3'], ['balance', 'weights']),
    (['--init_from=resume', '--out_dir=empty'], ['no checkpoint']),
    (['--block_size=100000'], ['fewer than block_size']),
    (['--min_lr=1.0'], ['min_lr', 'above learning_rate']),
    (['--device=cuda'], ['--device=cpu']),
    (['--plan=ddp', '--memory_fraction=0.00001'], ['does not fit']),
    (['--out_dir=a_file/out'], ['not writable', 'out_dir']),
    (['--dataset=empty'], ['0 tokens', 'block_size']),
    (['--dataset=odd'], ['truncated', 'prepare.py']),
    (['--dataset=noval'], ['val.bin', 'python data/prepare.py']),
    (['--vocab_size=100'], ['token id', 'vocab_size=100']),
])
def test_bad_input_exits_with_one_line(work, args, words):
    p = run_train(work, *TINY, '--batch_size=2', '--max_iters=1', *args, check=False)
    line = one_error_line(p)
    for w in words:
        assert w in line, line


@pytest.fixture(scope='module')
def one_step(work):
    # One step and its checkpoint (ckpt_00000001), planned with a stated host memory: its log is read
    # by test_a_stated_host_memory..., and each test that resumes or damages it takes a copy
    p = run_train(work, *TINY, '--batch_size=2', '--max_iters=1', '--out_dir=one_step', '--eval_interval=100',
                  env={'HETGPT_HOST_MEM_GIB': '64'})
    return work / 'one_step', p.stdout


def test_checkpoint_of_another_model_is_refused(work, one_step):
    shutil.copytree(one_step[0], work / 'other')
    p = run_train(work, *TINY, '--batch_size=2', '--max_iters=2', '--out_dir=other', '--init_from=resume',
                  '--n_layer=3', check=False)
    assert p.returncode != 0 and 'another model' in p.stderr and 'n_layer' in p.stderr
    assert os.path.exists(work / 'other' / 'ckpt_00000001' / 'hetgpt.json')  # nothing lost


def test_checkpoint_of_an_edited_model_py_is_another_model_not_damaged(work, one_step, tmp_path):
    # model.py edited (a narrower MLP) and the run resumed, or sampled: the same model_args, other
    # weights. One line that names the weights and what to do; the checkpoint stays as it was.
    import subprocess
    import sys
    from trainer import edited_copy
    code = edited_copy(tmp_path / 'code', 'model.py', '4 * C', '3 * C')  # (every one: the MLP's)
    shutil.copytree(one_step[0], work / 'edited')
    before = sorted(os.listdir(work / 'edited' / 'ckpt_00000001'))
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    runs = [[code / 'train.py', *TINY, '--batch_size=2', '--max_iters=2', '--out_dir=edited',
             '--init_from=resume'],
            [code / 'sample.py', '--out_dir=edited', '--device=cpu', '--max_new_tokens=2']]
    for args in runs:
        p = subprocess.run([sys.executable, *map(str, args)], cwd=work, capture_output=True,
                           text=True, timeout=300, env=env)
        line = one_error_line(p)
        assert 'written by another model' in line and 'damaged' not in line, line
        assert 'mlp.c_fc.weight 128×32 there, 96×32 here' in line, line
        assert sorted(os.listdir(work / 'edited' / 'ckpt_00000001')) == before


class Payload:  # what a tampered checkpoint could hold: unpickling it would run a shell command
    def __reduce__(self):
        return (os.system, ('touch PWNED',))


@pytest.mark.parametrize('damage', ['garbage', 'no_meta', 'tampered'])
def test_damaged_checkpoint_is_named_and_kept(work, one_step, damage):
    out = work / f'damaged_{damage}'
    shutil.copytree(one_step[0], out)
    ckpt = out / 'ckpt_00000001'
    if damage == 'garbage':
        for f in os.listdir(ckpt):
            if f.endswith('.distcp'):
                (ckpt / f).write_bytes(b'not a checkpoint')
    elif damage == 'no_meta':
        os.remove(ckpt / 'hetgpt.json')
    else:
        import pickle
        (ckpt / '.metadata').write_bytes(pickle.dumps(Payload()))
    p = run_train(work, *TINY, '--batch_size=2', '--max_iters=2', f'--out_dir={out.name}', '--init_from=resume',
                  check=False)
    line = one_error_line(p)
    assert 'damaged' in line and 'ckpt_00000001' in line, line
    assert ckpt.exists()  # nothing deleted
    assert not (work / 'PWNED').exists()  # and nothing run


def test_a_stated_host_memory_is_the_one_planned_with(work, one_step):
    # HETGPT_HOST_MEM_GIB instead of MemAvailable: the plan's table says which figure it used, and
    # a CPU rank's memory is its share of it (so a host stated too small fits nothing)
    stdout = one_step[1]  # (HETGPT_HOST_MEM_GIB=64)
    assert 'host memory: 64 GiB per node, stated (HETGPT_HOST_MEM_GIB)' in stdout, stdout
    p = run_train(work, *TINY, '--batch_size=2', '--max_iters=1', '--out_dir=host_small', check=False,
                  env={'HETGPT_HOST_MEM_GIB': '0.05'})
    assert p.returncode == 2 and p.stderr.startswith('error: plan=auto does not fit'), p.stderr
    assert 'budget 0.0' in p.stderr  # 90% of 0.05 GiB


def bad_host_memory_line(stated):
    return f"error: HETGPT_HOST_MEM_GIB={stated}: give GiB > 0, one number: this node's host memory"


@pytest.mark.parametrize('stated', ['abc', '0', '-1', 'inf', '64,64'])
def test_a_bad_stated_host_memory_is_one_line(monkeypatch, capsys, stated):
    # the variable's one reader (hardware.stated_host_memory, which train.py's plan calls), here;
    # end to end: the test below
    from hetgpt import hardware
    monkeypatch.setenv('HETGPT_HOST_MEM_GIB', stated)
    with pytest.raises(SystemExit) as e:
        hardware.stated_host_memory()
    out, err = capsys.readouterr()
    assert e.value.code == 2 and not out and err.splitlines() == [err.strip()], err
    assert err.startswith(bad_host_memory_line(stated)), err


def test_a_bad_stated_host_memory_ends_train_py_in_one_line_before_any_step(work):
    p = run_train(work, *TINY, '--batch_size=2', '--max_iters=1', '--out_dir=host_bad', check=False,
                  env={'HETGPT_HOST_MEM_GIB': '64,64'})
    assert one_error_line(p).startswith(bad_host_memory_line('64,64'))
    assert not (work / 'host_bad' / 'metrics.jsonl').exists()


def test_more_ranks_than_sequences_is_refused(work):
    p = run_train(work, *TINY, '--batch_size=1', '--max_iters=1', nproc=2, check=False)
    assert p.returncode != 0 and 'cannot feed 2 ranks' in p.stderr


def test_compiled_training_matches_eager_and_the_log_says_how_it_ran(work):
    # compile=True is the default (TINY turns it off for speed): the compiled blocks and loss kernel
    # must train the same model. float32 here, so the only difference is the order of float sums.
    common = TINY + ['--batch_size=4', '--max_iters=3', '--eval_interval=100']
    run_train(work, *common, '--out_dir=eager')
    p = run_train(work, *common, '--out_dir=compiled', '--compile=True', timeout=900)
    compiler = shutil.which('g++') or shutil.which('c++')  # without one, train.py runs eager and says so
    assert ('on cpu, compiled;' if compiler else 'eager: no C++ compiler') in p.stdout
    eager, compiled = train_losses(work / 'eager'), train_losses(work / 'compiled')
    assert sorted(eager) == sorted(compiled) == [1, 2, 3]
    assert all(abs(eager[it] - compiled[it]) <= 1e-5 * eager[it] for it in eager), (eager, compiled)
    a, b = load_params(latest_checkpoint(work / 'eager')), load_params(latest_checkpoint(work / 'compiled'))
    assert max_rel_diff(b, a) < 1e-4
    # dtype=auto: bfloat16 when this CPU has it natively, float32 otherwise, and the plan says which
    p = run_train(work, *TINY, '--batch_size=2', '--max_iters=1', '--dtype=auto', '--out_dir=auto')
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert f" parameters, {'bfloat16' if native else 'float32'}, batch " in p.stdout, p.stdout


def test_per_group_learning_rates_keep_their_ratio_through_warmup_and_decay(tmp_path):
    # A researcher's edit: the no-decay group (biases, LayerNorm gains) at a tenth of the learning
    # rate, set in make_optimizer. The schedule scales each group's own lr (before, the loop wrote
    # one lr into every group and the tenth was lost). Read back from the checkpoints the run
    # writes: in warmup (iter 1), at its end, and in the cosine decay, against the formula.
    import importlib.util
    import math
    import subprocess
    import sys
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from trainer import edited_copy
    from hetgpt.run import checkpoint
    one = "{'params': other, 'weight_decay': 0.0"
    code = edited_copy(tmp_path / 'code', 'model.py', one,
                       one + ", 'lr': config['learning_rate'] / 10")
    make_dataset(tmp_path)
    args = TINY + ['--batch_size=4', '--max_iters=12', '--eval_interval=100',
                   '--checkpoint_interval=1', '--keep_last=100', '--out_dir=out']
    p = subprocess.run([sys.executable, str(code / 'train.py'), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore'))
    assert p.returncode == 0, p.stderr[-3000:]
    spec = importlib.util.spec_from_file_location('edited_model', code / 'model.py')
    edited = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(edited)
    model = edited.GPT(edited.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32,
                                        vocab_size=256, bias=False))
    base, low, warmup, decay = 3e-3, 3e-4, 2, 20  # TINY's learning_rate, min_lr, warmup, decay
    for it in (1, 2, 3, 8, 12):
        optimizer = edited.make_optimizer(model, dict(learning_rate=base, weight_decay=0.1,
                                                      beta1=0.9, beta2=0.95, adam_eps=1e-8))
        _, state = get_state_dict(model, optimizer)
        checkpoint.read(str(tmp_path / 'out' / f'ckpt_{it:08d}'), {'optim': state})
        lrs = [g['lr'] for g in state['param_groups']]
        step = it - 1  # the lr of the update that made checkpoint it
        want = base * (step + 1) / (warmup + 1) if step < warmup else \
            low + 0.5 * (1 + math.cos(math.pi * (step - warmup) / (decay - warmup))) * (base - low)
        assert lrs[0] == pytest.approx(want, rel=1e-12), (it, lrs)
        assert lrs[1] == pytest.approx(want / 10, rel=1e-12), (it, lrs)
    assert 'grad norm' in p.stdout and all('grad_norm' in r for r in metrics(tmp_path / 'out')
                                           if 'loss' in r)


@pytest.mark.parametrize('seconds, shown', [(0, '0m00s'), (59.4, '0m59s'), (3000, '50m00s'),
                                            (6600, '1h50m'), (86399, '23h59m'),
                                            (90000, '1d01h')])
def test_the_eta_shows_two_units_truncated(seconds, shown):
    # 3,000 s is 50 minutes (not "1h50m"); the larger unit first, the smaller truncated
    from hetgpt.planner.plan import duration
    assert duration(seconds) == shown
