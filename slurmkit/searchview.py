"""A sweep's search as the login side reads it (``status``, ``results``, ``report``) and
``sweep --resume --unprune``'s change to a pruned trial's decisions.

What a trial reached comes from the rung records (:mod:`slurmkit.core.search`: one directory
listing per rung, no file read per trial); why it stopped from its state (PRUNED: at the last
rung it reached) and, where wanted, its ``search.json``.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

from .core import search as core
from .core import states
from .core.fsutil import Damaged, atomic_write_json, read_record
from .core.lock import Lock, LockBusy
from .core.search import Search
from .errors import Busy

RUNG = "rung"  # the results column of the last rung a trial reached (0, 1, ...)
STATUS = "status.json"  # a trial's status file (core/layout.SweepDir.status)
UNPRUNED = "unpruned: to run again to max_resource (sweep --resume --unprune)"


def of_config(config: dict[str, Any], source: str, warnings: list[str] | None) -> Search | None:
    """The sweep's search from its ``sweep.json`` (None: it has none). A damaged block is said
    in ``warnings`` (and reads as none) when given, else raised."""
    raw = config.get("search")
    if raw is None:
        return None
    try:
        return Search.from_dict(raw, source)
    except Damaged as exc:
        if warnings is None:
            raise
        warnings.append(f"{exc}: its search is not shown")
        return None


def rungs_by_trial(root: str, search: Search) -> dict[str, list[dict[str, Any]]]:
    """Trial id -> the rungs it reached, in order: ``{"rung", "resource", "value"}`` each (the
    value its record holds: the metric at its first report at or past the rung)."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for k, resource in enumerate(search.rungs()):
        for trial_id, value in core.rung_values(root, k).items():
            out[trial_id].append({"rung": k, "resource": resource, "value": value})
    return out


def column(search: Search, resource: float) -> str:
    """The results column of the metric at a rung: ``val_loss@3``."""
    return f"{search.metric}@{resource:g}"


def unprune(trial_dir: str) -> None:
    """Let a pruned trial run to ``max_resource`` when it is resumed: its ``search.json`` keeps
    every decision taken (the rung it was pruned at included) and says ``"exempt": true`` (the
    runtime judges it no more) and ``"pruned": false`` (:func:`core.search.unprune`); its
    ``status.json``, under the trial's claim, keeps its attempts and says NOT_SUBMITTED (the
    runtime skips a trial recorded PRUNED). Its rung records stay: other trials were judged
    against them."""
    try:
        done = core.unprune(trial_dir)
    except Damaged:  # unreadable: nothing of it to keep
        done = False
    if not done:
        record = {"rungs": [], "pruned": False, "exempt": True, "unpruned_at": time.time()}
        atomic_write_json(os.path.join(trial_dir, core.DECISIONS), record)
    claim = Lock(trial_dir)
    try:
        claim.acquire("unprune", wait=0)
    except LockBusy as busy:
        raise Busy(f"{busy}", hint="the trial runs: wait for it to end") from None
    try:
        path = os.path.join(trial_dir, STATUS)
        status = read_record(path, default={}) or {}
        if status.get("state") == states.PRUNED:
            atomic_write_json(path, {**status, "state": states.NOT_SUBMITTED, "reason": UNPRUNED})
    finally:
        claim.release()
