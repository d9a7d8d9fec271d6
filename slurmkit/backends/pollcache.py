"""One scheduler query per interval for every caller of one user on one login node.

Status calls, ``--wait``, ``Sweep.wait()`` and notebook pollers all ask about the same user's
jobs. The answer of one ``squeue`` over ALL of a user's jobs is kept in a small file in the
user's cache directory, with the time it was taken; callers within ``interval`` seconds read
it, and the first caller after that takes the cache's lock (:mod:`slurmkit.core.lock`) and
asks again while the others wait for its answer. So N pollers cost one query per interval.

A job the cached answer does not hold is either newer than the answer (it was just submitted)
or gone from the controller (ended more than MinJobAge ago). The first caller to miss it asks
squeue once more, at once; a job still missing then is gone, and its end state is asked from
accounting (``sacct``) once and kept: an ended job's state never changes. So a job costs at
most one extra ``squeue`` and one ``sacct`` over its whole life, whoever asks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..core.arrays import compress, expand_array_spec
from ..core.fsutil import atomic_write_json
from ..core.lock import Lock
from .base import TaskState

DEFAULT_INTERVAL = 10.0
KEEP_GONE = 10_000  # ended jobs whose answers are kept (oldest dropped first)

Answer = dict[tuple[str, int], TaskState]
UserQuery = Callable[[], Answer]  # one squeue over all of the user's jobs
GoneQuery = Callable[[list[str]], Answer]  # one sacct over the given (ended) jobs


def interval() -> float:
    """``SLURMKIT_POLL_INTERVAL`` seconds (default 10); 0 asks the scheduler every time."""
    try:
        value = float(os.environ.get("SLURMKIT_POLL_INTERVAL") or DEFAULT_INTERVAL)
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value >= 0 else DEFAULT_INTERVAL


def directory() -> str:
    """Where the caches live: ``$XDG_CACHE_HOME/slurmkit`` (default ``~/.cache/slurmkit``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "slurmkit")


def _encode(answer: Answer) -> dict[str, list[list[Any]]]:
    """``{job: [[TASKS, state, reason, exit_code], ...]}``: the tasks of one job in one state
    as an array spec ("0-9999"; "" for a job that is no array), as compact as squeue's own."""
    groups: dict[str, dict[tuple[str, str, int | None], list[int]]] = {}
    for (job, task), s in answer.items():
        groups.setdefault(job, {}).setdefault((s.state, s.reason, s.exit_code), []).append(task)
    return {
        job: [["" if tasks == [-1] else compress(tasks), *key] for key, tasks in by.items()]
        for job, by in groups.items()
    }


def _decode(data: dict[str, list[list[Any]]], jobs: set[str]) -> Answer:
    """The tasks of ``jobs`` only (the cache holds all of the user's)."""
    out: Answer = {}
    for job in jobs & data.keys():
        for spec, state, reason, code in data[job]:
            for task in expand_array_spec(spec) if spec else [-1]:
                out[(job, task)] = TaskState(state, reason, code)
    return out


class PollCache:
    """The shared answer about ``user``'s jobs, at most ``interval`` seconds old."""

    def __init__(self, user: str, interval: float, root: str | None = None) -> None:
        self.root = root or directory()
        self.path = os.path.join(self.root, f"squeue-{os.uname().nodename}-{user}.json")
        self.interval = interval
        self.lock = Lock(self.root)

    def _read(self) -> dict[str, Any]:
        try:
            with open(self.path, "rb") as fh:
                data = json.load(fh)
            if isinstance(data, dict) and isinstance(data.get("time"), (int, float)):
                return data
        except (OSError, ValueError):  # none yet, or damaged: ask again
            pass
        return {"time": 0.0, "live": {}, "gone": {}}

    def _fresh(self, data: dict[str, Any]) -> bool:
        return time.time() - data["time"] < self.interval

    def tasks(self, jobs: Iterable[str], ask_user: UserQuery, ask_gone: GoneQuery) -> Answer:
        """``{(job, task): TaskState}`` of the given jobs (array job ids)."""
        wanted = set(jobs)
        data = self._read()
        if not self._fresh(data) or self._missing(data, wanted):
            data = self._refresh(wanted, ask_user, ask_gone)
        return {**_decode(data["gone"], wanted), **_decode(data["live"], wanted)}

    @staticmethod
    def _missing(data: dict[str, Any], wanted: set[str]) -> set[str]:
        return wanted - data["live"].keys() - data["gone"].keys() - set(data.get("asked_gone", []))

    def _refresh(self, wanted: set[str], ask_user: UserQuery, ask_gone: GoneQuery) -> Any:
        os.makedirs(self.root, exist_ok=True)
        with self.lock.held("poll", wait=self.interval + 60):
            data = self._read()  # another caller may have asked meanwhile
            if self._fresh(data) and not self._missing(data, wanted):
                return data
            live = _encode(ask_user())
            taken = time.time()
            gone: dict[str, list[list[Any]]] = data["gone"]
            asked = set(data.get("asked_gone", []))
            ended = sorted(wanted - live.keys() - gone.keys() - asked)
            if ended:
                gone = {**gone, **_encode(ask_gone(ended))}
                asked |= set(ended) - gone.keys()  # accounting knows nothing of them
            for job in list(gone)[: max(0, len(gone) - KEEP_GONE)]:  # oldest first
                del gone[job]
            data = {
                "time": taken,
                "live": live,
                "gone": gone,
                "asked_gone": sorted(asked)[-KEEP_GONE:],
            }
            atomic_write_json(self.path, data, fsync=False)
            return data

    def forget(self) -> None:
        """Drop the answer (after a cancel: the next caller asks the scheduler)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
