"""Which requeued jobs wait only for Slurm's requeue hold, and when they may start (stdlib only).

A requeued job waits ``AuthInfo=cred_expire`` + 1 s (121 s by default; ``requeue_delay`` on
Slurm 25.11+) before it may start again (``batch_requeue_fini``: ``begin_time = now + hold``,
and the job's submit time is reset to ``now``). Only the "+1" matters for safety: slurmd
refuses a launch credential created in the same second as the old job's revocation. So a job
that waits for nothing else may be started again :data:`GAP` s after its last attempt ended.

The guard (:func:`releasable`) never touches a start the user chose: only a job PENDING with
Reason ``BeginTime``, started at least once before, whose begin time is exactly the hold after
its (re)submit time. A user's ``--begin``, or a start the user moved later by hand, fails it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

# Slurm's default AuthInfo cred_expire (seconds): the hold is this + 1 s.
CRED_EXPIRE = 120
# Seconds after an attempt ended before its job may be started again (the credential's second).
GAP = 2
# How far (seconds) a begin time may be off the hold and still be Slurm's: times print in whole
# seconds, and the hold is set from the same clock reading as the submit time.
SLACK = 1
# The environment variable that turns every releaser off (a cluster where it must not run).
ENV_OFF = "SLURMKIT_NO_RELEASE"
# The partition(s) of the releaser job (default: its job's), for a partition that takes no
# 1-CPU job (one that asks for GPUs, or gives out whole nodes).
ENV_PARTITION = "SLURMKIT_RELEASE_PARTITION"


@dataclass(frozen=True)
class Held:
    """One pending job as the scheduler shows it: ``begin`` and ``submit`` in epoch seconds
    (None when unknown); ``restarts``: how many times it ran before (Slurm's count, or the
    attempts slurmkit recorded for it)."""

    job: str
    state: str
    reason: str
    begin: float | None
    submit: float | None
    restarts: int


def hold_seconds(config: Mapping[str, str], version: str | None = None) -> tuple[int, str]:
    """The cluster's requeue hold from ``scontrol show config`` (key to value) and why:
    ``requeue_delay`` where Slurm has it (25.11+), else ``cred_expire`` + 1 s."""
    auth = _pairs(config.get("AuthInfo", ""))
    sched = _pairs(config.get("SchedulerParameters", ""))
    expire = int(auth["cred_expire"]) if auth.get("cred_expire", "").isdigit() else CRED_EXPIRE
    if (
        newer(config.get("SLURM_VERSION") or version or "")
        and sched.get("requeue_delay", "").isdigit()
    ):
        delay = sched["requeue_delay"]
        return int(delay), f"SchedulerParameters requeue_delay={delay}"
    return expire + 1, f"AuthInfo cred_expire={expire} s, + 1 s"


def newer(version: str) -> bool:
    """Whether ``version`` (``slurm 25.11.0`` or ``25.11.0``) has ``requeue_delay`` (25.11+)."""
    m = re.search(r"(\d+)\.(\d+)", version)
    return m is not None and (int(m[1]), int(m[2])) >= (25, 11)


def _pairs(text: str) -> dict[str, str]:
    return dict(part.partition("=")[::2] for part in text.split(",") if "=" in part)


def releasable(job: Held, hold: float) -> float | None:
    """The earliest time (epoch s) ``job`` may be started again when it waits only for the
    requeue hold of length ``hold``; None when it is not such a job (leave it be)."""
    if job.state != "PENDING" or job.reason != "BeginTime" or job.restarts < 1:
        return None
    if job.begin is None or job.submit is None:
        return None
    if abs(job.begin - job.submit - hold) > SLACK:
        return None  # a --begin, or a start moved by hand: the user's
    return job.submit + GAP


def start_time(at: float, now: float) -> str | None:
    """``scontrol update StartTime=`` value that starts a job released at ``at`` no earlier
    than that: ``now`` once it is due, else ``now+N`` (N whole seconds); None when ``at`` is
    more than :data:`GAP` s away (ask again later)."""
    if now >= at:
        return "now"
    wait = math.ceil(at - now)
    return f"now+{wait}" if wait <= GAP else None


def plan(jobs: Iterable[Held], hold: float, now: float) -> dict[str, str]:
    """The held jobs to release now: job id to its ``StartTime=`` value."""
    out: dict[str, str] = {}
    for job in jobs:
        at = releasable(job, hold)
        start = None if at is None else start_time(at, now)
        if start is not None:
            out[job.job] = start
    return out


def epoch(text: str) -> float | None:
    """A time as squeue/scontrol print it (``2026-12-05T07:52:20``) in epoch seconds; None for
    ``N/A``, ``Unknown``, ``NONE`` and the like."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_squeue(text: str) -> list[Held]:
    """Rows of ``squeue -h -O`` with the fields task, state, reason, begin, submit time and
    restart count, each ending in ``|`` but the last."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 6:
            job, state, reason, begin, submit, restarts = parts
            count = int(restarts) if restarts.isdigit() else 0
            out.append(Held(job, state, reason, epoch(begin), epoch(submit), count))
    return out


def from_scontrol(info: Mapping[str, str]) -> Held:
    """One job of ``scontrol show job -o`` (key to value) as :class:`Held`."""
    task = info.get("ArrayTaskId")
    job = f"{info['ArrayJobId']}_{task}" if task and info.get("ArrayJobId") else info["JobId"]
    restarts = info.get("Restarts", "0")
    return Held(
        job,
        info.get("JobState", ""),
        info.get("Reason", ""),
        epoch(info.get("StartTime", "")),
        epoch(info.get("SubmitTime", "")),
        int(restarts) if restarts.isdigit() else 0,
    )
