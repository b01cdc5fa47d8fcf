"""bench/gpu_check.sh --dry-run: the GPU check's sequence, files and summary on CPU, so that a script
error shows here and never on the GPU host's scarce minutes; and a run that fails is marked so in
every place its row is copied, the rows before it kept."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r'^\| ([^|]+?) \| (.*) \|$', re.M)


def rows_of(text):
    # the table's rows (not its header or rule): label -> cells
    return [(m[1], m[2].split(' | ')) for m in ROW.finditer(text) if m[1] not in ('check', '---')]


def dry_run(out, *args, env=None):
    env = dict(os.environ, OUT=str(out), PY=sys.executable, OMP_NUM_THREADS='2', **(env or {}))
    return subprocess.Popen(['bash', 'bench/gpu_check.sh', '--dry-run', *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def outputs(out):
    assert sorted(p.name for p in out.iterdir()) == ['gpu_check.jsonl', 'gpu_check.log', 'gpu_check.md']
    md = (out / 'gpu_check.md').read_text()
    jsonl = [json.loads(line) for line in (out / 'gpu_check.jsonl').read_text().splitlines()]
    return md, jsonl, (out / 'gpu_check.log').read_text()


def agree(md_rows, jsonl):
    # the .md rows and the .jsonl rows: the same runs in the same order, the same numbers
    assert [label for label, _ in md_rows] == [r['label'] for r in jsonl]
    for (label, cells), r in zip(md_rows, jsonl):
        assert r['failed'] == ('error' in r) == cells[-1].startswith('**FAILED: '), (cells, r)
        if r['failed']:
            assert cells[-1].startswith(f"**FAILED: {r['error']}**")
        else:
            assert cells[0].strip() == r['plan']['plan'] and cells[1] == str(r['plan']['micro_batch'])
            assert cells[2] == f"{r['tokens_per_sec']:,.0f}"
            mem = '- / -' if r['mem_gib'] is None else f"{r['mem_gib']:.1f} / {r['reserved_gib']:.1f}"
            assert cells[7] == mem
            step = [f"{r[k]:.3g}" if r.get(k) else '-' for k in ('pred_step_s', 'step_s')]
            assert cells[-3] == ' / '.join(step)


def test_gpu_check_dry_run_walks_every_check_and_writes_three_files(tmp_path):
    # as on the GPU host: the host memory stated, passed on to the runs
    p = dry_run(tmp_path, env={'HETGPT_HOST_MEM_GIB': '120'})
    stdout = p.communicate(timeout=600)[0]
    assert p.returncode == 0, stdout[-5000:]
    md, jsonl, log = outputs(tmp_path)
    md_rows = rows_of(md)
    mem = [f'mem {s} mb{mb}' for s in ('ddp', 'ddp+ac', 'fsdp') for mb in (4, 16)]
    labels = mem + ['kernels', 'fp16 save', 'fp16 resume', 'offload', '124M compile', '1.3B compile',
                    'largest: gpt_1p3b.py']
    assert [label for label, _ in md_rows] == labels, md
    agree(md_rows, jsonl)
    assert not any(r['failed'] for r in jsonl) and 'FAILED' not in md + stdout
    printed = [line for line in stdout.splitlines() if ROW.match(line)]
    for line in md.splitlines():  # every row printed the moment its run ended, and in the table at the end
        if ROW.match(line) and not line.startswith(('| check', '|---')):
            assert printed.count(line) == 2, line
    rows = dict(md_rows)
    for label in mem:  # each memory run ran the strategy and micro-batch asked for
        strategy, mb = label.split()[1:]
        assert rows[label][:2] == [strategy, mb[2:]], rows[label]
    assert rows['offload'][0] == 'fsdp+offload' and '(2.7B)' in rows['offload'][-1]
    assert rows['largest: gpt_1p3b.py'][1:-1] == rows['1.3B compile'][1:-1]  # the same run
    assert 'host memory for planning: 120 GiB, stated (HETGPT_HOST_MEM_GIB)' in md
    # the log: every run's header, command and whole output; the runs planned with the stated host
    for label in labels[:-1]:
        assert f"=== {label}: limit " in log and f"--- {label}: ok, " in log
    assert log.count('host memory: 120 GiB per node, stated (HETGPT_HOST_MEM_GIB)') == 11
    assert log.count('--init_device=meta') == 11 and log.count('iter 2: loss') == 10
    # the clock's kernels, every kind timed; float16's loss scale saved, and the resumed steps
    # the same as the steps of the run that went on (on the CPU, bit for bit)
    row = next(r for r in jsonl if r['label'] == 'kernels')
    kernels = row['kernels']
    assert sorted(kernels) == ['attention', 'matmuls', 'memory'], kernels
    assert all(k['timed'] and k['measured'] > 0 and k['predicted'] > 0 for k in kernels.values())
    # sustained as MSMF (a settled clock, then windows), beside the bursts: the shape that carries
    # the most predicted time timed both ways, and the row's tokens/s the sustained walk's
    sus = row['sustained']
    assert kernels['matmuls']['sustained'] >= 1 and kernels['matmuls']['burst'] > 0
    assert sus['settle_s'] > 0 and sus['window'] > 0 and 0 < sus['share'] <= 1
    big = sus['big']
    assert big['tflops'] > 0 and big['burst_tflops'] > 0
    assert abs(big['ratio'] - big['tflops'] / big['burst_tflops']) < 1e-6 * big['ratio']
    assert row['burst_tokens_per_sec'] > 0 and row['tokens_per_sec'] > 0
    assert f"sustained / burst {big['ratio']:.2f}" in rows['kernels'][-1]
    assert rows['kernels'][-3] == '- / -'
    # every train.py run: the planner's predicted step beside its measured one
    for r in jsonl:
        if r['label'] != 'kernels':
            assert r['pred_step_s'] > 0 and r['step_s'] > 0, r
    assert 'loss scale 65536 at step 2' in rows['fp16 save'][-1]
    assert rows['fp16 resume'][-1].endswith('(apart by 0 of the loss)'), rows['fp16 resume']


def test_a_failed_run_is_marked_everywhere_and_the_rows_before_it_kept(tmp_path):
    # a time limit of 1 s for the second run (train.py alone takes longer to import)
    p = dry_run(tmp_path, '--only=mem ddp mb4,mem ddp+ac mb4', '--limit=mem ddp+ac=1')
    first = next(line for line in p.stdout if line.startswith('| mem ddp mb4 |'))
    # written the moment its run ended, before the next one starts: a kill keeps it
    assert first.rstrip('\n') in (tmp_path / 'gpu_check.md').read_text().splitlines()
    assert len((tmp_path / 'gpu_check.jsonl').read_text().splitlines()) == 1
    stdout = first + p.communicate(timeout=300)[0]
    assert p.returncode == 1, stdout[-3000:]
    md, jsonl, log = outputs(tmp_path)
    md_rows = rows_of(md)
    agree(md_rows, jsonl)
    assert [(r['label'], r['failed']) for r in jsonl] == [('mem ddp mb4', False), ('mem ddp+ac mb4', True)]
    assert jsonl[1]['error'] == 'timed out after 1 s'
    failed = [line for line in stdout.splitlines() if line.startswith('| mem ddp+ac mb4 |')]
    assert len(failed) == 2 and all('**FAILED: timed out after 1 s**' in line for line in failed)
    assert '--- mem ddp+ac mb4: FAILED: timed out after 1 s' in log and '--- mem ddp mb4: ok' in log
    assert '2 rows, 1 failed: mem ddp+ac mb4' in md


def test_summary_row_of_a_gpu_run():
    # what the dry run cannot show: MFU, the overhead, and a host peak the run could not measure
    sys.path.insert(0, str(ROOT / 'bench'))
    import gpu_check
    plan = dict(plan='ddp', ac=False, micro_batch=16, pred_gib=80.0, pred_host_gib=3.0, pred_tokens_per_sec=5e4,
                probe_gib=70.0, probe_alloc_gib=65.0, overhead_gib=0.75)
    run = dict(label='1.3B compile', note='', tokens_per_sec=4.2e4, mfu=0.385, mem_gib=66.0, reserved_gib=71.0,
               host_gib=None, wall=80.0, plan=plan, pred_step_s=0.3277, step_s=0.39)
    failed = dict(label='offload', note='(2.7B)', error='timed out after 80 s', wall=80.0)
    table = gpu_check.summary([run, failed]).splitlines()
    assert table[2] == ('| 1.3B compile | ddp | 16 | 42,000 | 50,000 | 38.5% | 80.0 | 65.0 / 70.0 | 66.0 / 71.0 '
                        '| 0.75 | 3.0 / - | 0.328 / 0.39 | 80 |  |')
    assert table[3].startswith('| offload |') and '**FAILED: timed out after 80 s** (2.7B)' in table[3]
    assert len({line.count('|') for line in table}) == 1  # every row has the header's columns
    assert json.loads(gpu_check.json_row(run))['host_gib'] is None
    assert json.loads(gpu_check.json_row(failed)) == dict(failed=True, label='offload', note='(2.7B)', wall=80.0,
                                                          error='timed out after 80 s')
