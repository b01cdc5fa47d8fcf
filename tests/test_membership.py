"""Ranks that differ in memory, and ranks that come and go (torchrun's elastic agents)."""
import os
import re
import time

import numpy as np
import pytest

from trainer import (ROOT, TINY, latest_checkpoint, load_params, make_dataset, max_rel_diff, metrics,
                     one_error_line, plan_rows, run_train)

# Longer sequences than TINY's, so that activations, not the process, decide what fits in a few
# hundred MiB: 6 layers × 64 wide × 1024 tokens, float32.
WIDE = [a for a in TINY if not a.startswith(('--n_layer', '--n_embd', '--block_size'))] + [
    '--n_layer=6', '--n_embd=64', '--block_size=1024', '--batch_size=8', '--max_iters=3',
    '--eval_interval=100', '--eval_iters=1']


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp('membership')
    make_dataset(root)
    run_train(root, *WIDE, '--out_dir=one')
    return root


def plan_and_first_step(stdout):
    # The plan table's rows: rank -> (share, micro-batch, count, checkpointing); and what each rank
    # says it ran in the first step: rank -> micro-batch sizes
    table = plan_rows(stdout)
    first = stdout[stdout.index('iter 1: loss'):stdout.index('iter 2: loss')]
    ran = {int(m[1]): [int(x) for x in m[2].split('+')]
           for m in re.finditer(r'rank (\d+): \d+ seq in ([\d+]+)', first)}
    return table, ran


def budget_for(work, sequences):
    # Bytes of a rank's budget between the planner's predictions for `sequences` and one more, on
    # this machine: a run where both ranks have room says what it predicts for 4 (its CPU
    # process as measured at start-up included); the planner's own difference per sequence,
    # which the process does not change, gives the rest.
    from hetgpt.planner import memory  # noqa: E402
    from model import GPTConfig
    run_train(work, *WIDE, '--out_dir=roomy', '--balance=even', nproc=2)
    at_4 = metrics(work / 'roomy')[0]['pred_gib'] * 2**30
    cfg = GPTConfig(n_layer=6, n_head=2, n_embd=64, block_size=1024, vocab_size=256, bias=False)
    at = lambda b: memory.estimate(cfg, 'ddp', b, 2, dtype='float32', device='cpu')['total']
    return at_4 - at(4) + at(sequences) + 0.6 * (at(sequences + 1) - at(sequences))


@pytest.mark.parametrize('case', ['planned', 'probed'])
def test_ranks_of_different_stated_memory(work, case):
    # planned: rank 0 may use 4 GiB (HETGPT_MEM_GIB, per local rank), rank 1 what the planner
    # says holds 2 sequences, not 3: it gives rank 1 a smaller micro-batch than rank 0, and the
    # probe step finds it fits. (A rank that cannot hold one sequence without activation
    # checkpointing checkpoints alone: tests/test_plan.py.) probed: rank 1 has 1.2 GiB, and its
    # forward holds 0.25 GiB per sequence that the planner does not know of, so the probe step
    # finds it over budget and halves its micro-batch until it fits. Either way each rank runs
    # what the table says, and the weights after 3 steps are those of one process.
    # (balance=even: 4 sequences each, whatever the ranks' measured speeds.)
    env = {'HETGPT_MEM_GIB': f'4,{budget_for(work, 2) / 0.9 / 2**30:.4f}'} if case == 'planned' \
        else {'HETGPT_MEM_GIB': '4,1.2', 'HETGPT_TEST_HIDDEN_MEM': '1:0.25'}
    p = run_train(work, *WIDE, f'--out_dir={case}', '--balance=even', nproc=2, faults=True, env=env)
    table, ran = plan_and_first_step(p.stdout)
    assert sorted(table) == sorted(ran) == [0, 1], p.stdout
    for r in (0, 1):
        share, micro, count, _ = table[r]
        assert (share, micro, count) == (sum(ran[r]), max(ran[r]), len(ran[r])), p.stdout
    assert table[1][1] < table[0][1], p.stdout  # the tight rank's micro-batch is smaller
    if case == 'planned':
        assert table[1][1] == 2 and 'out of memory in the probe step' not in p.stdout, p.stdout
    else:
        caps = re.findall(r'out of memory in the probe step: micro-batches now \[(\d+), (\d+)\]',
                          p.stdout)  # rank 1's halved, rank 0's left as planned
        assert caps and len({c[0] for c in caps}) == 1 and table[1][1] <= int(caps[-1][1]) <= 2
    one, two = load_params(latest_checkpoint(work / 'one')), load_params(latest_checkpoint(work / case))
    assert max_rel_diff(two, one) < 1e-5


