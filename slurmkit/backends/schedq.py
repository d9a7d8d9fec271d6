"""Which way the scheduler's queue is asked: pyslurm (the C API, no process per query) when it
is importable and built for this cluster's libslurm, else the command-line tools.

pyslurm must match libslurm's major.minor version exactly (it is compiled against it), so an
installed but mismatched pyslurm is never used. The choice is made once per process and
logged once (logger ``slurmkit``, INFO), with the reason.

Only the queue reads go through here (what ``status`` and the poll cache ask): submitting,
cancelling and accounting stay with ``sbatch``/``scancel``/``sacct``, which are complete on
their own.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from typing import Any, NamedTuple

from ..core.arrays import expand_array_spec
from .base import TaskState

Answer = dict[tuple[str, int], TaskState]


class Choice(NamedTuple):
    name: str  # "pyslurm" or "cli"
    why: str
    module: Any = None  # the pyslurm module, when chosen


def _major_minor(text: str) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2])) if m else None


def libslurm_version() -> str | None:
    """This cluster's Slurm version (``sinfo --version``: "slurm 22.05.8"), None if unknown."""
    try:
        proc = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def decide(pyslurm: Any, slurm: str | None) -> Choice:
    """The choice, from the importable pyslurm module (None: not installed) and Slurm's
    version text: pure, so that the tests cover every case without a matching Slurm."""
    if pyslurm is None:
        return Choice("cli", "pyslurm is not installed")
    theirs = str(getattr(pyslurm, "__version__", "") or "")
    ours = _major_minor(slurm or "")
    if ours is None:
        return Choice("cli", "the cluster's Slurm version is unknown (sinfo --version)")
    if _major_minor(theirs) != ours:
        return Choice(
            "cli",
            f"pyslurm {theirs or '?'} does not match libslurm {ours[0]}.{ours[1]:02d}",
        )
    return Choice("pyslurm", f"pyslurm {theirs} matches libslurm {ours[0]}.{ours[1]:02d}", pyslurm)


_chosen: list[Choice] = []


def choice(
    importer: Callable[[], Any] | None = None, version: Callable[[], str | None] | None = None
) -> Choice:
    """The choice of this process (made and logged on first use)."""
    if not _chosen:
        module = (importer or _import)()
        made = decide(module, (version or libslurm_version)() if module is not None else None)
        import logging  # ~4 ms: paid once, when the choice is made

        logging.getLogger("slurmkit").info(
            "slurmkit: scheduler queries through %s: %s", made.name, made.why
        )
        _chosen.append(made)
    return _chosen[0]


def _import() -> Any:
    try:
        import pyslurm
    except ImportError:
        return None
    return pyslurm


def pyslurm_tasks(pyslurm: Any, user: str | None = None, jobs: set[str] | None = None) -> Answer:
    """The queue through pyslurm's ``Jobs.load()`` (pyslurm >= 23): every task of the user's
    jobs, or of the given array jobs, as the CLI path answers (``{(array_job, task): state}``)."""
    out: Answer = {}
    for job in pyslurm.Jobs.load().values():
        if user is not None and getattr(job, "user_name", None) != user:
            continue
        array = str(getattr(job, "array_id", None) or job.id)
        if jobs is not None and array not in jobs:
            continue
        state = TaskState(str(job.state), str(getattr(job, "state_reason", "") or "None"))
        task = getattr(job, "array_task_id", None)
        waiting = getattr(job, "array_tasks_waiting", None)
        if waiting:  # a pending record of the array's tasks not yet started ("3-19")
            for t in expand_array_spec(str(waiting).split("%")[0]):
                out[(array, t)] = state
        if task is not None:
            out[(array, int(task))] = state
        elif not waiting:
            out[(array, 0)] = state
    return out
