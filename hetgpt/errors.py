"""
Mistakes, said as one line that tells the user what to do, and exit 2:
every entry point's way to fail (train, sample, prepare, plan, plot and the
package under them).
"""
import atexit
import os
import signal
import sys
import time


# Under torchrun every rank runs the same start-up checks, and a mistake
# would be printed once per rank. So a rank other than its machine's local
# rank 0 leaves the line to that rank: it waits for torchrun to stop it
# (torchrun stops every rank once one has exited) and prints its line,
# naming itself, only when no stop comes within QUIET_WAIT seconds: a
# mistake that only it sees (its own device, its own memory). A stop by a
# signal it never reports: a signal that reaches the ranks during start-up
# is torchrun stopping them, a preemption or a Ctrl-C, and local rank 0
# says so.
QUIET_WAIT = 5.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


status = None  # the exit status end() gave (None: the interpreter's own)
teardown = True  # False: the process ends without it (skip_teardown)


def speaks():
    """Whether this process says a start-up mistake: one process alone,
    or its machine's local rank 0."""
    if os.environ.get('LOCAL_RANK', '0') == '0':
        return True
    return int(os.environ.get('WORLD_SIZE', 1)) == 1


def die(msg):
    """Says msg as one 'error: ' line and exits 2 (a rank that does not
    speak first waits QUIET_WAIT seconds for torchrun to stop it)."""
    if not speaks():
        if in_signal_handler():
            end(2)
        try:  # a stop while waiting: silent
            for sig in STOP_SIGNALS:
                signal.signal(sig, lambda signum, frame: end(2))
        except ValueError:
            pass  # not the main thread: signals are not ours to handle
        time.sleep(QUIET_WAIT)
        msg = f"rank {os.environ.get('RANK', '?')}: {msg}"
    say(f"error: {msg}")
    end(2)


def end(code):
    """sys.exit(code), the status kept for skip_teardown."""
    global status
    status = code
    sys.exit(code)


def last_at_exit():
    """Registers _exit as the at-exit handler that runs last (train.py
    calls it before torch loads)."""
    atexit.register(_exit)


def skip_teardown():
    """Ends this process without the interpreter's teardown from here on.

    Once a gloo group runs (hetgpt/run/process_group.py): a process that
    ends by end() (die included) or by an uncaught exception (status 1)
    ends by os._exit after every other at-exit handler, skipping the
    interpreter's teardown. In that teardown a gloo worker thread still
    dropping the last collective's tensors takes the GIL, which a
    finalizing interpreter refuses, and the process aborts ("terminate
    called without an active exception", SIGABRT; pytorch#190489).
    bench/exit_abort.py counts it with and without this.
    """
    global teardown
    teardown = False


def _exit():
    """The last at-exit handler: after skip_teardown, flushes the output
    and ends by os._exit with end()'s status (1 after an uncaught
    exception)."""
    code = status
    if getattr(sys, 'last_value', None) is not None:
        code = 1
    # (another SystemExit: its status is the interpreter's)
    if teardown or code is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # (a closed pipe: the reader is gone)
    os._exit(code)


def say(line):
    """Writes line to stderr in one write, newline included.

    torchrun's agent logs into the same pipe, and print's two writes
    (text, then end; unbuffered under PYTHONUNBUFFERED) let its lines land
    inside ours.
    """
    sys.stderr.write(line + '\n')
    sys.stderr.flush()


def in_signal_handler():
    """Whether the caller runs in a Python handler of STOP_SIGNALS (its
    frame is on the stack)."""
    handlers = {getattr(signal.getsignal(sig), '__code__', None)
                for sig in STOP_SIGNALS}
    handlers -= {None}
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in handlers:
            return True
        frame = frame.f_back
    return False


def oneline(e):
    """An exception as one line of an error message: its type, and its
    text's first line (200 characters at most)."""
    first = (str(e).strip().splitlines() or [''])[0]
    return f"{type(e).__name__}: {first[:200]}"
