"""What a trial's own code calls: read its parameters, report its metrics."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ..core.fsutil import atomic_write_json, read_json


def params() -> dict[str, Any]:
    """This trial's parameters (dotted keys), from ``SLURMKIT_PARAMS``; ``{}`` outside a trial."""
    return json.loads(os.environ.get("SLURMKIT_PARAMS") or "{}")


def trial_dir() -> str | None:
    """This trial's directory on the shared filesystem, or ``None`` outside a trial."""
    return os.environ.get("SLURMKIT_TRIAL_DIR") or None


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
    """
    from .progress import heartbeat  # report() is progress for the hang watchdog

    heartbeat()
    values = {**(metrics or {}), **more}
    values = json.loads(json.dumps(values, default=_to_number))
    line = {"time": time.time(), **({"step": step} if step is not None else {}), **values}
    directory = trial_dir()
    if directory is None:
        print(json.dumps(line), flush=True)
        return
    with open(os.path.join(directory, "metrics.jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    path = os.path.join(directory, "metrics.json")
    latest = read_json(path, default={})
    latest.update(values)
    if step is not None:
        latest["step"] = step
    atomic_write_json(path, latest)
