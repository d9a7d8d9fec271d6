"""A sweep's state: the trials' status files merged with ONE scheduler query per backend."""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import backends, searchview, store
from .backends.base import LiveTask
from .core import badnodes, states
from .core.search import Search


@dataclass
class TrialStatus:
    """What is known about one trial, from its status file and the scheduler."""

    index: int
    id: str
    params: dict[str, Any]
    state: str
    exit_code: int | None = None
    attempts: int = 0
    host: str | None = None
    job: str | None = None
    reason: str = ""
    cause: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # under a search: the rungs it reached, {"rung", "resource", "value"} each (searchview.py);
    # None: its sweep has no search (or they were not read: with_metrics=False)
    rungs: list[dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.rungs is None:
            del out["rungs"]  # a sweep without a search: as before
        return out


@dataclass
class SweepStatus:
    sweep_dir: str
    name: str
    trials: list[TrialStatus]
    warnings: list[str] = field(default_factory=list)  # damaged files: one line each
    nodes: list[dict[str, Any]] = field(default_factory=list)  # suspects (core/badnodes.py)
    search: Search | None = None  # the sweep's search (early stopping), when it has one

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(t.state for t in self.trials)
        return {s: c[s] for s in states.ORDER if c[s]}

    @property
    def finished(self) -> bool:
        return all(t.state in states.FINAL or t.state == states.NOT_SUBMITTED for t in self.trials)

    @property
    def ok(self) -> bool:
        return all(t.state in states.SUCCESS for t in self.trials)

    @property
    def failed(self) -> bool:
        """Some trial ended without success (``slurmkit status`` then exits 1)."""
        return any(t.state in states.UNSUCCESSFUL for t in self.trials)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sweep_dir": self.sweep_dir,
            "name": self.name,
            "counts": self.counts,
            "finished": self.finished,
            "trials": [t.as_dict() for t in self.trials],
            **({"search": self.search.to_dict()} if self.search is not None else {}),
            **({"warnings": self.warnings} if self.warnings else {}),
            **({"nodes": self.nodes} if self.nodes else {}),
        }


def collect(root: str, *, with_metrics: bool = True, fresh: bool = False) -> SweepStatus:
    """The state of every trial of the sweep at ``root``, with each started trial's latest
    metrics (``with_metrics=False``: without them, one file less per trial, for loops that
    poll and show no metrics; :func:`add_metrics` fills them in later). A damaged file (status,
    metrics, manifest line, submission record, sweep.json) costs only what it holds: the trial shows
    as DAMAGED, and ``warnings`` names the file. A sweep with a search also gets, with the
    metrics, the rungs each trial reached (one directory listing per rung). A PRUNED trial
    is final and no failure. The scheduler's answer may be up to
    ``SLURMKIT_POLL_INTERVAL`` seconds old (one query per interval for all of the user's
    callers: :mod:`slurmkit.backends.pollcache`), unless ``fresh``."""
    sweep = store.open_sweep(root)
    warnings: list[str] = []
    config = store.config(sweep, warnings)
    rows = store.manifest(sweep, warnings)
    files = store.read_statuses(sweep, warnings=warnings)
    unfinished = {  # a PRUNED trial's task too: after --unprune its new one is what counts
        i
        for i, r in enumerate(rows)
        if r is None or (files.get(r["id"]) or {}).get("state") != states.COMPLETED
    }
    live = backends.live_tasks(
        store.submissions(sweep, warnings), unfinished.__contains__, fresh=fresh
    )
    trials = []
    for index, row in enumerate(rows):
        if row is None:
            trials.append(TrialStatus(index, "", {}, states.DAMAGED))
            continue
        damaged = row["id"] in files and files[row["id"]] is None
        t = _merge(row, files.get(row["id"]), live.get(index), damaged=damaged)
        if with_metrics and row["id"] in files:
            t.metrics = store.metrics(sweep, row["id"], warnings)
        trials.append(t)
    name = config.get("name") if isinstance(config.get("name"), str) else None
    suspects = [s.to_dict() for s in badnodes.suspects(sweep.root)]
    search = searchview.of_config(config, sweep.sweep_json, warnings)
    found = SweepStatus(
        sweep.root, name or os.path.basename(sweep.root), trials, warnings, suspects, search
    )
    return _add_rungs(found) if with_metrics else found


def _add_rungs(current: SweepStatus) -> SweepStatus:
    """Each trial's rungs reached (a sweep with a search)."""
    if current.search is not None:
        reached = searchview.rungs_by_trial(current.sweep_dir, current.search)
        for t in current.trials:
            t.rungs = reached.get(t.id, [])
    return current


def add_metrics(current: SweepStatus) -> SweepStatus:
    """``current`` (collected without metrics) with each trial's latest metrics (and rungs),
    as :func:`collect` gives them by default."""
    sweep = store.open_sweep(current.sweep_dir)
    for t in current.trials:
        if t.id and not t.metrics and t.state != states.DAMAGED:
            t.metrics = store.metrics(sweep, t.id, current.warnings)
    return _add_rungs(current)


class Seen(NamedTuple):
    """What is known of one trial when its state is decided."""

    file: str | None  # the state its status.json records; None: it never started
    slurm: str | None  # the scheduler's state of the task that owns it; None: not known
    same_job: bool  # its last recorded attempt ran in that task
    owned: bool  # a scheduler task owns it (from its latest submission)
    here: bool  # a live process of this machine runs it (local backend)

    @property
    def queued(self) -> bool:
        """The scheduler still has the task (queued, running or being requeued)."""
        return self.slurm is not None and self.slurm in states.SLURM_ACTIVE

    @property
    def vanished(self) -> bool:
        """Its record says it was running or stopping, and no process here runs it."""
        return self.file in states.IN_FLIGHT and not self.here


class Case(NamedTuple):
    """One row of :data:`CASES`: ``when`` it applies, the trial's ``state`` is this."""

    name: str
    when: Callable[[Seen], bool]
    state: Callable[[Seen], str]


def _scheduler(s: Seen) -> str:
    return states.from_slurm(s.slurm or "")


CASES: tuple[Case, ...] = (
    Case(
        "damaged: its status file cannot be read (not completed: resume runs it again)",
        lambda s: s.file == states.DAMAGED and not s.queued and not s.here,
        lambda s: states.DAMAGED,
    ),
    Case(
        "completed: its own record says so, whatever the scheduler",
        lambda s: s.file == states.COMPLETED,
        lambda s: states.COMPLETED,
    ),
    Case(
        "requeued by its own task: waiting again, or back in the scheduler's hands",
        lambda s: s.queued and s.same_job and s.file == states.REQUEUED,
        lambda s: states.REQUEUED if s.slurm == states.SLURM_PENDING else _scheduler(s),
    ),
    Case(
        "running in its own task",
        lambda s: s.queued and s.same_job and s.file == states.RUNNING,
        lambda s: states.RUNNING,
    ),
    Case(
        "ended in its own task, which Slurm is still cleaning up",
        lambda s: (
            s.queued
            and s.same_job
            and s.file in states.FINAL
            and s.file not in (states.TERMINATED, states.DAMAGED)
            and not states.slurm_waiting(s.slurm or "")
        ),
        lambda s: s.file or "",
    ),
    Case(
        "queued or running, per the scheduler (a new task, or a record it overtook)",
        lambda s: s.queued,
        _scheduler,
    ),
    Case(
        "vanished, and the scheduler says how its task ended",
        lambda s: s.vanished and s.slurm is not None,
        _scheduler,
    ),
    Case(
        "vanished, with no scheduler task: stopped by a signal",
        lambda s: s.vanished and not s.owned,
        lambda s: states.TERMINATED,
    ),
    Case(
        "vanished, and the scheduler forgot its task",
        lambda s: s.vanished,
        lambda s: states.UNKNOWN,
    ),
    Case(
        "ended: its record says how",
        lambda s: s.file is not None and s.file != states.DAMAGED,
        lambda s: s.file or "",
    ),
    Case(
        "never started, and the scheduler says how its task ended",
        lambda s: s.owned and s.slurm is not None,
        _scheduler,
    ),
    Case(
        "never started, and the scheduler forgot its task",
        lambda s: s.owned,
        lambda s: states.UNKNOWN,
    ),
    Case("about to start here", lambda s: s.here, lambda s: states.PENDING),
    Case("never submitted", lambda s: True, lambda s: states.NOT_SUBMITTED),
)


@functools.lru_cache(maxsize=4096)  # pure, and a sweep's trials see few distinct things
def decide(seen: Seen) -> tuple[str, Case]:
    """The state of a trial, and the row of :data:`CASES` that decided it (the first that
    applies). The trial's own status file is trusted for what it saw (COMPLETED always); the
    scheduler for what happened since, or when the trial could not record it."""
    for case in CASES:
        if case.when(seen):
            return case.state(seen), case
    raise AssertionError("the last case applies to every trial")


def _merge(
    row: dict[str, Any],
    status: dict[str, Any] | None,
    live: LiveTask | None,
    damaged: bool = False,
) -> TrialStatus:
    """One trial's status from its manifest row, status file (None: it never started, or with
    ``damaged`` its file cannot be read) and live task."""
    if status:
        attempts = status.get("attempts", [])
        last = attempts[-1] if attempts else {}
        file, exit_code, cause = status.get("state"), status.get("exit_code"), status.get("cause")
        why = status.get("reason") if isinstance(status.get("reason"), str) else ""
    else:
        attempts, last, file, exit_code, cause, why = [], {}, None, None, None, ""
    job, task, here = live if live is not None else (None, None, False)
    same_job = (
        job is not None
        and bool(last)
        and f"{last.get('array_job_id')}_{last.get('array_task_id')}" == job
    )
    seen = Seen(
        file=states.DAMAGED if damaged else file,
        slurm=task.state if task is not None else None,
        same_job=same_job,
        owned=job is not None,
        here=here,
    )
    state, _ = decide(seen)
    t = TrialStatus(
        row["index"],
        row["id"],
        row["params"],
        state,
        exit_code=exit_code,
        attempts=len(attempts),
        host=last.get("host"),
        job=job,
        cause=cause,
    )
    if task is not None:
        t.reason = task.reason if task.reason not in ("None", "") else ""
        if seen.file is None and seen.owned and not seen.queued and task.exit_code is not None:
            t.exit_code = task.exit_code
    if why and state == file and state in states.FINAL:
        t.reason = why  # the runtime's own word on how it ended beats Slurm's NonZeroExitCode
    return t


def wait(
    fetch: Callable[[], SweepStatus],
    interval: float = 2.0,
    on_poll: Callable[[SweepStatus], None] | None = None,
) -> SweepStatus:
    """Poll (one scheduler query each time) until every trial has finished; ``on_poll`` sees
    every poll's status."""
    while True:
        current = fetch()
        if on_poll is not None:
            on_poll(current)
        if current.finished:
            return current
        time.sleep(interval)
