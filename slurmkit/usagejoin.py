"""The attempts of one trial, for ``slurmkit report`` (:mod:`.usage`): accounting's rows
joined with the runtime's records of them, why each ended, its unit-hours useful, lost or
running, and where they went (:mod:`.goodput`). Pure functions of what :mod:`.usage` read.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import goodput
from .accounting import Row
from .core import states
from .goodput import number

# Why an attempt stopped: the runtime's causes (runtime/requeue.py) and a user's cancel.
CAUSES = (
    "preemption",
    "timeout",
    "node_failure",
    "node",
    "hang",
    "container",
    "error",
    "cancelled",
)
# Causes whose work up to the last checkpoint is kept when the trial goes on.
INTERRUPTIONS = ("preemption", "timeout", "node_failure", "node", "hang", "cancelled")
OUTCOMES = ("completed", "pruned", "interrupted", "failed", "cancelled", "running")
# A runtime record starts a little after its allocation (the batch shell, Python), and never
# long before or after it: how far apart the two may be and still be one attempt.
SKEW = 60.0
# Slurm states of an attempt that has not ended. The row of a requeued attempt says REQUEUED:
# that attempt has ended (without the runtime's record: requeued from outside, a preemption).
_LIVE = states.SLURM_ACTIVE - {"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"}
_CAUSE_OF_SLURM = {
    "PREEMPTED": "preemption",
    "TIMEOUT": "timeout",
    "NODE_FAIL": "node_failure",
    "BOOT_FAIL": "node_failure",
    "FAILED": "error",
    "OUT_OF_MEMORY": "error",
    "CANCELLED": "cancelled",
    "DEADLINE": "cancelled",
}


@dataclass
class Attempt:
    """One attempt of one trial: the allocation accounting saw and why it ended."""

    n: int
    job: str  # ARRAYJOBID_TASKID ("" when no scheduler ran it: the local backend)
    state: str  # how it ended, as a trial state (COMPLETED, REQUEUED, FAILED, RUNNING, ...)
    cause: str | None  # one of CAUSES; None when it completed or runs
    outcome: str  # one of OUTCOMES
    partition: str = ""
    account: str = ""
    user: str = ""
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    queue_s: float | None = None  # submit -> start (a requeued attempt: since its requeue)
    run_s: float | None = None  # start -> end (or now)
    unit: str = ""  # "gpu", "cpu", or "" without an allocation (no accounting)
    units: int = 0  # GPUs (or CPUs) allocated, all nodes together
    checkpoint: float | None = None  # when its last checkpoint was committed (interrupted)
    useful_hours: float = 0.0
    lost_hours: float = 0.0
    running_hours: float = 0.0
    cost: float | None = None  # None: its partition has no price
    eligible: float | None = None  # when it could start (accounting's Eligible)
    first_step: float | None = None  # its first step (an attempt after the trial's first)
    blamed: tuple[str, ...] = ()  # the nodes its failure was attributed to
    # where its unit-hours went (goodput.KINDS; running_hours above), and the figures unknown
    productive_hours: float = 0.0
    queued_hours: float = 0.0
    hold_hours: float = 0.0
    restart_hours: float = 0.0
    lost_work_hours: float = 0.0
    hang_hours: float = 0.0
    bad_node_hours: float = 0.0
    failed_hours: float = 0.0
    unknown: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)  # scalars only: no deep copy (asdict) of 10,000 attempts


def commit_times(text: str) -> tuple[list[float], int]:
    """The commit times in a checkpoint journal, and how many lines could not be read."""
    out: list[float] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            when = json.loads(line)["time"]
            if isinstance(when, bool) or not isinstance(when, (int, float)):
                raise TypeError(when)
            out.append(float(when))
        except (ValueError, KeyError, TypeError):
            bad += 1
    return out, bad


def trial_state(recorded: str | None, rows: Sequence[Row]) -> str:
    """A trial's state now: COMPLETED when its record says so; the scheduler's when accounting
    has it queued or running; else its record's; else how its last job ended."""
    if recorded == states.COMPLETED:
        return recorded
    last = max(rows, key=_order, default=None)
    if last is not None and last.state in states.SLURM_ACTIVE:
        return states.from_slurm(last.state)
    if recorded and not (recorded == states.RUNNING and last is not None):
        return recorded
    return states.from_slurm(last.state) if last is not None else states.NOT_SUBMITTED


