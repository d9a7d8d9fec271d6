"""What a trial's own code calls: read its parameters, report its metrics."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..core.fsutil import atomic_write_json, read_json
from . import pruning
from .progress import heartbeat, trial_dir


class Pruned(SystemExit):
    """Raised by :func:`report` at a rung where the sweep's search stops this trial (its
    decision is already in the trial's ``search.json``). Left uncaught it ends the process with
    exit 0 and no traceback (it is a ``SystemExit``, so ``except Exception`` does not swallow
    it); the runtime then records the trial as PRUNED. A loop that wants to clean up catches it:
    ``except slurmkit.Pruned``."""

    def __init__(self, message: str = "pruned") -> None:
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


def params() -> dict[str, Any]:
    """This trial's parameters (dotted keys), from ``SLURMKIT_PARAMS``; ``{}`` outside a trial."""
    return json.loads(os.environ.get("SLURMKIT_PARAMS") or "{}")


_PLAIN = (float, int, str, bool, type(None))


def _as_json(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as JSON gives them back: numpy/torch scalars become Python numbers, nested
    values JSON's; a dict of plain Python scalars with str keys (the usual report) as it is."""
    if all(type(k) is str and type(v) in _PLAIN for k, v in values.items()):
        return values
    return json.loads(json.dumps(values, default=_to_number))


def _to_number(value: Any) -> Any:
    """numpy/torch scalars and 0-d tensors become Python numbers."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"metric value {value!r} is not JSON-serializable")


def report(
    metrics: dict[str, Any] | None = None, /, *, step: int | None = None, **more: Any
) -> None:
    """Record metrics: ``metrics.json`` keeps the latest value of each, ``metrics.jsonl`` all.

    ``report(loss=0.1, acc=0.9, step=100)``. Outside a trial, prints one JSON line instead.
    In a trial, it is progress too (:func:`~slurmkit.runtime.progress.heartbeat`).
    In a sweep with a ``search``, a report at a rung judges the trial and raises
    :class:`Pruned` when it stops there (:mod:`slurmkit.runtime.pruning`); under a search only
    rank 0 writes the metrics, and every rank must report at the same steps.
    """
    heartbeat()  # progress, for the hang watchdog
    values = _as_json({**(metrics or {}), **more})
    line = {"time": time.time(), **({"step": step} if step is not None else {}), **values}
    directory = trial_dir()
    if directory is None:
        print(json.dumps(line), flush=True)
        return
    search = pruning.trial(directory)
    if search is None or search.rank == 0:
        _write(directory, line, values, step)
    if search is not None:
        search.check(step, values)


def _write(directory: str, line: dict[str, Any], values: dict[str, Any], step: int | None) -> None:
    """Append ``line`` to metrics.jsonl; merge ``values`` (and ``step``) into metrics.json."""
    # one write() on an O_APPEND descriptor: ranks that report at once append whole lines
    data = (json.dumps(line) + "\n").encode()
    fd = os.open(
        os.path.join(directory, "metrics.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666
    )
    try:
        while data:  # a short write (a full disk) is retried, or raises
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    path = os.path.join(directory, "metrics.json")
    latest = read_json(path, default={})
    latest.update(values)
    if step is not None:
        latest["step"] = step
    atomic_write_json(path, latest, indent=None)  # one line: written every report
