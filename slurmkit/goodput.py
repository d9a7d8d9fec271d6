"""Where the GPU-hours went (``slurmkit report``'s goodput split) and the effective training
time ratio. Pure functions of the attempts :mod:`.usagejoin` joined.

Each attempt that started with a known allocation (``units`` GPUs, or CPUs without GPUs) is
split into unit-hours of exactly one kind each, in this order of time:

- ``queued``: from when it could start (sacct's ``Eligible``) to its start;
- ``hold``: a requeued attempt (the same job as the attempt before it): from that attempt's end
  to this one's ``Eligible`` time: Slurm's requeue hold (``cred_expire`` + 1 s, until a
  releaser moves it) and the end of the old allocation (its epilog);
- ``restart``: an attempt after the trial's first: from its start to its first step (the
  runtime's ``first_progress``; else the trial's first ``slurmkit.report()`` in it);
- ``productive``: from its first step to its end when it completed; to its last checkpoint
  when it was interrupted and the trial went on (a later attempt resumed from it);
- ``lost_work``: an interrupted attempt, from its last checkpoint to its end (to where it
  stopped reporting, when the hang watchdog ended it);
- ``hang``: from an attempt's last progress to its end, when the hang watchdog ended it;
- ``bad_node``: from the last checkpoint to the end of an attempt whose failure was
  attributed to its nodes (cause ``node`` or ``node_failure``, or nodes ``blamed``);
- ``failed``: an attempt that ended its trial without success (its own error, a container
  that did not start, a user's cancel, a spent budget): from its first step to its end;
- ``running``: still allocated now (not split until it ends).

Waiting (``queued``, ``hold``) counts the units the attempt was allocated once it started; the
time before a trial's first ``Eligible`` (a user's hold, ``--begin``, a dependency) and between
a trial that ended and its resubmission is the user's, and is not counted. So per trial,
``queued + hold + allocated`` is its wall time from first eligibility to its last end (less any
such gap), and the kinds sum to it. A figure the records do not have (no ``first_progress`` nor
report, no ``Eligible``, a hang without its last progress) counts as zero, and the attempt's
``unknown`` names it.

**ETTR** (effective training time ratio) is Meta's figure of merit: productive runtime over
the available wall-clock time of the job (Kokolis et al., "Revisiting Reliability in
Large-Scale Machine Learning Research Clusters", HPCA 2025, arXiv:2410.21680): here
``productive / (productive + every lost kind)``, in unit-hours, with queue and hold time in the
wall time; running attempts are left out of both. ``ettr_allocated`` is productive over
allocated time alone (no queue, no hold).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .usagejoin import Attempt

KINDS = (
    "productive",
    "queued",
    "hold",
    "restart",
    "lost_work",
    "hang",
    "bad_node",
    "failed",
    "running",
)
WAITING = ("queued", "hold")
ALLOCATED_LOST = ("restart", "lost_work", "hang", "bad_node", "failed")
LOST = WAITING + ALLOCATED_LOST
NODE_CAUSES = ("node", "node_failure")
# Outcomes whose whole run was productive: a trial that ran to its end, or that its search
# pruned (it did what it was asked: its hours are useful, as report counts them).
ENDED_WELL = ("completed", "pruned")
_HOURS = attrgetter(*(f"{kind}_hours" for kind in KINDS))


def first_step(
    record: dict[str, Any] | None, reports: Sequence[float], start: float, stop: float
) -> float | None:
    """When an attempt's first step came: its record's ``first_progress``, else the first of
    the trial's ``reports`` (metric times) inside it; None when neither says."""
    recorded = number((record or {}).get("first_progress"))
    if recorded is not None:
        return recorded
    return min((t for t in reports if start <= t < stop + 1), default=None)


def hang_start(record: dict[str, Any] | None, cause: str | None) -> float | None:
    """Where a hang began: the watchdog's ``hang.last_progress``, else the record's
    ``last_progress`` when the attempt ended for ``hang``; None for no hang (or unknown)."""
    record = record or {}
    hang = record.get("hang")
    found = number(hang.get("last_progress")) if isinstance(hang, dict) else None
    if found is None and cause == "hang":
        found = number(record.get("last_progress"))
    return found


def split(
    a: Attempt,
    previous: Attempt | None,
    first: float | None,
    hang_from: float | None,
) -> None:
    """Fill ``a``'s goodput fields (unit-hours of each kind, ``unknown``): ``previous`` is the
    trial's attempt before it, ``first`` its first step, ``hang_from`` where its hang began
    (:func:`first_step`, :func:`hang_start`). See the module doc."""
    if a.start is None or not a.units:
        return
    per_s = a.units / 3600
    if previous is None and a.outcome in ENDED_WELL and a.eligible is not None:  # most
        a.queued_hours = per_s * max(0.0, a.start - a.eligible)
        a.productive_hours = a.useful_hours
        return
    unknown: list[str] = []
    requeued = previous is not None and bool(a.job) and previous.job == a.job
    eligible = a.eligible
    if eligible is None:
        unknown.append("hold" if requeued else "queued")
        eligible = a.submit  # the hold, if any, counts as queued
    if eligible is not None:
        eligible = min(eligible, a.start)
        a.queued_hours = per_s * (a.start - eligible)
        if requeued and previous is not None and previous.end is not None:
            a.hold_hours = per_s * max(0.0, eligible - previous.end)
    stop = a.start + (a.run_s or 0.0)
    if a.outcome == "running":
        a.unknown = tuple(unknown)
        return
    began = a.start
    if a.n > 1:
        if first is None:
            unknown.append("restart")
        else:
            began = min(max(first, a.start), stop)
        a.restart_hours = per_s * (began - a.start)
    kept = stop if a.outcome in ENDED_WELL else began
    if a.outcome == "interrupted" and a.checkpoint is not None:
        kept = min(max(a.checkpoint, began), stop)
    a.productive_hours = per_s * (kept - began)
    if a.cause in NODE_CAUSES or a.blamed:
        a.bad_node_hours = per_s * (stop - kept)
    elif kept < stop:
        if hang_from is None and a.cause == "hang":
            unknown.append("hang")
        hung = stop if hang_from is None else min(max(hang_from, kept), stop)
        a.hang_hours = per_s * (stop - hung)
        lost = per_s * (hung - kept)
        if a.outcome == "interrupted":
            a.lost_work_hours = lost
        else:
            a.failed_hours = lost
    a.unknown = tuple(unknown)


def summary(attempts: Sequence[Attempt], unit: str) -> dict[str, Any] | None:
    """The split of the attempts of one ``unit`` ("gpu", "cpu") summed, with ``lost`` (every
    lost kind), ``ettr``, ``ettr_allocated`` and ``unknown`` (figure -> attempts that lack
    it); None when no attempt had an allocation of that unit."""
    mine = [a for a in attempts if a.unit == unit and a.units]
    if not mine:
        return None
    columns = zip(*map(_HOURS, mine))
    hours = {kind: sum(column) for kind, column in zip(KINDS, columns)}
    lost = sum(hours[k] for k in LOST)
    allocated = hours["productive"] + sum(hours[k] for k in ALLOCATED_LOST)
    return {
        **hours,
        "lost": lost,
        "ettr": ratio(hours["productive"], hours["productive"] + lost),
        "ettr_allocated": ratio(hours["productive"], allocated),
        "unknown": dict(sorted(Counter(f for a in mine for f in a.unknown).items())),
    }


def ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def number(value: Any) -> float | None:
    """A recorded number as a float; None for anything else (a bool too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
