"""torchrun's elastic agents on one host, for tests/test_membership.py and bench/elastic.py: each agent
stands for one machine (one rank each), all meeting at a c10d rendezvous on localhost as README says.
The first agent started hosts the rendezvous store, so it is never the one killed."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from trainer import ROOT

# README's settings for elastic runs: torchrun's own store is shared by default, and then a machine
# that joins later waits forever for the address of the group's store (torch 2.11-2.13).
ELASTIC_ENV = {'TORCH_DISABLE_SHARE_RDZV_TCP_STORE': '1'}


def free_port():
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


class Agent:
    # One `torchrun --nnodes=MIN:MAX` agent, its output read line by line with the time each came.
    # root: the hetgpt copy whose train.py it runs (a machine with other code)
    def __init__(self, name, cwd, args, port, nnodes='1:2', rdzv_conf='', env=None, faults=True,
                 root=ROOT):
        script = [os.path.join(ROOT, 'tests', 'fixture_run.py')] if faults else []
        cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nnodes={nnodes}', '--nproc-per-node=1',
               '--rdzv-backend=c10d', f'--rdzv-endpoint=localhost:{port}', '--rdzv-id=hetgpt',
               '--max-restarts=10', *([f'--rdzv-conf={rdzv_conf}'] if rdzv_conf else []),
               *script, os.path.join(root, 'train.py'), *args]
        full_env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', **ELASTIC_ENV,
                        **(env or {}))
        self.name, self.lines = name, []  # (seconds since the epoch, line)
        self.p = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append((time.time(), line.rstrip('\n')))

    def text(self):
        return '\n'.join(line for _, line in self.lines)

    def kill(self):
        # The machine is gone: its agent and its worker at once, as when a host is reclaimed.
        workers = open(f'/proc/{self.p.pid}/task/{self.p.pid}/children').read().split()
        os.killpg(self.p.pid, signal.SIGKILL)
        for pid in workers:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()

    def wait(self, timeout):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        self.reader.join(timeout=5)
        return self.p.returncode


def wait_for(what, timeout, every=0.02):
    deadline = time.time() + timeout
    while not what():
        if time.time() > deadline:
            return False
        time.sleep(every)
    return True


def leave_and_join(work, out_dir, args, kill_after, rdzv_conf, env=None, timeout=300):
    # Agents A and B train; B's machine dies kill_after seconds after their first checkpoint; A goes
    # on alone; once A has trained a few steps alone, C joins; A and C finish. Returns the agents
    # and the events: the times (epoch seconds) of the kill and of C's start, and the newest complete
    # checkpoint when B was killed.
    port = free_port()
    out = os.path.join(work, out_dir)
    complete = lambda: sorted(int(d[5:]) for d in os.listdir(out) if re.fullmatch(r'ckpt_\d+', d)) \
        if os.path.isdir(out) else []
    alone = lambda: sum(' 1 rank(s) on ' in line for _, line in a.lines) and \
        sum('loss' in line for _, line in a.lines[-3:]) >= 2
    new = lambda name: Agent(name, work, args, port, rdzv_conf=rdzv_conf, env=env)
    a = new('A')
    time.sleep(0.5)  # A's rendezvous store first (B's agent retries until it is up)
    b = new('B')
    events = {}
    both = lambda: any(' 2 rank(s) on ' in line for agent in (a, b) for _, line in agent.lines)
    try:
        assert wait_for(both, timeout), a.text() + b.text()
        before = complete()
        assert wait_for(lambda: complete()[-1:] != before[-1:], timeout), a.text() + b.text()
        time.sleep(kill_after)
        b.kill()
        events['leave'], events['newest_at_leave'] = time.time(), complete()[-1]
        assert wait_for(alone, timeout), a.text()
        c = new('C')
        events['join'] = time.time()
        for agent in (a, c):
            assert agent.wait(timeout) == 0, agent.text()[-5000:]
    finally:
        for agent in (a, b, *([c] if 'join' in events else [])):
            if agent.p.poll() is None:
                agent.wait(0)
    return (a, b, c), events
