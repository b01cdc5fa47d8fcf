"""
The process group, and the watchdog that ends a job whose ranks stopped
answering.
"""
import atexit
import fcntl
import functools
import ipaddress
import os
import socket
import struct
import sys

from datetime import timedelta

import torch
import torch.distributed as dist

from hetgpt.errors import say, skip_teardown
from hetgpt.run.checkpoint import lost_peer, why
from hetgpt.run.watchdog import Watchdog


def gather(obj):
    """Every rank's obj, in rank order."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# The process group. Every run has one, one rank or many, so that train.py
# has one path.
def start(backend, device, rank, world_size, stall_timeout):
    """Starts the process group and this rank's watchdog; returns the
    watchdog."""
    store = None
    if world_size > 1:
        gloo_interface(os.environ.get('MASTER_ADDR'))
        # torchrun's own store (its default) outlives a restart of the
        # group: without a prefix per attempt the new ranks can read the
        # dead ones' addresses and fail to connect. With
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (elastic runs, README) rank
        # 0 hosts a new store each round, and agents that joined at
        # different times count their restarts apart.
        store, _, _ = next(dist.rendezvous('env://'))
        agent_store = os.environ.get('TORCHELASTIC_USE_AGENT_STORE')
        attempt = 'new'
        if agent_store == 'True':
            attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)
        store = dist.PrefixStore(f"attempt_{attempt}", store)
    # A silent rank is found by the watchdog; the group's own timeout only
    # backs it up.
    timeout = timedelta(seconds=5 * stall_timeout or 1800)
    dist.init_process_group(backend, store=store or dist.HashStore(),
                            rank=rank, world_size=world_size,
                            timeout=timeout)
    if device.startswith('cuda'):
        # NCCL's buffers, made at its first collective (before
        # hardware.this_rank counts them)
        dist.all_reduce(torch.zeros(1, device=device))
    watchdog = Watchdog(store, rank, world_size, stall_timeout,
                        limit_factor=4)
    if world_size > 1:
        sys.excepthook = functools.partial(_lost_peer, sys.excepthook,
                                           rank)
    # On any exit, a one-line error included: the watchdog's thread
    # stopped, then the group; then the process ends without the
    # interpreter's teardown, where gloo's threads can abort it
    skip_teardown()
    atexit.register(lambda: watchdog.stop() or dist.is_initialized()
                    and dist.destroy_process_group())
    return watchdog


def gloo_interface(master):
    """Sets GLOO_SOCKET_IFNAME to the interface toward master, where
    gloo's own choice would be a loopback address.

    gloo binds to the address its host's name resolves to, and where that
    is a loopback address (Debian's and Ubuntu's /etc/hosts: 127.0.1.1;
    one name for two network namespaces) it tells the other machines to
    reach it at 127.0.0.1: "Gloo connectFullMesh failed ... Connection
    refused, remote=[127.0.0.1]". Unless GLOO_SOCKET_IFNAME says
    otherwise, it is the interface this host reaches the rendezvous host
    (MASTER_ADDR) through. (A run on one machine: as is.)
    """
    if os.environ.get('GLOO_SOCKET_IFNAME') or not master:
        return
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            # (no packet is sent: the route's source address)
            s.connect((master, 9))
            mine = s.getsockname()[0]
        if ipaddress.ip_address(mine).is_loopback:
            return
        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                request = struct.pack('256s', name.encode()[:15])
                try:  # SIOCGIFADDR: the interface's IPv4 address
                    got = fcntl.ioctl(s.fileno(), 0x8915, request)
                except OSError:
                    continue
            if socket.inet_ntoa(got[20:24]) == mine:
                os.environ['GLOO_SOCKET_IFNAME'] = name
                return
    except (OSError, ValueError):
        return  # no IPv4 route, not Linux: gloo's own choice


def _lost_peer(default, rank, kind, e, tb):
    """sys.excepthook: one line when a peer died, else default's.

    A rank whose peer died (its machine gone, killed, out of memory)
    fails in the collective it was in: one line for that, not a traceback
    from the middle of the backward.
    """
    if lost_peer(e):
        say(f"error: rank {rank}: a collective failed, another rank is "
            f"probably gone ({why(e)}); torchrun --max-restarts resumes "
            f"from the last checkpoint, or use init_from=resume")
    else:
        default(kind, e, tb)
