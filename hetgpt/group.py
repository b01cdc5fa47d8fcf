"""
The process group, and the watchdog that ends a job whose ranks stopped answering.
"""
import atexit
import fcntl
import functools
import ipaddress
import os
import socket
import struct
import sys
import threading
import time

from datetime import timedelta

import torch
import torch.distributed as dist

from hetgpt.ckpt import lost_peer, why
from hetgpt.errors import say, skip_teardown


def gather(obj):  # every rank's obj, in rank order
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# The process group. Every run has one, one rank or many, so that train.py has one path.
def start_group(backend, device, rank, world_size, stall_timeout):
    store = None
    if world_size > 1:
        gloo_interface(os.environ.get('MASTER_ADDR'))
        # torchrun's own store (its default) outlives a restart of the group: without a prefix per
        # attempt the new ranks can read the dead ones' addresses and fail to connect. With
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (elastic runs, README) rank 0 hosts a new store
        # each round, and agents that joined at different times count their restarts apart.
        store, _, _ = next(dist.rendezvous('env://'))
        shared = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
        attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', 0) if shared else 'new'
        store = dist.PrefixStore(f"attempt_{attempt}", store)
    # A silent rank is found by the watchdog; the group's own timeout only backs it up.
    dist.init_process_group(backend, store=store or dist.HashStore(), rank=rank,
                            world_size=world_size,
                            timeout=timedelta(seconds=5 * stall_timeout or 1800))
    if device.startswith('cuda'):  # NCCL's buffers, made at its first collective (before
        dist.all_reduce(torch.zeros(1, device=device))  # hardware.this_rank counts them)
    watchdog = Watchdog(store, rank, world_size, stall_timeout, limit_factor=4)
    if world_size > 1:
        sys.excepthook = functools.partial(_lost_peer, sys.excepthook, rank)
    # On any exit, a one-line error included: the watchdog's thread stopped, then the group; then
    # the process ends without the interpreter's teardown, where gloo's threads can abort it
    skip_teardown()
    atexit.register(lambda: watchdog.stop() or dist.is_initialized() and
                    dist.destroy_process_group())
    return watchdog


def gloo_interface(master):
    # gloo binds to the address its host's name resolves to, and where that is a loopback address
    # (Debian's and Ubuntu's /etc/hosts: 127.0.1.1; one name for two network namespaces) it tells
    # the other machines to reach it at 127.0.0.1: "Gloo connectFullMesh failed ... Connection
    # refused, remote=[127.0.0.1]". Unless GLOO_SOCKET_IFNAME says otherwise, it is the interface
    # this host reaches the rendezvous host (MASTER_ADDR) through. (A run on one machine: as is.)
    if os.environ.get('GLOO_SOCKET_IFNAME') or not master:
        return
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))  # (no packet is sent: the route's source address)
            mine = s.getsockname()[0]
        if ipaddress.ip_address(mine).is_loopback:
            return
        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:  # SIOCGIFADDR: the interface's IPv4 address
                    got = fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', name.encode()[:15]))
                except OSError:
                    continue
            if socket.inet_ntoa(got[20:24]) == mine:
                os.environ['GLOO_SOCKET_IFNAME'] = name
                return
    except (OSError, ValueError):  # no IPv4 route, not Linux: gloo's own choice
        return


def _lost_peer(default, rank, kind, e, tb):
    # A rank whose peer died (its machine gone, killed, out of memory) fails in the collective it
    # was in: one line for that, not a traceback from the middle of the backward
    if lost_peer(e):
        say(f"error: rank {rank}: a collective failed, another rank is probably gone "
            f"({why(e)}); torchrun --max-restarts resumes from the last "
            f"checkpoint, or use init_from=resume")
    else:
        default(kind, e, tb)


# -----------------------------------------------------------------------------
# Watchdog. A rank that stops (SIGSTOP, a swapped-out host, a frozen GPU) leaves the others waiting
# in a collective, by default for 30 minutes. Each rank's thread bumps a counter in the rendezvous
# store every few seconds; when this rank's main thread has made no progress for `limit` seconds,
# it looks for counters that stopped moving, names those ranks and ends this process, so that
# torchrun (--max-restarts) restarts the group from the last checkpoint.
class Watchdog:

    def __init__(self, store, rank, world_size, timeout, limit_factor):
        # store None or timeout 0: no watchdog (one process has nobody to wait for)
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout, self.limit = timeout, timeout * limit_factor
        self.period = max(0.2, min(5.0, timeout / 8))
        self.last, self.stopped, self.thread = time.monotonic(), threading.Event(), None
        if store is not None and timeout:
            store.set(f'who/{rank}', f"{socket.gethostname()} pid {os.getpid()}")
            store.add(f'alive/{rank}', 1)
            self.thread = threading.Thread(target=self._watch, daemon=True)
            self.thread.start()

    def stop(self):
        # Before the process group goes: a thread still in a store call while the interpreter
        # tears down can abort the process ("terminate called without an active exception").
        self.stopped.set()
        if self.thread:
            self.thread.join()

    def progress(self, limit_factor=None):
        # Called by the main thread as it works. limit_factor: the wait in units of timeout from
        # now on (more for start-up, with its compiles, and for checkpoint writes); None: as it was.
        self.last = time.monotonic()
        if limit_factor is not None:
            self.limit = self.timeout * limit_factor

    def _counters(self):
        return [self.store.add(f'alive/{r}', 0) for r in range(self.world_size)]

    def _watch(self):
        try:
            self._run()
        except Exception:  # the store is gone: torchrun itself is ending the job
            pass

    def _run(self):
        while not self.stopped.wait(self.period):
            self.store.add(f'alive/{self.rank}', 1)
            if time.monotonic() - self.last < self.limit:
                continue
            before = self._counters()
            for _ in range(4):  # beat on while the others get three chances to beat
                if self.stopped.wait(self.period):
                    return
                self.store.add(f'alive/{self.rank}', 1)
            if time.monotonic() - self.last < self.limit:
                continue  # the main thread moved on meanwhile
            silent = [r for r, a, b in zip(range(self.world_size), before, self._counters())
                      if a == b and r != self.rank]
            waited = time.monotonic() - self.last
            if silent:
                names = ', '.join(f"rank {r} ({self.store.get(f'who/{r}').decode()})"
                                  for r in silent)
                cause = f"{names} stopped answering"
            elif self.limit > self.timeout:
                continue  # start-up or a checkpoint: compiles and writes take long on live ranks
            else:
                cause = "every rank is alive but none finished its step (a hung device?)"
            say(f"error: rank {self.rank}: no progress for {waited:.0f} s: {cause}; exiting so "
                f"that torchrun --max-restarts resumes from the last checkpoint (stall_timeout "
                f"sets the wait)")
            sys.stdout.flush()
            os._exit(2)
