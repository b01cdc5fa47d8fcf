"""Issue 23 (items 4, 5): untrusted files and settings. A token file copied over another with its
times kept is checked again (the cache of its largest id is keyed by content); a bad id that the
cache's sampled blocks miss is met in the batch that holds it, one line naming file and offset,
before any step uses it; a directory where out_dir/.lock or a token file should be, a closed pipe
on --help, and a stated memory above what the machine has are one line each (or a quiet exit)."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from trainer import ROOT, TINY, make_dataset, one_error_line, run_train, snapshot
from hetgpt.data import corpus

RUN = TINY + ['--batch_size=4', '--eval_interval=100', '--max_iters=2']
BLOCK, COUNT = 1 << 16, 66  # the sampled blocks, as hetgpt/data/corpus.py's comment documents them


def trained_nothing(out):
    # no metrics row and no checkpoint (out_dir itself is made, and locked, before the checks)
    return not out.exists() or (not (out / 'metrics.jsonl').exists() and
                                not any(d.startswith('ckpt') for d in os.listdir(out)))


def cache_the_largest_id(path):
    # What train.py's start-up check writes beside the file: <file>.max.json
    corpus.open_tokens(str(path), 32, 256, 'test')
    return json.load(open(f'{path}.max.json'))


# -----------------------------------------------------------------------------
# A. The token cache
def test_a_file_copied_over_another_with_its_times_kept_is_checked_again(tmp_path):
    path = make_dataset(tmp_path, 'kept') + '/train.bin'
    cached = cache_the_largest_id(path)
    assert cached['max'] < 256
    st = os.stat(path)
    other = tmp_path / 'other.bin'
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[len(tokens) // 2] = 300  # the same size, one id past vocab_size=256
    tokens.tofile(other)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))  # both files with the same times
    subprocess.run(['cp', '-p', str(other), path], check=True)  # times kept
    st2 = os.stat(path)
    assert (st2.st_size, st2.st_mtime_ns) == (cached['size'], cached['mtime_ns'])  # size/time key
    p = run_train(tmp_path, *RUN, '--dataset=kept', '--out_dir=kept', check=False)
    line = one_error_line(p)
    assert 'train.bin holds token id 300,' in line and 'vocab_size=256' in line, line
    assert trained_nothing(tmp_path / 'kept')


def unsampled(size):
    # Byte ranges of a file of size outside its COUNT blocks of BLOCK bytes: the first, the last
    # and the others evenly spaced between (starts i·(size-BLOCK)//(COUNT-1))
    starts = [i * (size - BLOCK) // (COUNT - 1) for i in range(COUNT)]
    return [(a + BLOCK, b) for a, b in zip(starts, starts[1:]) if b > a + BLOCK]


def test_a_bad_id_between_the_sampled_blocks_is_caught_in_the_batch_that_holds_it(tmp_path):
    # (needs train.py's get_batch to call corpus.check_batch)
    d = make_dataset(tmp_path, 'gaps')
    path = os.path.join(d, 'train.bin')
    tokens = np.resize(np.fromfile(path, dtype=np.uint16), 6_000_000)  # 12 MB: 3x the samples
    tokens.tofile(path)
    cached = cache_the_largest_id(path)
    st = os.stat(path)
    gaps = unsampled(st.st_size)
    for a, b in gaps:  # every id between the blocks past vocab_size, kept even (whole tokens)
        tokens[(a + 1) // 2:b // 2] = 300
    assert (tokens == 300).mean() > 0.5
    tokens.tofile(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p or rsync -t would
    assert corpus.content_key(path, st.st_size) == cached['blake2b']  # the cache is believed
    p = run_train(tmp_path, *RUN, '--dataset=gaps', '--out_dir=gaps', check=False)
    line = one_error_line(p)
    found = re.search(r'gaps/train\.bin holds token id 300 at offset (\d+), not below '
                      r'vocab_size=256', line)
    assert found, line
    at = int(found[1])
    assert tokens[at] == 300 and any(a <= 2 * at < b for a, b in gaps)
    assert 'loss' not in p.stdout and trained_nothing(tmp_path / 'gaps')  # no step used it


def test_a_batch_check_names_the_first_bad_offset_and_passes_good_batches():
    # check_batch alone: rows are windows of a file at offsets
    windows = np.array([[1, 2, 3], [4, 255, 6]], dtype=np.uint16)
    assert corpus.check_batch('f.bin', windows, [10, 20], 256) is windows
    code = ("import sys, numpy as np; sys.path.insert(0, %r); from hetgpt.data import corpus; "
            "corpus.check_batch('data/x/train.bin', np.array([[1, 999, 3], [700, 2, 3]], "
            "np.uint16), np.array([50, 7]), 256)" % ROOT)
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert one_error_line(p).startswith(
        'error: data/x/train.bin holds token id 700 at offset 7, not below vocab_size=256: ')


# -----------------------------------------------------------------------------
# B. A directory where a file should be, a closed pipe, a stated memory above the machine's
@pytest.fixture(scope='module')
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp('untrusted')
    make_dataset(root)
    return root


def test_a_lock_that_is_a_directory_is_one_line_and_left_alone(synth):
    out = synth / 'lockdir'
    os.makedirs(out / '.lock')
    (out / '.lock' / 'notes.txt').write_text('mine')
    before = snapshot(out)
    p = run_train(synth, *RUN, f'--out_dir={out.name}', check=False)
    line = one_error_line(p)
    assert '.lock' in line and 'directory' in line, line
    assert snapshot(out) == before


def test_a_token_file_that_is_a_directory_is_one_line(synth):
    d = synth / 'data' / 'dirbin'
    shutil.copytree(synth / 'data' / 'synth', d)
    os.remove(d / 'train.bin')
    os.makedirs(d / 'train.bin')
    p = run_train(synth, *RUN, '--dataset=dirbin', '--out_dir=dirbin', check=False)
    line = one_error_line(p)
    assert 'dirbin/train.bin is not a file' in line and 'directory' in line, line
    assert trained_nothing(synth / 'dirbin')


@pytest.mark.parametrize('script', ['plot.py', 'train.py', 'sample.py', 'plan.py',
                                    'data/prepare.py'])
def test_help_into_a_closed_pipe_ends_quietly(script):
    # `--help | head -1` when head has gone before the script writes: its stdout is a pipe with no
    # reader (the worst case of head; any write fails with EPIPE).
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run([sys.executable, os.path.join(ROOT, script), '--help'], stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT,
                           env=dict(os.environ, PYTHONWARNINGS='ignore'))
    finally:
        os.close(write)
    assert p.returncode == 0 and p.stderr == '', (p.returncode, p.stderr[-2000:])


def mem_total_gib():
    return next(int(line.split()[1]) for line in open('/proc/meminfo')
                if line.startswith('MemTotal:')) / 2**20


@pytest.mark.parametrize('name,value,size', [
    ('HETGPT_MEM_GIB', '1e9', 'total'),
    ('HETGPT_MEM_GIB', 'over', 'total'),  # just above MemTotal
    ('HETGPT_HOST_MEM_GIB', '1e9', '65536.0'),  # above MemTotal is allowed (a microVM): not this
])
def test_a_stated_memory_above_the_machine_s_is_one_line(monkeypatch, capsys, name, value, size):
    # the variables' one reader, as train.py calls it for a CPU rank (local rank 0); end to end:
    # the test below
    from hetgpt import hardware
    value = f'{mem_total_gib() * 1.05:.1f}' if value == 'over' else value
    size = f'{mem_total_gib():.1f}' if size == 'total' else size
    monkeypatch.delenv('HETGPT_MEM_GIB', raising=False)
    monkeypatch.delenv('HETGPT_HOST_MEM_GIB', raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as e:
        hardware.stated_memory(0, 'cpu')
    out, err = capsys.readouterr()
    assert e.value.code == 2 and not out and err.splitlines() == [err.strip()], err
    assert err.startswith(f'error: {name}={value} states ') and f'({size} GiB)' in err, err


def test_a_stated_memory_above_the_machine_s_ends_train_py_in_one_line(synth):
    value, size = f'{mem_total_gib() * 1.05:.1f}', f'{mem_total_gib():.1f}'  # just above MemTotal
    out = synth / 'stated_over'
    p = run_train(synth, *RUN, f'--out_dir={out.name}', check=False, env={'HETGPT_MEM_GIB': value})
    line = one_error_line(p)
    assert line.startswith(f'error: HETGPT_MEM_GIB={value} states ') and f'({size} GiB)' in line, line
    assert trained_nothing(out)


def test_a_cpu_rank_may_state_up_to_the_host_memory_stated(synth):
    # A host whose MemTotal reads below what it gives states it (HETGPT_HOST_MEM_GIB, as on the GPU
    # host); a CPU rank's HETGPT_MEM_GIB is then held to that, not to MemTotal.
    host = mem_total_gib() * 2
    env = {'HETGPT_HOST_MEM_GIB': f'{host:.1f}', 'HETGPT_MEM_GIB': f'{host * 0.75:.1f}'}
    run_train(synth, *RUN, '--max_iters=1', '--out_dir=stated_ok', env=env)
    env['HETGPT_MEM_GIB'] = f'{host * 1.1:.1f}'
    p = run_train(synth, *RUN, '--out_dir=stated_over', check=False, env=env)
    assert 'as HETGPT_HOST_MEM_GIB states it' in one_error_line(p)
