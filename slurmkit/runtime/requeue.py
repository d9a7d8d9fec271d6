"""Requeue decisions: why an attempt stopped, and whether its cause still has budget.

Causes: ``preemption`` (incl. an external requeue or ``scancel --signal``), ``timeout``,
``node_failure`` (an attempt that vanished without a word), ``container`` (its container did
not start: see :func:`container_failed`), ``node`` (a failure attributed to its node:
:mod:`.nodefault`), ``hang`` (the watchdog ended it: :mod:`.hang`), ``error`` (non-zero exit).
A budgets mapping that lacks a cause (one written before the cause existed) gets its default
(:data:`~slurmkit.core.jobcontract.DEFAULT_BUDGETS`).
A user's ``scancel`` is no cause: the trial ends CANCELLED.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import slurmtime, states
from ..core.contract import CANCELLED_EXIT, REQUEUE_EXIT
from ..core.jobcontract import DEFAULT_BUDGETS
from ..core.release import epoch

# What classify() looked at, kept in each attempt's record.
EVIDENCE = ("JobState", "Reason", "Restarts", "NodeState", "PreemptTime", "EndTime", "RunTime")
# What pyxis (and srun without pyxis) print when a task's container cannot start: an image that
# cannot be imported, a filesystem that cannot be created, enroot failing to start it (a missing
# mount source, a broken hook), the SPANK plugin failing the task; the messages of pyxis 0.2x.
CONTAINER_FAILED = re.compile(
    r"pyxis: (?:couldn't start container|container start failed|failed to import docker image"
    r"|failed to create container filesystem)"
    r"|spank: required plugin \S*pyxis\S*: \w+\(\) failed"
    r"|srun: unrecognized option '--container-"
)
# The time-limit signal comes `lead` seconds before the limit, give or take Slurm's 30 s checks.
TIMEOUT_SLACK = 90


@dataclass(frozen=True)
class Outcome:
    state: str
    code: int
    cause: str | None = None
    reason: str = ""


def scontrol(*args: str) -> subprocess.CompletedProcess[str] | None:
    """``scontrol ARGS`` run (20 s at most); None when it could not run or timed out."""
    try:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None


def show(kind: str, name: str) -> dict[str, str]:
    """``scontrol show KIND -o NAME`` as a dict ({} when unknown, or scontrol fails)."""
    proc = scontrol("show", kind, "-o", name)
    line = proc.stdout.splitlines()[0] if proc and proc.returncode == 0 and proc.stdout else ""
    return dict(re.findall(r"(\w+)=(\S*)", line))


def job_info(job_id: str, node: str) -> dict[str, str]:
    """``scontrol show job -o JOB`` as a dict, plus ``NodeState`` of ``node`` (this host);
    {} when scontrol is missing or fails."""
    info = show("job", job_id)
    if info:
        info["NodeState"] = show("node", node).get("State", "")
    return info


def _seconds(text: str) -> int | None:
    """Slurm's durations (RunTime, TimeLimit) in seconds; ``None`` for unlimited, zero or junk."""
    try:
        return slurmtime.parse_seconds(text)
    except ValueError:
        return None


