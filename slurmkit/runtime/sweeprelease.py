"""Release a sweep's held tasks from Slurm's requeue hold, with one scheduler query.

Requeues that Slurm makes itself (preemption, a node failure) leave no runtime alive to submit
a releaser (:mod:`.releaser`). Whoever watches the sweep releases them: ``sweep --wait``,
``status --watch`` and ``Sweep.wait()`` (:func:`release` on each poll that shows a task held
for ``BeginTime``), and each running task of the sweep (:class:`Sibling`, one of its
supervisor's checks). One ``squeue`` of the sweep's pending tasks answers for all of them; a
lease (one file per :data:`INTERVAL` in ``SWEEP/.release/``, created exclusively) lets only one
running task a sweep ask per interval, however many run. The guard is
:func:`slurmkit.core.release.plan`'s: a user's ``--begin`` or a start moved by hand is never
touched. Each release writes ``trials/ID/release-N.json`` (N: the attempt that ended).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..core import badnodes, states
from ..core.fsutil import read_json
from ..core.layout import SweepDir
from ..core.release import GAP, Held, parse_squeue, plan
from . import releaser

# Seconds between a running sibling's looks at the sweep's held tasks (one per sweep).
INTERVAL = 5.0
# squeue's fields for the guard: task, state, reason, begin, (re)submit time, restart count.
FIELDS = "JobArrayID:|,State:|,Reason:|,StartTime:|,SubmitTime:|,RestartCnt:"
# The trial id of a task of the sweep (``A_T``), or None.
TrialOf = Callable[[str], "str | None"]


def pending(job_ids: Iterable[str]) -> list[Held]:
    """The pending tasks of the given arrays: one ``squeue`` ([] when it fails)."""
    ids = ",".join(sorted(set(job_ids)))
    if not ids:
        return []
    argv = ["squeue", "--noheader", "--states=PENDING", f"--jobs={ids}", f"--Format={FIELDS}"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_squeue(proc.stdout) if proc.returncode == 0 else []


@functools.cache
def hold() -> int:
    """The cluster's requeue hold, read once per process."""
    return releaser.cluster_hold()


def release(
    root: str,
    rows: Sequence[Held],
    trial_of: TrialOf,
    by: str,
    *,
    hold_s: float | None = None,
    now: float | None = None,
    act: releaser.Update | None = None,
) -> list[str]:
    """Release the tasks of ``rows`` (the sweep at ``root``) that wait only for the hold; the
    task ids released. ``trial_of`` names each task's trial (None: not this sweep's)."""
    sweep = SweepDir(root)
    act = act or releaser.update
    hold_s = hold() if hold_s is None else hold_s
    done = []
    for row in rows:
        now_s = time.time() if now is None else now
        start = plan([row], hold_s, now_s).get(row.job)  # first: it reads no file
        trial = trial_of(row.job) if start is not None else None
        last = last_attempt(sweep, trial) if trial else None
        if trial is None or last is None or start is None:
            continue  # not (or not yet) releasable, or not a trial of this sweep that ran
        avoid = stranded(last)
        if avoid is None or now_s < float(last.get("end") or 0) + GAP:
            continue
        exclude = sorted({*badnodes.for_trial(root, trial), *avoid})
        if not act(releaser.release_args(row.job, start, exclude)):
            continue
        done.append(row.job)
        path = os.path.join(sweep.trial(trial), f"release-{last.get('n', 0)}.json")
        with contextlib.suppress(OSError):
            releaser.write_record(path, by, row, time.time())
    return done


def last_attempt(sweep: SweepDir, trial: str) -> dict[str, Any] | None:
    """The last attempt ``status.json`` records for ``trial`` (None: none, or unreadable)."""
    try:
        status = read_json(sweep.status(trial), default={})
    except (OSError, ValueError):
        return None
    attempts = status.get("attempts") if isinstance(status, dict) else None
    last = attempts[-1] if isinstance(attempts, list) and attempts else None
    return last if isinstance(last, dict) else None


def stranded(last: dict[str, Any]) -> list[str] | None:
    """The nodes a released attempt must avoid, after ``last``: none when it recorded its end;
    the nodes of an attempt that vanished or lost its node (its processes may still run there:
    a node that answers again at once would get the job back while they do, and Slurm would
    hold it for a failed launch); None when those nodes are unknown: Slurm's hold stays."""
    if last.get("state") != states.RUNNING and last.get("cause") != "node_failure":
        return []
    nodes = last.get("nodes")
    return [str(n) for n in nodes] if isinstance(nodes, list) and nodes else None


def take_lease(root: str, now: float, interval: float = INTERVAL) -> bool:
    """Whether this process is the one of the sweep's that asks the scheduler in the
    interval that ``now`` falls in (its lease file created exclusively; older ones removed)."""
    folder = os.path.join(root, ".release")
    slot = int(now // interval)
    try:
        os.makedirs(folder, exist_ok=True)
        os.close(os.open(os.path.join(folder, f"{slot}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return False
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.isdigit() and int(name) < slot - 1:
                os.remove(os.path.join(folder, name))
    return True


def sibling(
    root: str, index: int, on_slurm: bool, env: Mapping[str, str] = os.environ
) -> Sibling | None:
    """The check of the running array task of trial ``index`` (None: not an array task under
    the requeue policy, or releasing is off)."""
    own, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID", "")
    if not on_slurm or not own or not task.isdigit() or releaser.off(env):
        return None
    return Sibling(root, own, int(task), index - int(task))


class Sibling:
    """A running task's check (run every POLL s by its supervisor): once per :data:`INTERVAL`,
    when it holds the sweep's lease, one query of the sweep's pending tasks and the release of
    those that wait only for the hold. ``own``, ``task``: this task's array job id and task id;
    ``offset``: the trial index of its array's task 0."""

    def __init__(
        self, root: str, own: str, task: int, offset: int, interval: float = INTERVAL
    ) -> None:
        self.root, self.own, self.task, self.offset = root, own, task, offset
        self.interval = interval
        self.slot = int(time.time() // interval)  # not in the interval it started in

    def __call__(self) -> None:
        now = time.time()
        slot = int(now // self.interval)
        if slot == self.slot:
            return
        self.slot = slot
        if not take_lease(self.root, now, self.interval):
            return
        offsets = self.offsets()
        try:  # a helping hand only: never the end of the trial it supervises
            release(self.root, pending(offsets), lambda j: self.trial_of(j, offsets), "sibling")
        except Exception as exc:
            print(f"slurmkit: releasing the sweep's held tasks failed: {exc}", file=sys.stderr)

    def offsets(self) -> dict[str, int]:
        """Each array of the sweep with the trial index of its task 0."""
        out = {self.own: self.offset}
        sweep = SweepDir(self.root)
        with contextlib.suppress(OSError):
            for name in os.listdir(sweep.submissions):
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    for job in read_json(os.path.join(sweep.submissions, name)).get("jobs", []):
                        out[str(job["job_id"])] = int(job.get("offset", 0))
        return out

    def trial_of(self, job: str, offsets: dict[str, int]) -> str | None:
        """The trial of task ``job`` (``A_T``); None for this task itself (its own requeue
        is its runtime's to hand on) and for a task of no array of the sweep."""
        array, _, task = job.partition("_")
        if array not in offsets or not task.isdigit() or job == f"{self.own}_{self.task}":
            return None
        try:
            return str(SweepDir(self.root).manifest_row(offsets[array] + int(task))["id"])
        except (OSError, LookupError, ValueError):
            return None
