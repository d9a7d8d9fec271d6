"""``python -m slurmkit.runtime.fncall``: the command of a function sweep's trial.

It loads the sweep's pickled callable (``SWEEP_DIR/function.pkl``), calls it with the trial's
parameters as keyword arguments, and keeps its return value as the trial's result
(``trials/ID/result.pkl``; a number, or a mapping of JSON scalars, is also reported as
metrics, so that ``slurmkit results`` shows it). Everything else is the runtime's as for any
command: status files, requeue, budgets.

Stopping: a callable that is a ``submitit.helpers.Checkpointable`` (it has ``checkpoint``) is
asked for its checkpoint when the requeue signal or SIGTERM arrives; the call it returns is
kept in ``trials/ID/checkpoint.pkl`` and the process exits 75 (requeue me). The next attempt
calls that instead of the original. A callable that uses :mod:`slurmkit.runtime.preemption`
itself (``should_stop`` / ``exit_for_requeue``) needs nothing from here.

Search: a callable that calls ``slurmkit.report(step=..., METRIC=...)`` in a sweep with a
``search`` block is judged at its rungs like any trial; when ``report()`` raises
``slurmkit.Pruned`` the call ends there, keeps no result, and the trial ends PRUNED.
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import sys
from typing import Any

from ..core.contract import REQUEUE_EXIT, requeue_signal
from ..core.fsutil import atomic_write_bytes
from .pycompat import exit_now
from .report import Pruned, params, report

FUNCTION = "function.pkl"
RESULT = "result.pkl"
CHECKPOINT = "checkpoint.pkl"


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for another Python: by cloudpickle when installed (a notebook's
    functions and closures need it), else by pickle."""
    try:
        import cloudpickle  # notebooks' functions (__main__, closures) need it
    except ImportError:
        return pickle.dumps(obj)
    return bytes(cloudpickle.dumps(obj))


def _call(delayed: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A checkpoint's (function, args, kwargs): submitit's DelayedSubmission, or a tuple."""
    if isinstance(delayed, tuple):
        return delayed
    return delayed.function, tuple(delayed.args), dict(delayed.kwargs)


def _as_metrics(value: Any) -> dict[str, Any] | None:
    """A return value that reads as metrics: a finite number, or a flat mapping of scalars."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return {"result": value} if math.isfinite(value) else None
    scalars = (int, float, str, bool, type(None))
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        return dict(value) if all(isinstance(v, scalars) for v in value.values()) else None
    return None


def main() -> int:
    sweep_dir, trial_dir = os.environ["SLURMKIT_SWEEP_DIR"], os.environ["SLURMKIT_TRIAL_DIR"]
    with open(os.path.join(sweep_dir, FUNCTION), "rb") as fh:
        fn = pickle.load(fh)
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = params()
    saved = os.path.join(trial_dir, CHECKPOINT)
    if os.path.exists(saved):  # an earlier attempt checkpointed: go on from there
        with open(saved, "rb") as fh:
            fn, args, kwargs = _call(pickle.load(fh))
        print(f"slurmkit: resuming {getattr(fn, '__name__', fn)!r} from its checkpoint")
    checkpoint = getattr(fn, "checkpoint", None)
    if callable(checkpoint):

        def stop(_signum: int, _frame: object) -> None:
            # submitit's way: ask the callable for the call that resumes it, keep it, exit 75
            atomic_write_bytes(saved, dumps(_call(checkpoint(*args, **kwargs))))
            # at once, not sys.exit: this runs at any line of the callable, which could catch
            # a SystemExit (pycompat's doc); its checkpoint is kept: nothing is left to do
            exit_now(REQUEUE_EXIT)

        for name in {requeue_signal(os.environ), "TERM"}:
            signal.signal(getattr(signal, f"SIG{name}"), stop)
    try:
        value = fn(*args, **kwargs)
    except Pruned:  # the sweep's search stopped it at a rung (report()): no result, exit 0
        return 0
    atomic_write_bytes(os.path.join(trial_dir, RESULT), dumps(value))
    if os.path.exists(saved):
        os.unlink(saved)  # done: a rerun would start from the beginning, not the checkpoint
    metrics = _as_metrics(value)
    if metrics:
        report(metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
