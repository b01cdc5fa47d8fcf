"""
The watchdog: a rank that stops (SIGSTOP, a swapped-out host, a frozen
GPU) leaves the others waiting in a collective, by default for 30 minutes.
Each rank's thread bumps a counter in the rendezvous store every few
seconds; when this rank's main thread has made no progress for `limit`
seconds, it looks for counters that stopped moving, names those ranks and
ends this process, so that torchrun (--max-restarts) restarts the group
from the last checkpoint.

It also notices when torchrun's agent is gone (kill -9: its ranks, in
sessions of their own, would train on headless) or its store is: it
tells the main thread (`gone`), which stops at the step's end with a
checkpoint (signals.Signals.agreed), and ends the process itself if the
main thread has not ended within the wait.
"""
import os
import socket
import sys
import threading
import time

from hetgpt.errors import oneline, say


class Watchdog:
    """This rank's watchdog thread, and the progress it watches."""

    def __init__(self, store, rank, world_size, timeout, limit_factor):
        """Starts the thread. timeout 0, or store None outside torchrun:
        no watchdog (one process has nobody to wait for)."""
        self.store, self.rank = store, rank
        self.world_size = world_size
        self.timeout, self.limit = timeout, timeout * limit_factor
        self.period = max(0.2, min(5.0, timeout / 8))
        self.last = time.monotonic()
        self.stopped, self.thread = threading.Event(), None
        self.gone = None  # why this rank has no agent, once it has not
        # under torchrun its agent is this process's parent
        self.parent = None
        if 'TORCHELASTIC_RUN_ID' in os.environ:
            self.parent = os.getppid()
        if store is not None and timeout:
            who = f"{socket.gethostname()} pid {os.getpid()}"
            store.set(f'who/{rank}', who)
            store.add(f'alive/{rank}', 1)
        if timeout and (store is not None or self.parent):
            self.thread = threading.Thread(target=self._watch,
                                           daemon=True)
            self.thread.start()

    def stop(self):
        """Ends the thread, before the process group goes: a thread still
        in a store call while the interpreter tears down can abort the
        process ("terminate called without an active exception")."""
        self.stopped.set()
        if self.thread:
            self.thread.join()

    def progress(self, limit_factor=None):
        """Called by the main thread as it works.

        limit_factor: the wait in units of timeout from now on (more for
        start-up, with its compiles, and for checkpoint writes); None: as
        it was.
        """
        self.last = time.monotonic()
        if limit_factor is not None:
            self.limit = self.timeout * limit_factor

    def _counters(self):
        """Every rank's counter, as the store has it now."""
        return [self.store.add(f'alive/{r}', 0)
                for r in range(self.world_size)]

    def _watch(self):
        """The thread: _run, until the agent or its store is gone."""
        try:
            self._run()
        except Exception as e:
            # (a dying agent closes its sockets before its children
            # get another parent: a moment to tell the two apart)
            if self.stopped.wait(self.period):
                return  # (the process is ending)
            why = self.agent_gone()
            if why is None:
                why = f"torchrun's store is gone ({oneline(e)[:80]})"
            self._orphaned(why)

    def agent_gone(self):
        """Why the agent is gone, or None while it runs."""
        if self.parent is None or os.getppid() == self.parent:
            return None
        return f"torchrun's agent (pid {self.parent}) is gone"

    def _orphaned(self, why):
        """Tells the main thread why (it stops at the step's end), then
        ends the process if it has not ended within the wait (limit: 4×
        stall_timeout while it starts or writes a checkpoint)."""
        self.gone = why
        since = time.monotonic()
        while not self.stopped.wait(self.period):
            if time.monotonic() - since < self.limit:
                continue
            say(f"error: rank {self.rank}: {why} and this rank did not "
                f"stop within {self.limit:.0f} s; exiting: "
                f"init_from=resume continues from the last checkpoint")
            sys.stdout.flush()
            os._exit(2)

    def _run(self):
        """Beats, and ends the process when the main thread stalls."""
        while not self.stopped.wait(self.period):
            if self.agent_gone():
                return self._orphaned(self.agent_gone())
            if self.store is None:
                continue  # (one rank under torchrun: the agent only)
            self.store.add(f'alive/{self.rank}', 1)
            if time.monotonic() - self.last < self.limit:
                continue
            before = self._counters()
            # beat on while the others get three chances to beat
            for _ in range(4):
                if self.stopped.wait(self.period):
                    return
                self.store.add(f'alive/{self.rank}', 1)
            if time.monotonic() - self.last < self.limit:
                continue  # the main thread moved on meanwhile
            after = self._counters()
            silent = [r for r, a, b
                      in zip(range(self.world_size), before, after)
                      if a == b and r != self.rank]
            waited = time.monotonic() - self.last
            if silent:
                names = ', '.join(
                    f"rank {r} ({self.store.get(f'who/{r}').decode()})"
                    for r in silent)
                cause = f"{names} stopped answering"
            elif self.limit > self.timeout:
                # start-up or a checkpoint: compiles and writes take
                # long on live ranks
                continue
            else:
                cause = ("every rank is alive but none finished its step "
                         "(a hung device?)")
            say(f"error: rank {self.rank}: no progress for {waited:.0f} "
                f"s: {cause}; exiting so that torchrun --max-restarts "
                f"resumes from the last checkpoint (stall_timeout sets "
                f"the wait)")
            sys.stdout.flush()
            os._exit(2)
