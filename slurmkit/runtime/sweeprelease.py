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

from ..core import badnodes
from ..core.fsutil import read_json
from ..core.layout import SweepDir
from ..core.release import Held, parse_squeue, plan
from . import releaser

# Seconds between a running sibling's looks at the sweep's held tasks (one per sweep).
INTERVAL = 5.0
# squeue's fields for the guard: task, state, reason, begin, (re)submit time, restart count.
FIELDS = "JobArrayID:|,State:|,Reason:|,StartTime:|,SubmitTime:|,RestartCnt:"
# Where a trial's release goes: the trial's id and the number of the attempt that ended.
TrialOf = Callable[[str], "tuple[str, int] | None"]


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
    task ids released. ``trial_of`` names each task's trial and ended attempt (its record)."""
    sweep = SweepDir(root)
    act = act or releaser.update
    hold_s = hold() if hold_s is None else hold_s
    done = []
    for row in rows:
        start = plan([row], hold_s, time.time() if now is None else now).get(row.job)
        if start is None:
            continue
        found = trial_of(row.job)
        exclude = badnodes.for_trial(root, found[0]) if found else []
        if not act(releaser.release_args(row.job, start, exclude)):
            continue
        done.append(row.job)
        if found:
            path = os.path.join(sweep.trial(found[0]), f"release-{found[1]}.json")
            with contextlib.suppress(OSError):
                releaser.write_record(path, by, row, time.time())
    return done


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
    return Sibling(root, own, index - int(task))


class Sibling:
    """A running task's check (run every POLL s by its supervisor): once per :data:`INTERVAL`,
    when it holds the sweep's lease, one query of the sweep's pending tasks and the release of
    those that wait only for the hold. ``own``: this task's array job id; ``offset``: the trial
    index of its array's task 0."""

    def __init__(self, root: str, own: str, offset: int, interval: float = INTERVAL) -> None:
        self.root, self.own, self.offset, self.interval = root, own, offset, interval
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

    def trial_of(self, job: str, offsets: dict[str, int]) -> tuple[str, int] | None:
        """The trial of task ``job`` (``A_T``) and the number of its last attempt."""
        array, _, task = job.partition("_")
        if array not in offsets or not task.isdigit():
            return None
        sweep = SweepDir(self.root)
        try:
            trial = sweep.manifest_row(offsets[array] + int(task))["id"]
            status = read_json(sweep.status(trial), default={})
        except (OSError, LookupError, ValueError):
            return None
        return trial, len(status.get("attempts", [])) if isinstance(status, dict) else 0
