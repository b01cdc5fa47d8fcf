"""Machines for tests/test_outer.py, tests/test_two_nodes.py and bench/two_nodes.py: one torchrun agent
per machine, meeting at a c10d rendezvous as docs/two_machines.md says (the first hosts it; each gives
its own address), on this host's loopback or each in a network namespace of its own (Netns): two
namespaces joined by a veth pair whose rate a token bucket holds (tc's tbf; netem is not in this
kernel). Only the namespaces' own addresses are ever reached."""
import os
import signal
import subprocess
import sys
import threading
import time

from trainer import ROOT


def agents(cwd, args, hosts, nproc=1, port=29400, namespaces=None, timeout=600, env=None,
           on_line=None, script=os.path.join(ROOT, 'train.py')):
    # script (train.py) args on one agent per host (hosts[0] hosts the rendezvous), each with nproc
    # ranks, agent i inside namespaces[i] when given; on_line(line): called with each line of the
    # first agent's output (rank 0's log) as it comes. Returns [(returncode, output)] per agent.
    full_env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', **(env or {}))
    procs, texts, readers = [], [], []
    for i, host in enumerate(hosts):
        cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nnodes={len(hosts)}',
               f'--nproc-per-node={nproc}', '--rdzv-backend=c10d',
               f'--rdzv-endpoint={hosts[0]}:{port}', '--rdzv-id=hetgpt',
               f'--rdzv-conf=is_host={int(i == 0)}', f'--local-addr={host}',
               script, *args]
        if namespaces:
            cmd = ['ip', 'netns', 'exec', namespaces[i]] + cmd
        p = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines = []
        call = on_line if i == 0 and on_line else None
        reader = threading.Thread(target=_read, args=(p.stdout, lines, call), daemon=True)
        reader.start()
        procs.append(p)
        texts.append(lines)
        readers.append(reader)
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            p.wait()
    for reader in readers:
        reader.join(timeout=10)
    return [(p.returncode, ''.join(lines)) for p, lines in zip(procs, texts)]


def _read(stream, lines, on_line):
    for line in stream:
        lines.append(line)
        if on_line:
            on_line(line)


def loopback(cwd, args, nodes=2, nproc=1, **kw):
    # nodes agents on this host: "machines" whose link is loopback
    from elastic_run import free_port
    return agents(cwd, args, ['127.0.0.1'] * nodes, nproc, port=free_port(), **kw)


def ok(results):
    for code, text in results:
        assert code == 0, text[-4000:]
    return results[0][1]  # (node 0's output: rank 0 logs)


class Netns:
    # Two namespaces joined by a veth pair, 10.38.0.1 and 10.38.0.2 (addresses inside them only),
    # named after this process; up() makes them (NetnsUnavailable where that cannot be done),
    # rate() sets the token bucket on both ends of the link (each direction), down() removes them.
    hosts = ['10.38.0.1', '10.38.0.2']

    def __init__(self):
        tag = f"hg{os.getpid() % 10**6}"
        self.names, self.links = [tag + 'a', tag + 'b'], [tag + 'va', tag + 'vb']

    def up(self):
        (a, b), (va, vb) = self.names, self.links
        steps = [['ip', 'netns', 'add', a], ['ip', 'netns', 'add', b],
                 ['ip', 'link', 'add', va, 'type', 'veth', 'peer', 'name', vb],
                 ['ip', 'link', 'set', va, 'netns', a], ['ip', 'link', 'set', vb, 'netns', b]]
        for ns, link, host in zip(self.names, self.links, self.hosts):
            steps += [['ip', '-n', ns, 'addr', 'add', f'{host}/24', 'dev', link],
                      ['ip', '-n', ns, 'link', 'set', link, 'up'],
                      ['ip', '-n', ns, 'link', 'set', 'lo', 'up']]
        for step in steps:
            try:
                p = subprocess.run(step, capture_output=True, text=True)
            except OSError as e:
                p = subprocess.CompletedProcess(step, 1, '', str(e))
            if p.returncode:
                self.down()
                raise NetnsUnavailable(f"{' '.join(step)}: {p.stderr.strip()}")
        return self

    def rate(self, rate):
        # rate in bits/s each way: a token bucket on each end, its burst 2 ms of the rate (at least
        # 64 KB, the largest segment the veth hands it), its queue 100 ms
        burst = max(64 * 1024, int(rate / 8 * 0.002))
        for ns, link in zip(self.names, self.links):
            subprocess.run(['ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'replace', 'dev', link, 'root',
                            'tbf', 'rate', f'{int(rate)}bit', 'burst', str(burst), 'latency',
                            '100ms'], check=True, capture_output=True)

    def down(self):
        for ns in self.names:  # (the veth pair goes with them)
            subprocess.run(['ip', 'netns', 'del', ns], capture_output=True)


class NetnsUnavailable(Exception):
    pass
