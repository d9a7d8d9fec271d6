"""Slurm accounting for ``slurmkit report``: ONE ``sacct --parsable2`` query, its rows parsed.

``sacct --json`` is not used: in 22.05 it reports exit code 0 for every job. ``--duplicates``
keeps every attempt of a requeued job (one row each, its own submit, start and end, and
``Eligible``: when its requeue hold ended), and ``--allocations`` leaves out the job steps.
``Comment`` comes last, so a ``|`` inside one cannot shift the other fields. Parsing is a pure
function of sacct's text (:func:`parse`).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from .core.arrays import expand_array_spec
from .errors import SchedulerError, UserError

FIELDS = (
    "JobID",
    "JobIDRaw",
    "State",
    "ExitCode",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "Partition",
    "Account",
    "User",
    "AllocTRES",
    "Comment",
)
_JOB = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]*\]))?$")  # 12, 12_3, 12_[4-9%2]
_SPAN = re.compile(r"^(\d+)([dhm])$")  # --since 7d, 12h, 30m
_SINCE_HINT = "a date (2026-11-01), a date and time (2026-11-01T08:00) or a span back (7d, 12h)"


class Row(NamedTuple):
    """One attempt of one job (array task) as accounting saw it; times in epoch seconds."""

    job: str  # the array job id (the job id of a job that is no array)
    task: int | None  # the array task id; None: no array
    raw: str  # JobIDRaw: the task's own job id (SLURM_JOB_ID)
    state: str  # sacct's first word: "CANCELLED by 0" -> CANCELLED
    exit_code: int | None
    submit: float | None
    start: float | None  # None: it has not started (pending, or cancelled while pending)
    end: float | None  # None: still running
    partition: str
    account: str
    user: str
    gpus: int  # allocated GPUs (gres/gpu of AllocTRES), all nodes together
    cpus: int  # allocated CPUs
    comment: str
    eligible: float | None = None  # when it could start (a requeued job's: the hold's end)

    @property
    def ref(self) -> str:
        """``ARRAYJOBID_TASKID`` (or the job id), as Slurm names it."""
        return self.job if self.task is None else f"{self.job}_{self.task}"


def argv(jobs: Sequence[str] = (), since: str | None = None, user: str | None = None) -> list[str]:
    """The one query: every attempt of ``jobs`` (array job ids), or of every job of ``user``
    since ``since`` (sacct's time form)."""
    out = [
        "sacct",
        "--noheader",
        "--parsable2",
        "--duplicates",
        "--allocations",
        f"--format={','.join(FIELDS)}",
    ]
    if jobs:
        return [*out, f"--jobs={','.join(jobs)}"]
    return [*out, f"--starttime={since}", "--endtime=now", f"--user={user or current_user()}"]


def run(command: Sequence[str], timeout: float = 120) -> str:
    """sacct's answer; SchedulerError when it is missing, fails or hangs (accounting off)."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SchedulerError(
            "sacct not found on PATH", hint="run on a Slurm login node with accounting"
        ) from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(
            f"sacct did not answer within {timeout:.0f} s", hint="is slurmdbd up?"
        ) from None
    if proc.returncode != 0:
        said = " ".join(proc.stderr.split())[:200] or f"exit {proc.returncode}"
        raise SchedulerError(
            f"sacct failed: {said}",
            hint="the cluster must keep accounting (slurmdbd); `slurmkit doctor` checks it",
        )
    return proc.stdout


def current_user() -> str:
    import pwd  # only where no --user is given

    return pwd.getpwuid(os.getuid()).pw_name


def since_time(text: str, now: float | None = None) -> str:
    """``--since`` as sacct's absolute local time (``2026-11-01T00:00:00``): an ISO date or
    date and time, or a span back from ``now`` (``7d``, ``12h``, ``30m``)."""
    span = _SPAN.match(text.strip())
    if span:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[span[2]]
        when = datetime.fromtimestamp(now if now is not None else time.time())
        when -= timedelta(**{unit: int(span[1])})
    else:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UserError(f"{text!r} is not a time", key="--since", hint=_SINCE_HINT) from None
        if when.tzinfo is not None:  # sacct reads local times
            when = when.astimezone().replace(tzinfo=None)
    return when.strftime("%Y-%m-%dT%H:%M:%S")


def parse(text: str) -> list[Row]:
    """sacct's rows (``--format`` of :data:`FIELDS`); a pending array's one row (``12_[4-9]``)
    becomes a row per task. Lines that are not rows are skipped."""
    rows: list[Row] = []
    times: dict[str, float | None] = {}  # many rows share a submit time: parse each once
    counts: dict[str, tuple[int, int]] = {}  # and their TRES
    width = len(FIELDS)
    for line in text.splitlines():
        parts = line.split("|", width - 1)
        if len(parts) != width:
            continue
        jobid, raw, state, code, submit, eligible, start, end, part, account, user, tres = parts[
            :-1
        ]
        comment = parts[-1]
        match = _JOB.match(jobid)
        if match is None:
            continue
        if tres not in counts:
            counts[tres] = tres_counts(tres)
        gpus, cpus = counts[tres]
        base = Row(
            match[1],
            None,
            raw,
            state.split(" ")[0].rstrip("+"),
            _exit_code(code),
            _time(submit, times),
            _time(start, times),
            _time(end, times),
            part,
            account,
            user,
            gpus,
            cpus,
            comment,
            _time(eligible, times),
        )  # positional: a NamedTuple built by keywords costs twice as much
        task = match[2]
        if task is None:
            rows.append(base)
        elif task.startswith("["):
            try:
                tasks = expand_array_spec(task[1:-1])
            except ValueError:
                continue
            rows.extend(base._replace(task=t) for t in tasks)
        else:
            rows.append(base._replace(task=int(task)))
    return rows


def tres_counts(tres: str) -> tuple[int, int]:
    """(GPUs, CPUs) of an AllocTRES text (``cpu=8,gres/gpu=8,mem=64G,node=1``); typed GPUs
    (``gres/gpu:h100=8``) count when no total is given."""
    gpus = cpus = typed = 0
    total: int | None = None
    for item in tres.split(","):
        name, _, value = item.partition("=")
        if not value.isdigit():
            continue
        if name == "cpu":
            cpus = int(value)
        elif name == "gres/gpu":
            total = int(value)
        elif name.startswith("gres/gpu:"):
            typed += int(value)
    gpus = total if total is not None else typed
    return gpus, cpus


def _exit_code(text: str) -> int | None:
    code, _, _ = text.partition(":")
    return int(code) if code.isdigit() else None


def _time(text: str, seen: dict[str, float | None]) -> float | None:
    """An sacct time (local, ``2026-12-02T03:42:54``) in epoch seconds; None for ``Unknown``,
    ``None`` and empty."""
    if text in seen:
        return seen[text]
    try:
        value: float | None = datetime.fromisoformat(text).timestamp()
    except ValueError:
        value = None
    seen[text] = value
    return value
