"""
The data a run trains on, known by its content (hetgpt/data/digest.py): the sha256 of each token
file, cached beside it under a key that every new version of the file changes (a copy over it
with its size and times kept, a rewrite in place, a copied folder with its cache); a second start
reads nothing. A resume compares the checkpoint's digests with the data's (hetgpt/run/rundir.py
`same_data`): other content is one line, unless new_dataset; a checkpoint from before digests
is noted.
"""
import hashlib
import os
import shutil
import time

import pytest

from hetgpt.data import digest
from hetgpt.run import rundir


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def settle():
    # the file system's clock past the file's last change: a cache written now is trusted
    # (one written in the same tick is not: digest.py's racy rule)
    time.sleep(0.05)


def counted(monkeypatch):
    """The files digest.digest reads whole, as a list."""
    reads, real = [], digest.sha256
    monkeypatch.setattr(digest, 'sha256', lambda path: reads.append(path) or real(path))
    return reads


def over_it_with_cp_p(folder, path):
    # cp -p of another file of the same size and modification time over it
    other = folder / 'other.bin'
    other.write_bytes(bytes(reversed(path.read_bytes())))
    os.utime(other, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    shutil.copy2(other, path)
    return path


def rewritten_in_place(folder, path):
    # the same inode rewritten, its modification time put back
    st = path.stat()
    with open(path, 'r+b') as f:
        f.write(b'Z' * 8)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return path


def folder_copied_then_the_cache(folder, path):
    # a copy of the folder (cp -p) whose file then changes, its size and times kept, and later
    # the first folder's cache copied beside it (a cache newer than the file: only its key tells)
    twin = folder.parent / 'twin'
    shutil.copytree(folder, twin)  # (copy2: times kept)
    copy = twin / path.name
    data = bytearray(copy.read_bytes())
    data[0] ^= 1
    st = copy.stat()
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    settle()
    shutil.copy(path.with_name(path.name + '.sha256.json'), twin / (path.name + '.sha256.json'))
    return copy


CHANGES = [over_it_with_cp_p, rewritten_in_place, folder_copied_then_the_cache]


@pytest.mark.parametrize('change', CHANGES, ids=lambda f: f.__name__)
def test_the_cached_digest_is_the_file_s_and_is_read_once(tmp_path, monkeypatch, change):
    folder = tmp_path / 'data'
    folder.mkdir()
    path = folder / 'train.bin'
    path.write_bytes(os.urandom(1 << 16))
    settle()
    reads = counted(monkeypatch)
    first = digest.digest(str(path))
    assert first == sha256(path) and len(reads) == 1
    assert digest.digest(str(path)) == first and len(reads) == 1  # the second start: the cache
    changed = change(folder, path)
    assert changed.stat().st_size == path.stat().st_size
    assert digest.digest(str(changed)) == sha256(changed) != first and len(reads) == 2


def test_a_cache_written_as_its_file_changed_is_not_trusted(tmp_path, monkeypatch):
    # a file changed in the tick its cache was written: read again, then cached for good
    path = tmp_path / 'val.bin'
    path.write_bytes(b'ab' * 100)
    st = path.stat()
    digest.remember(str(path), 'f' * 32, st)
    os.utime(path.with_name('val.bin.sha256.json'), ns=(st.st_ctime_ns, st.st_ctime_ns))
    reads = counted(monkeypatch)
    assert digest.digest(str(path)) == sha256(path) and len(reads) == 1


FP = {'config': {'dataset': 'synth', 'new_dataset': False}, 'data': {'train.bin': 'a' * 32,
                                                                      'val.bin': 'b' * 32}}
SAME_DATA = [  # (the checkpoint's fingerprint's data, new_dataset) -> a refusal's words / a note's
    ({'train.bin': 'c' * 32, 'val.bin': 'b' * 32}, False,
     ('error', 'trained on other data: data/synth/train.bin holds other content', 'new_dataset')),
    ({'train.bin': 'c' * 32, 'val.bin': 'd' * 32}, False,
     ('error', 'data/synth/train.bin and data/synth/val.bin hold other content',)),
    ({'train.bin': 'c' * 32, 'val.bin': 'b' * 32}, True,
     ('note', 'other content', 'going on with it (new_dataset=True)')),
    ({'train.bin': 40_000, 'val.bin': 4_000}, False, ('note', 'records no digest')),  # sizes
    (None, False, ('note', 'records no digest')),  # no fingerprint at all
    (FP['data'], False, ()),  # the same content: nothing said
]


@pytest.mark.parametrize('was, new, says', SAME_DATA)
def test_a_resume_on_other_content(capsys, was, new, says):
    fingerprint = {**FP, 'config': {**FP['config'], 'new_dataset': new}}
    saved = {'iter': 10}
    if was is not None:
        saved['fingerprint'] = {**FP, 'data': was}
    notes = []
    rundir.same_data(None, saved, fingerprint, notes.append)  # a new run: nothing to check
    if says[:1] == ('error',):
        with pytest.raises(SystemExit) as e:
            rundir.same_data('out/ckpt_10', saved, fingerprint, notes.append)
        line = capsys.readouterr().err.strip()
        assert e.value.code == 2 and line.startswith('error: out/ckpt_10 ') and not notes
        assert all(w in line for w in says[1:]), line
        return
    rundir.same_data('out/ckpt_10', saved, fingerprint, notes.append)
    assert len(notes) == len(says[:1])
    assert all(w in notes[0] for w in says), notes