def test_a_machine_leaves_then_another_joins_and_the_run_is_the_same_run(tmp_path):
    # Two torchrun agents (one rank each) train; one is killed, agent and worker, at a random moment
    # after the first checkpoint; the other restarts its worker, which re-plans for one rank and
    # resumes from the last checkpoint; a third agent then joins, both restart and resume from the
    # checkpoint the survivor wrote as it stopped, and the run ends at max_iters. Every loss
    # logged, steps redone included, is the loss an uninterrupted 1-process run logged at that step.
    import numpy as np
    from elastic_run import leave_and_join
    make_dataset(tmp_path)
    args = TINY + ['--batch_size=4', '--max_iters=40', '--eval_interval=100', '--checkpoint_interval=4',
                   '--keep_last=2', '--init_from=auto', '--stall_timeout=60']
    straight = run_train(tmp_path, *args, '--out_dir=straight').stdout
    seed = int(time.time())
    kill_after = np.random.default_rng(seed).uniform(0.0, 2.0)
    # every forward 0.1 s longer per sequence, so that the run lasts long enough to be interrupted
    (a, b, c), events = leave_and_join(
        tmp_path, 'elastic', args + ['--out_dir=elastic'], kill_after,
        rdzv_conf='last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3',
        env={'HETGPT_TEST_SLOW_RANK': '*:0.1'})
    log = '\n'.join(agent.text() for agent in (a, b, c))
    why = f"(seed {seed}, killed {kill_after:.2f} s after the first checkpoint)\n{log}"
    expected = {int(k): float(v) for k, v in re.findall(r'iter (\d+): loss ([\d.]+)', straight)}
    logged = [(int(k), float(v)) for k, v in re.findall(r'iter (\d+): loss ([\d.]+)', log)]
    assert {k for k, _ in logged} == set(expected), why  # every step logged, some twice
    assert all(abs(v - expected[k]) <= 1e-5 * expected[k] for k, v in logged), why
    # who left, then who joined, each time from the newest checkpoint: after the kill, one at or
    # after the step the killed machine was in; after the join, the one written on the way out
    resumes = re.findall(r'resumed from \S+ckpt_(\d+) \([\d.]+ [MG]B in [\d.]+ s\) at iter (\d+); (.*)', log)
    assert len(resumes) == 2 and resumes[0][2].startswith('2 rank(s) then, 1 now; left: '), why
    assert resumes[1][2].startswith('1 rank(s) then, 2 now; joined: '), why
    stopped = re.findall(r'iter (\d+): stopped by a signal; checkpoint saved', a.text())
    assert stopped and int(stopped[-1]) == int(resumes[1][0]), why
    assert int(resumes[0][0]) >= events['newest_at_leave'], why
    # the survivor's worker said why it stopped in one line, not a traceback
    assert 'a collective failed, another rank is probably gone' in a.text(), why
    assert 'Traceback' not in a.text(), why
    one, two = load_params(latest_checkpoint(tmp_path / 'straight')), load_params(latest_checkpoint(tmp_path / 'elastic'))
    assert latest_checkpoint(tmp_path / 'elastic').endswith('ckpt_00000040')
    assert max_rel_diff(two, one) < 1e-5


@pytest.mark.parametrize('stated', ['abc', '0', '-1', 'inf', '4,'])
def test_a_bad_stated_memory_is_one_line(monkeypatch, capsys, stated):
    # the variable's one reader, as train.py calls it for a CPU rank (local rank 0), here; end to
    # end: the test below
    from hetgpt import hardware
    monkeypatch.setenv('HETGPT_MEM_GIB', stated)
    with pytest.raises(SystemExit) as e:
        hardware.stated_memory(0, 'cpu')
    out, err = capsys.readouterr()
    assert e.value.code == 2 and not out and err.splitlines() == [err.strip()], err
    assert err.startswith(f'error: HETGPT_MEM_GIB={stated}: give GiB > 0'), err


def test_a_bad_stated_memory_ends_train_py_in_one_line_before_any_step(tmp_path):
    make_dataset(tmp_path)
    p = run_train(tmp_path, *WIDE, '--out_dir=bad_mem', check=False, env={'HETGPT_MEM_GIB': '4,'})
    assert one_error_line(p).startswith('error: HETGPT_MEM_GIB=4,: give GiB > 0')
    assert not (tmp_path / 'bad_mem' / 'metrics.jsonl').exists()


