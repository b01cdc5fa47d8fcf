"""The two-machine rehearsal: two network namespaces joined by a veth pair whose rate a token bucket
holds (100 Mbit/s and 1 Gbit/s), one torchrun agent in each, a c10d rendezvous on the first's
address and gloo, as docs/two_machines.md runs two machines. The ordinary path crosses the link: DDP
trains and writes a checkpoint, FSDP resumes it, and the weights and losses are a one-process run's;
each step as measured against plan.py's prediction for that link, from the one-process run's speed.
Skipped, in one line, where namespaces cannot be made (not root, no iproute2)."""
import statistics

import pytest

from nodes import Netns, NetnsUnavailable, agents, ok
from trainer import (TINY, latest_checkpoint, load_params, make_dataset, max_rel_diff, metrics,
                     run_train, train_losses)

# A model whose gradients outweigh its compute: 6.44M parameters (26 MB of float32 gradients: 2.2 s
# at 100 Mbit/s, 0.22 s at 1 Gbit/s), 8 × 32 tokens a step (tens of ms of compute)
MODEL = ['--n_embd=512', '--batch_size=8', '--eval_interval=100', '--balance=even']
KNOBS = ['--n_layer=2', '--n_head=2', '--n_embd=512', '--block_size=32', '--vocab_size=256',
         '--bias=False', '--batch_size=8', '--micro_batch_size=4']
RATES = {100e6: 0.1, 1e9: 1.0}  # bits/s: Gbit/s


@pytest.fixture(scope='module')
def net():
    try:
        net = Netns().up()
    except NetnsUnavailable as e:
        pytest.skip(f"two-machine rehearsal: network namespaces cannot be made here ({e})")
    yield net
    net.down()


def step_seconds(out_dir, iters):
    # the median step of these iters, from their rows' tokens/s (log_interval=1)
    rows = {r['iter']: r for r in metrics(out_dir) if 'tokens_per_sec' in r}
    return statistics.median(8 * 32 / rows[i]['tokens_per_sec'] for i in iters)


def predicted(strategy, gbit, gflops, capsys):
    import plan
    assert plan.main(['configs/gpt_tiny.py', *KNOBS, '--gpus', '2xcpu', '--host_mem', '16',
                      '--nodes', '2', '--link_gbit', str(gbit), '--cpu_gflops', str(gflops),
                      '--plan', strategy, '--dtype', 'float32']) == 0
    out = capsys.readouterr().out
    return float(out.split('predicted: step ')[1].split(' s')[0])


def test_two_machines_over_a_slow_link(net, tmp_path, capsys):
    make_dataset(tmp_path)
    run_train(tmp_path, *TINY, *MODEL, '--out_dir=one', '--max_iters=12', '--plan=ddp',
              '--micro_batch_size=8')
    # DDP, 8 steps: 1-4 at 100 Mbit/s, 5-8 at 1 Gbit/s (the bucket changed as step 5 starts),
    # then its checkpoint resumed by FSDP for steps 9-12 at 100 Mbit/s
    net.rate(100e6)
    switch = lambda line: line.startswith('iter 4: loss') and net.rate(1e9)
    out = ok(agents(tmp_path, [*TINY, *MODEL, '--out_dir=two', '--max_iters=8', '--plan=ddp',
                               '--micro_batch_size=4'], net.hosts, namespaces=net.names,
                    on_line=switch))
    assert 'shares [4, 4]' in out, out
    net.rate(100e6)
    out = ok(agents(tmp_path, [*TINY, *MODEL, '--out_dir=two', '--max_iters=12', '--plan=fsdp',
                               '--micro_batch_size=4', '--init_from=resume'], net.hosts,
                    namespaces=net.names))
    assert 'plan: fsdp' in out and 'at iter 8' in out, out
    # the same run as one process: weights and every logged loss
    got, want = load_params(latest_checkpoint(tmp_path / 'two')), load_params(
        latest_checkpoint(tmp_path / 'one'))
    # (12 AdamW steps grow the sums' rounding, whose order the ranks change: 3e-5 seen)
    assert max_rel_diff(got, want) < 1e-4
    a, b = train_losses(tmp_path / 'two'), train_losses(tmp_path / 'one')
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 * b[k] for k in b), (a, b)
    # the prediction: plan.py for this link, its CPU ranks at the one-process run's FLOP/s (the
    # model's FLOPs per sequence, costs.flops_per_sequence, over its measured seconds)
    from hetgpt.planner.costs import flops_per_sequence
    from model import GPTConfig
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=512, block_size=32, vocab_size=256, bias=False)
    gflops = flops_per_sequence(cfg) * 8 / step_seconds(tmp_path / 'one', range(2, 13)) / 1e9
    ratios = {}
    for strategy, rate, iters in (('ddp', 100e6, (2, 3, 4)), ('ddp', 1e9, (6, 7, 8)),
                                  ('fsdp', 100e6, (10, 11, 12))):
        measured = step_seconds(tmp_path / 'two', iters)
        ratios[strategy, rate] = measured / predicted(strategy, RATES[rate], gflops, capsys)
    print(f"measured / predicted step: {ratios}")
    # DDP at 100 Mbit/s within 25%: the token bucket sets its 2.2 s all-reduce, the CPU only tens
    # of ms. At 1 Gbit/s compute is a quarter of the step and runs at whatever the shared CPU gives
    # these ranks then, not at the one-process run's speed (timing claims are bench/two_nodes.py's,
    # bench/RESULTS.md; 1.07 seen here on a quiet machine): below 1.6, the link's part within 25%
    # and the compute up to 2.5× slower. FSDP at 100 Mbit/s, named reason: gloo's collectives are
    # not the NCCL rings the clock times: its reduce-scatter costs an all-reduce of the whole
    # tensor, its all-gather 1.5× the ring's (bench/gloo_collectives.py): float32 gathers twice and
    # a reduce-scatter move 2.5 where the clock counts 1.5, 1.67×; within 25% of that.
    assert 0.75 < ratios['ddp', 100e6] < 1.25, ratios
    assert 0.75 < ratios['ddp', 1e9] < 1.6, ratios
    assert 1.67 / 1.25 < ratios['fsdp', 100e6] < 1.67 * 1.25, ratios
