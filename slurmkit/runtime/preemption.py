"""The training loop's side of preemption: a flag set by a signal handler, checked at step
boundaries. The handler does nothing else (no I/O, no checkpoint inside it).

    from slurmkit.runtime import preemption
    preemption.install()
    for step in range(start, total):
        train_step()
        if preemption.should_stop():
            ckpt.save(state, step)      # at a step boundary, outside the handler
            preemption.exit_for_requeue()
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from typing import NoReturn

from ..core.contract import REQUEUE_EXIT, requeue_mark, requeue_signal

# Set by the handler with no lock: Slurm signals the whole process group while the runtime
# forwards the same signal, so a second handler can run inside the first, at any bytecode. A
# threading.Event would deadlock there (its set() holds a plain Lock).
_received: list[int] = []


def _handler(signum: int, _frame: object) -> None:
    _received.append(signum)


def install(signals: tuple[str, ...] | None = None) -> None:
    """Set the flag on the requeue signal (``SLURMKIT_REQUEUE_SIGNAL``, default USR2) and TERM.

    Once the program is exiting, the requeue signal is ignored: Python would otherwise restore
    its default action (terminate) and a run that has finished would look interrupted.
    """
    names = signals or (requeue_signal(os.environ), "TERM")
    nums = [getattr(signal, f"SIG{name.upper().removeprefix('SIG')}") for name in names]
    for num in nums:
        signal.signal(num, _handler)
    late = [n for n in nums if n != signal.SIGTERM]
    atexit.register(lambda: [signal.signal(n, signal.SIG_IGN) for n in late])


def should_stop() -> bool:
    """True once a stop signal arrived: checkpoint at this step boundary and exit."""
    return bool(_received)


def received() -> list[str]:
    """Names of the signals received so far."""
    return [signal.Signals(n).name for n in _received]


def exit_for_requeue() -> NoReturn:
    """Exit with REQUEUE_EXIT: the batch script then requeues this trial, which resumes.

    It also leaves a mark in the trial's directory: a launcher between the runtime and this
    process (torchrun) exits 1 when a worker exits 75, and the mark tells the runtime."""
    trial_dir, attempt = os.environ.get("SLURMKIT_TRIAL_DIR"), os.environ.get("SLURMKIT_ATTEMPT")
    if trial_dir and attempt:
        with contextlib.suppress(OSError):
            os.close(os.open(requeue_mark(trial_dir, attempt), os.O_CREAT | os.O_WRONLY, 0o644))
    sys.exit(REQUEUE_EXIT)