def test_a_machine_of_another_run_that_joins_leaves_and_the_run_goes_on(tmp_path):
    # One agent trains; a machine joins with another config (--n_layer=3), then one whose model.py
    # has ReLU for GELU (same shapes: DDP would average two different models without a word). Each
    # says in one line what differs and leaves; the first goes on, and every loss it logged is the
    # loss an uninterrupted 1-process run logged at that step. (Each machine joins while the run has
    # seconds left: one that came after its end would find nothing to train and exit 0.)
    from elastic_run import Agent, free_port, wait_for
    from trainer import edited_copy
    make_dataset(tmp_path)
    args = TINY + ['--batch_size=4', '--max_iters=48', '--eval_interval=100', '--checkpoint_interval=4',
                   '--keep_last=2', '--init_from=auto', '--stall_timeout=60']
    straight = run_train(tmp_path, *args, '--out_dir=straight').stdout
    relu = edited_copy(tmp_path / 'relu', 'model.py', "nn.GELU(approximate='tanh')", 'nn.ReLU()')
    port, conf = free_port(), 'last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3'
    agent = lambda name, extra=(), root=ROOT: Agent(
        name, tmp_path, args + ['--out_dir=elastic', *extra], port, rdzv_conf=conf, root=root,
        env={'HETGPT_TEST_SLOW_RANK': '*:0.1'})
    a = agent('A')
    steps = lambda: len(re.findall(r'iter \d+: loss', a.text()))
    joiners = []
    try:
        for extra, root, differs in ((['--n_layer=3'], ROOT, 'n_layer=3 where the run has 2'),
                                     ((), str(relu), 'another model.py')):
            before = steps()
            assert wait_for(lambda: steps() >= before + 2, 120), a.text()
            joiners.append(agent(f'odd{len(joiners)}', extra, root))
            assert joiners[-1].wait(120) != 0, joiners[-1].text() + "\n=====A\n" + a.text()
            out = joiners[-1].text()
            errors = [line for line in out.splitlines() if 'error:' in line]
            assert len(errors) == 1 and differs in errors[0] and 'leaves' in errors[0], out
            assert 'Traceback' not in out, out
        assert a.wait(300) == 0, a.text()[-5000:]
    finally:
        for x in [a] + joiners:
            if x.p.poll() is None:
                x.wait(0)
    log = a.text()
    assert log.count('run another run') == 2, log
    expected = {int(k): float(v) for k, v in re.findall(r'iter (\d+): loss ([\d.]+)', straight)}
    logged = [(int(k), float(v)) for k, v in re.findall(r'iter (\d+): loss ([\d.]+)', log)]
    assert {k for k, _ in logged} == set(expected), log
    assert all(abs(v - expected[k]) <= 1e-5 * expected[k] for k, v in logged), log
    one = load_params(latest_checkpoint(tmp_path / 'straight'))
    two = load_params(latest_checkpoint(tmp_path / 'elastic'))
    assert latest_checkpoint(tmp_path / 'elastic').endswith('ckpt_00000048')
    assert max_rel_diff(two, one) < 1e-5


def test_a_machine_whose_data_has_other_bytes_of_the_same_size_runs_another_run(tmp_path):
    # membership's fingerprint at function level (the elastic run above is the real path): two
    # machines' data of the same sizes, one train.bin with other bytes (its times kept, as cp -p
    # or rsync -t leave them), are two runs, and the words say that the content differs
    from hetgpt.run import membership
    mine, theirs = make_dataset(tmp_path / 'mine'), make_dataset(tmp_path / 'theirs')
    path = os.path.join(theirs, 'train.bin')
    st = os.stat(path)
    tokens = np.fromfile(path, dtype=np.uint16)
    np.roll(tokens, 1).tofile(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    config = {'n_layer': 2}
    prints = [membership.fingerprint(config, [os.path.join(d, f'{s}.bin') for s in ('train', 'val')])
              for d in (mine, theirs)]
    assert prints[0]['data']['val.bin'] == prints[1]['data']['val.bin']
    assert prints[0] != prints[1] and prints[0]['code'] == prints[1]['code']
    said = membership.differences(prints[1], prints[0])
    assert said.startswith('another train.bin (its content differs') and 'val.bin' not in said
    assert membership.differences(prints[0], prints[0]) == ''