def pair(
    rows: Sequence[Row], records: Sequence[dict[str, Any]], since: float | None = None
) -> list[tuple[Row | None, dict[str, Any] | None]]:
    """Accounting's attempts (rows that started) matched with the runtime's records of them,
    in the order they started: by job id and restart count, else by the nearest start. A row
    without a record (the runtime could not write one) or a record without a row (no
    accounting, the local backend) stands alone; with ``since``, a lone record from before it
    is left out."""
    started = [r for r in rows if r.start is not None]
    if len(started) > 1:
        started.sort(key=_order)
    if not records:
        return [(row, None) for row in started]
    if len(started) == 1 and len(records) == 1:  # most trials: one run, one record
        row, rec = started[0], records[0]
        start = number(rec.get("start"))
        if start is not None and str(rec.get("job_id")) == row.raw and _fits(row, start):
            return [(row, rec)]
    by_raw: dict[str, list[Row]] = defaultdict(list)
    for row in started:
        by_raw[row.raw].append(row)
    taken: set[int] = set()
    pairs: list[tuple[Row | None, dict[str, Any] | None]] = []
    for rec in records:
        start = number(rec.get("start"))
        found: Row | None = None
        if start is not None and rec.get("job_id") is not None:
            candidates = by_raw.get(str(rec["job_id"]), [])
            fits = [r for r in candidates if id(r) not in taken and _fits(r, start)]
            k = _count(rec.get("restart_count"))
            if k < len(candidates) and any(r is candidates[k] for r in fits):
                found = candidates[k]
            elif fits:
                found = min(fits, key=lambda r: abs((r.start or 0) - start))
        if found is not None:
            taken.add(id(found))
        elif since is not None and (start or 0) < since:
            continue
        pairs.append((found, rec))
    pairs += [(row, None) for row in started if id(row) not in taken]
    pairs.sort(key=lambda p: _begin(*p))
    return pairs


def join_trial(
    rows: Sequence[Row],
    records: Sequence[dict[str, Any]],
    state: str,
    commits: Callable[[], list[float]],
    prices: dict[str, float],
    now: float,
    since: float | None = None,
    reports: Callable[[], list[float]] = list,
) -> list[Attempt]:
    """A trial's attempts: accounting's ``rows`` joined with ``status.json``'s ``records``.
    ``state`` is the trial's state now; ``commits()`` reads its checkpoint journal (only when
    an attempt was interrupted), ``reports()`` the times of its metrics (only for a resumed
    attempt whose record has no ``first_progress``)."""
    pairs = pair(rows, records, since)
    active = state in states.ACTIVE
    journal: list[float] | None = None
    reported: list[float] | None = None
    out: list[Attempt] = []
    for n, (row, rec) in enumerate(pairs, 1):
        ended, cause = ending(row, rec)
        later = n < len(pairs)
        if ended == states.COMPLETED:
            outcome = "completed"
        elif ended == states.PRUNED:  # stopped early by the search: its work was used
            outcome = "pruned"
        elif ended in (states.RUNNING, states.PENDING):
            outcome = "running"
        elif cause in INTERRUPTIONS and (later or active):
            outcome = "interrupted"
        elif cause == "cancelled":
            outcome = "cancelled"
        else:
            outcome = "failed"
        a = Attempt(n, row.ref if row else "", ended, cause, outcome)
        if row is not None:
            a.partition, a.account, a.user = row.partition, row.account, row.user
            a.submit, a.start, a.end = row.submit, row.start, row.end
            a.unit, a.units = ("gpu", row.gpus) if row.gpus else ("cpu", row.cpus)
            a.eligible = row.eligible
        elif rec is not None:
            a.start, a.end = number(rec.get("start")), number(rec.get("end"))
        if a.start is not None:
            a.queue_s = a.start - a.submit if a.submit is not None else None
            a.run_s = max(0.0, (a.end if a.end is not None else now) - a.start)
        if outcome == "interrupted" and a.start is not None:
            journal = commits() if journal is None else journal
            # Until accounting's end (whole seconds, cut: before end + 1), or the runtime's own
            # end where later: a preempted job goes on for its GraceTime after accounting's end,
            # and may commit a checkpoint then.
            stop = a.end if a.end is not None else now
            ran = number(rec.get("end")) if rec else None
            if ran is not None:
                stop = max(stop, ran)
            a.checkpoint = max((t for t in journal if a.start <= t < stop + 1), default=None)
            if a.checkpoint is None:  # no journal: the runtime's own view, where it has one
                seen = number(rec.get("last_checkpoint")) if rec else None
                a.checkpoint = seen if seen is not None and a.start <= seen < stop + 1 else None
        hours(a, now)
        if rec is not None and isinstance(rec.get("blamed"), list):
            a.blamed = tuple(str(name) for name in rec["blamed"])
        if a.units and a.start is not None:
            if n > 1:
                if reported is None and not (rec and "first_progress" in rec):
                    reported = reports()
                stop = a.start + (a.run_s or 0.0)
                a.first_step = goodput.first_step(rec, reported or (), a.start, stop)
            hang = goodput.hang_start(rec, cause) if rec is not None else None
            goodput.split(a, out[-1] if out else None, a.first_step, hang)
        price = prices.get(a.partition)
        total = a.useful_hours + a.lost_hours + a.running_hours
        a.cost = total * price if price is not None else (0.0 if not total else None)
        out.append(a)
    return out


