"""Signals that reach the runtime while it starts: kept, and handed on once its trial is ready.

``python -m slurmkit.runtime`` calls :func:`hold` before its own imports, which are most of its
start-up: until then a requeue signal or TERM (``scancel --batch --signal`` as a node is
drained, a time limit shorter than ``lead`` + 30 s) would kill it with no record and no requeue.
The handler only appends (no lock): it may run inside itself.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from ..core.contract import SIGNALS

# TERM, and every requeue signal a spec may name (INT among them)
NAMES = ("TERM", *SIGNALS)
# Signals a process that held them handed on through exec (``python -m slurmkit.standalone``
# builds the sweep directory, then becomes the runtime): their numbers, comma-separated.
ENV_HELD = "SLURMKIT_HELD_SIGNALS"
_came: list[int] = []
_holding: list[bool] = []


def _keep(signum: int, _frame: object) -> None:
    _came.append(signum)


def hold() -> None:
    """Keep these signals from now on, until :func:`release` (and those handed on to it)."""
    for name in NAMES:
        signal.signal(getattr(signal, f"SIG{name}"), _keep)
    _came.extend(int(n) for n in os.environ.pop(ENV_HELD, "").split(",") if n.isdigit())
    _holding.append(True)


def handover() -> str:
    """The signals kept so far, for :data:`ENV_HELD` before an exec."""
    return ",".join(str(n) for n in _came)


def release(handler: Callable[[int], None], stop: set[int]) -> None:
    """From now on ``handler`` gets the ``stop`` signals; then it gets those that came already.
    After :func:`hold`, the others get their default action back, and one that came acts now."""
    for num in stop:
        signal.signal(num, lambda s, _f: handler(s))
    if not _holding:
        return
    others = {getattr(signal, f"SIG{name}") for name in NAMES} - stop
    for num in others:
        signal.signal(num, signal.SIG_DFL)
    came = list(_came)
    del _came[:], _holding[:]
    for num in came:
        if num in stop:
            handler(num)
        else:
            os.kill(os.getpid(), num)