def classify(
    signals: Sequence[str],
    requeue_signal: str,
    info: dict[str, str],
    lead: int,
    restarts: int,
    now: float | None = None,
) -> str | None:
    """The cause of a stop the runtime was signalled for; ``None`` for a user's cancel.

    ``restarts`` is SLURM_RESTART_COUNT when this attempt started. Observed on 22.05: a job
    that is cancelled, requeued from outside or out of time shows JobState=COMPLETING; an
    external requeue raises Restarts, preemption sets PreemptTime, a time-out has used its
    TimeLimit; what is left is a cancel. A node that went DOWN under the job is a node failure,
    and so is a job that Slurm has already requeued (PENDING, Restarts raised).
    """
    state = info.get("JobState", "")
    if any(word in info.get("NodeState", "") for word in ("DOWN", "FAIL")):
        return "node_failure"
    if state in (states.TIMEOUT, states.NODE_FAIL, states.PREEMPTED):
        return {states.TIMEOUT: "timeout", states.NODE_FAIL: "node_failure"}.get(
            state, "preemption"
        )
    if info.get("PreemptTime", "None") not in ("None", "Unknown", ""):
        return "preemption"
    if requeued_by_slurm(info, restarts):
        # Slurm itself requeued the job: on a node failure it is PENDING at once; after an
        # external `scontrol requeue` (an admin, SUNK before a drain) it is still COMPLETING
        return "node_failure" if state == states.SLURM_PENDING else "preemption"
    limit, ran = _seconds(info.get("TimeLimit", "")), _seconds(info.get("RunTime", ""))
    if requeue_signal in signals:
        end = epoch(info.get("EndTime", ""))
        if end is not None and end - (now or time.time()) <= lead + TIMEOUT_SLACK:
            return "timeout"
        return "preemption"  # asked to checkpoint and requeue (scancel --batch --signal)
    if limit is not None and ran is not None and ran >= limit:
        return "timeout"
    return None if info else "preemption"


def container_failed(output: str) -> bool:
    """Whether an attempt's output (what srun printed) says that its container did not start."""
    return CONTAINER_FAILED.search(output) is not None


def requeued_by_slurm(info: dict[str, str], restarts: int) -> bool:
    """Slurm has requeued the job itself since this attempt started (Restarts raised)."""
    try:
        return int(info.get("Restarts", restarts) or 0) > restarts
    except ValueError:
        return False


def used(attempts: Sequence[dict[str, Any]], cause: str) -> int:
    """How many earlier attempts ended for ``cause``."""
    return sum(1 for a in attempts if a.get("cause") == cause)


def decide(
    code: int,
    cause: str | None,
    signalled: bool,
    attempts: Sequence[dict[str, Any]],
    budgets: Mapping[str, int | None],
) -> Outcome:
    """The outcome of an attempt that exited with ``code``.

    ``signalled``: the runtime forwarded a stop signal; ``cause`` is then :func:`classify`'s
    answer (otherwise ``container`` or None: an exit of its own, an ``error``). ``attempts``
    are the earlier ones (not this one). A time limit requeues only a trial that asked for it
    (exit 75, after checkpointing); preemption and node failures requeue any trial (they are
    not its doing).
    """
    if code == 0:
        return Outcome(states.COMPLETED, 0)
    if signalled or code == REQUEUE_EXIT:
        if signalled and cause is None:  # a user's cancel sticks: never "requeue me"
            return Outcome(
                states.CANCELLED,
                CANCELLED_EXIT if code == REQUEUE_EXIT else code,
                reason="cancelled",
            )
        cause = cause or "preemption"
        if cause == "timeout" and code != REQUEUE_EXIT:
            # it did not checkpoint (exit 75): a rerun would start over and time out again
            return Outcome(
                states.TIMEOUT,
                code,
                cause,
                f"timed out without asking for a requeue (exit {code}): not requeued",
            )
    else:
        cause = cause or "error"  # "container" when its container did not start
    budget = budgets[cause] if cause in budgets else DEFAULT_BUDGETS.get(cause)
    spent = used(attempts, cause)
    if budget is None or spent < budget:
        return Outcome(
            states.REQUEUED,
            REQUEUE_EXIT,
            cause,
            f"{cause}: requeue {spent + 1} of {'unlimited' if budget is None else budget}",
        )
    if not budget and cause in ("error", "container"):
        reason = "" if cause == "error" else "its container did not start (see its output.log)"
    else:
        reason = f"{cause} budget exhausted ({budget} requeue{'s' if budget != 1 else ''})"
    return Outcome(states.FAILED, code if code != REQUEUE_EXIT else 1, cause, reason)
