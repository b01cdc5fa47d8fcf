"""
A token file known by its content: the sha256 of its bytes, cached beside
it so that a start reads a large corpus once, not at every start.
"""
import hashlib
import json
import os
import socket

CHUNK = 1 << 23  # bytes a read


# sha256, not blake2b: with the CPU's SHA instructions (x86's SHA-NI,
# ARMv8's) twice as fast (2.4 against 5.0 s/GB on the 2 shared cores
# where this was written).
def sha256(path):
    """The hex sha256 of the file's bytes, read in CHUNKs."""
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, 'rb', buffering=0) as f:
        n = f.readinto(buf)
        while n:
            h.update(view[:n])
            n = f.readinto(buf)
    return h.hexdigest()


# The cache, path + '.sha256.json', is keyed by what the file system
# changes with every new version of the file: its device, inode, size,
# modification and change times. A copy over it (cp -p, rsync -t) is a
# new inode or a new change time, even with the size and modification
# time of the old; a rewrite in place is a new change time. A key is
# trusted only when the file's change time is older than the cache's
# own modification time (both from the file system's clock): a change
# in the same clock tick as the cache was written could keep the key
# (git's "racy" entries), so that one is read again.
def key(st):
    """The cache key of a file's os.stat."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns]


def digest(path):
    """The file's sha256: from its cache when the key is the file's and
    trusted, else read and cached (a folder not writable: not cached)."""
    st = os.stat(path)
    cache = path + '.sha256.json'
    try:
        with open(cache) as f:
            cached = json.load(f)
            written = os.fstat(f.fileno()).st_mtime_ns
        trusted = st.st_ctime_ns < written
        if trusted and cached['key'] == key(st):
            return str(cached['sha256'])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = sha256(path)
    if key(os.stat(path)) == key(st):  # not changed while read
        remember(path, value, st)
    return value


def remember(path, value, st):
    """Writes value as the cache of the file at path (st: its os.stat),
    whole or not at all; a folder not writable keeps no cache."""
    cache = path + '.sha256.json'
    tmp = f'{cache}.{socket.gethostname()}.{os.getpid()}'
    try:
        with open(tmp, 'w') as f:
            json.dump({'key': key(st), 'sha256': value}, f)
        os.replace(tmp, cache)
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass
