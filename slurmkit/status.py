"""A sweep's state: the trials' status files merged with ONE scheduler query for the sweep."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from . import store
from .core import states
from .backends import slurm
from .core.fsutil import read_json
from .core.arrays import expand_array_spec


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

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SweepStatus:
    sweep_dir: str
    name: str
    trials: list[TrialStatus]

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(t.state for t in self.trials)
        return {s: c[s] for s in states.ORDER if c[s]}

    @property
    def finished(self) -> bool:
        return all(t.state in states.FINAL or t.state == states.NOT_SUBMITTED for t in self.trials)

    @property
    def ok(self) -> bool:
        return all(t.state == states.COMPLETED for t in self.trials)

    def as_dict(self) -> dict[str, Any]:
        return {"sweep_dir": self.sweep_dir, "name": self.name, "counts": self.counts,
                "finished": self.finished, "trials": [t.as_dict() for t in self.trials]}


def _owners(subs: list[dict[str, Any]]) -> tuple[dict[int, tuple[str, int]], set[int]]:
    """Latest Slurm (job, task) per trial index, and the indices last run by a live local run."""
    owner: dict[int, tuple[str, int]] = {}
    local_live: set[int] = set()
    for sub in subs:
        if sub.get("backend") == "local":
            indices = expand_array_spec(sub["indices"]) if sub.get("indices") else []
            alive = pid_alive(sub.get("pid"))
            for i in indices:
                owner.pop(i, None)
                local_live.discard(i)
                if alive:
                    local_live.add(i)
            continue
        for job in sub.get("jobs", []):
            for task in expand_array_spec(job["array"]):
                owner[job["offset"] + task] = (job["job_id"], task)
                local_live.discard(job["offset"] + task)
    return owner, local_live


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def collect(root: str, *, with_metrics: bool = False) -> SweepStatus:
    """The state of every trial of the sweep at ``root``."""
    sweep = store.open_sweep(root)
    config = read_json(sweep.sweep_json)
    rows = list(sweep.iter_manifest())
    files = store.read_statuses(sweep)
    owner, local_live = _owners(store.submissions(sweep))
    pending_jobs = {owner[r["index"]][0] for r in rows if r["index"] in owner
                    and files.get(r["id"], {}).get("state") != states.COMPLETED}
    sched = slurm.query(pending_jobs) if pending_jobs and slurm.available() else {}
    trials = []
    for row in rows:
        status = files.get(row["id"])
        key = owner.get(row["index"])
        task = sched.get(key) if key else None
        t = _merge(row, status, key, task, row["index"] in local_live)
        if with_metrics:
            t.metrics = read_json(sweep.metrics(row["id"]), default={}) if status else {}
        trials.append(t)
    return SweepStatus(sweep.root, config.get("name", os.path.basename(sweep.root)), trials)


def _merge(row: dict[str, Any], status: dict[str, Any] | None, key: tuple[str, int] | None,
           task: slurm.TaskState | None, local_live: bool) -> TrialStatus:
    attempts = status.get("attempts", []) if status else []
    last = attempts[-1] if attempts else {}
    t = TrialStatus(row["index"], row["id"], row["params"], states.NOT_SUBMITTED,
                    exit_code=status.get("exit_code") if status else None, attempts=len(attempts),
                    host=last.get("host"), job=f"{key[0]}_{key[1]}" if key else None,
                    cause=status.get("cause") if status else None)
    file_state = status.get("state") if status else None
    same_job = bool(key) and (last.get("array_job_id"), last.get("array_task_id")) == \
        (key[0], str(key[1]))
    if task is not None:
        t.reason = task.reason if task.reason not in ("None", "") else ""
    if file_state == states.COMPLETED:
        t.state = states.COMPLETED
    elif task is not None and task.state in states.SLURM_ACTIVE:
        if same_job and file_state == states.REQUEUED:
            t.state = states.REQUEUED if task.state == "PENDING" else states.from_slurm(task.state)
        elif same_job and file_state == states.RUNNING:
            t.state = states.RUNNING
        elif same_job and file_state in states.FINAL and file_state != states.TERMINATED \
                and not task.state.startswith(("PENDING", "REQUEUE")):
            t.state = file_state  # finished; Slurm is still cleaning up
        else:
            t.state = states.from_slurm(task.state)
    elif file_state is not None:
        t.state = file_state
        if file_state in (states.RUNNING, states.TERMINATED, states.REQUEUED) and not local_live:
            # the process is gone: say why, if the scheduler knows
            t.state = states.from_slurm(task.state) if task is not None else (
                states.TERMINATED if key is None else states.UNKNOWN)
    elif key is not None:
        t.state = states.from_slurm(task.state) if task is not None else states.UNKNOWN
        if task is not None and task.exit_code is not None:
            t.exit_code = task.exit_code
    elif local_live:
        t.state = states.PENDING
    return t


def wait(fetch: Callable[[], SweepStatus], interval: float = 2.0,
         on_poll: Callable[[SweepStatus], None] | None = None) -> SweepStatus:
    """Poll (one scheduler query each time) until every trial has finished; ``on_poll`` sees
    every poll's status."""
    while True:
        current = fetch()
        if on_poll is not None:
            on_poll(current)
        if current.finished:
            return current
        time.sleep(interval)