def ending(row: Row | None, rec: dict[str, Any] | None) -> tuple[str, str | None]:
    """How an attempt ended (a trial state) and why (one of CAUSES, or None): the runtime's
    record says it; accounting says it when the record has none (or says it still runs)."""
    recorded = rec.get("state") if rec else None
    if isinstance(recorded, str) and recorded not in (states.RUNNING, states.PENDING):
        cause = rec.get("cause") if rec else None
        if recorded in (states.CANCELLED, states.TERMINATED):
            return recorded, "cancelled"
        if recorded in states.SUCCESS:  # COMPLETED, PRUNED
            return recorded, None
        fixed = {states.TIMEOUT: "timeout", states.NODE_FAIL: "node_failure"}.get(recorded)
        if isinstance(cause, str) and cause in CAUSES and fixed is None:
            return recorded, cause
        return recorded, fixed or "error"
    if row is None or row.end is None or row.state in _LIVE:
        return states.RUNNING, None
    if row.state == "COMPLETED":
        return states.COMPLETED, None
    cause = "preemption" if row.state.startswith("REQUEUE") else _CAUSE_OF_SLURM.get(row.state)
    return states.from_slurm(row.state), cause or "error"


def hours(a: Attempt, now: float) -> None:
    """Split the attempt's unit-hours into useful, lost and running (see the module doc)."""
    if a.start is None or not a.units:
        return
    stop = a.end if a.end is not None else now
    total = a.units * max(0.0, stop - a.start) / 3600
    if a.outcome == "running":
        a.running_hours = total
    elif a.outcome in ("completed", "pruned"):
        a.useful_hours = total
    elif a.outcome == "interrupted" and a.checkpoint is not None:
        a.useful_hours = a.units * (min(a.checkpoint, stop) - a.start) / 3600
        a.lost_hours = total - a.useful_hours
    else:
        a.lost_hours = total


def done_once(rows: Sequence[Row]) -> bool:
    """Accounting saw the trial run once, to completion: its status file adds nothing."""
    return len(rows) == 1 and rows[0].state == "COMPLETED" and rows[0].start is not None


def _fits(row: Row, start: float) -> bool:
    """A runtime record that started at ``start`` can be this allocation's attempt."""
    return (row.start or 0) - SKEW <= start and (row.end is None or start <= row.end + SKEW)


def _order(row: Row) -> tuple[float, float]:
    return (row.submit or 0.0, row.start if row.start is not None else math.inf)


def _begin(row: Row | None, rec: dict[str, Any] | None) -> float:
    if row is not None and row.start is not None:
        return row.start
    return number(rec.get("start") if rec else None) or 0.0


def _count(value: Any) -> int:
    """SLURM_RESTART_COUNT as recorded (a string; absent on a first run)."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0
