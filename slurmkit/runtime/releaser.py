"""The guarded releaser: a requeued job starts again in seconds, not after Slurm's requeue hold.

Slurm keeps a requeued job PENDING (Reason ``BeginTime``) for ``cred_expire`` + 1 s (121 s by
default), and no process of the job is alive then to shorten it. So before a runtime exits 75
(REQUEUE_EXIT: "requeue me") it submits this small job (:func:`submit`: one CPU, a short time
limit, no requeue, no comment: ``report`` never pairs it with a trial). Its one action, once
the requeue has landed and :func:`slurmkit.core.release.releasable` says the job waits only
for the hold, is ``scontrol update JobId=JOB StartTime=now`` (plus ``ExcNodeList`` of the
trial's bad nodes, :func:`slurmkit.core.badnodes.for_trial`), no earlier than 2 s after the
attempt ended. The job keeps its id: ``scancel``, the ``%N`` throttle, submitit's handles and
Slurm's restart count keep working. Anything else (the job cancelled, ended, held by the user,
its start moved by hand, already running) and it leaves the job be; it exits after the hold
window at the latest. It writes ``release-N.json`` (N: the attempt that ended) when it
released. ``SLURMKIT_NO_RELEASE=1`` in the job's environment turns it off.

``python -m slurmkit.runtime.releaser --job REF --restarts N --record PATH [--sweep DIR
--trial ID]``
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ..core import badnodes, slurmconf
from ..core.fsutil import atomic_write_json
from ..core.release import (
    ENV_OFF,
    ENV_PARTITION,
    Held,
    from_scontrol,
    hold_seconds,
    releasable,
    start_time,
)
from . import requeue

# Seconds between looks at the job while its requeue has not landed yet.
LOOK = 0.25
# Seconds the releaser stays after the hold it watches would have ended by itself.
MARGIN = 30
# The releaser's time limit (minutes): Slurm's default hold and the margin fit well inside.
TIME_LIMIT = 5

# Slurm's states of a job that has ended, and of one that runs (again).
_ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "DEADLINE")
_STARTED = ("RUNNING", "CONFIGURING", "SUSPENDED")

Show = Callable[[str], dict[str, str]]
Update = Callable[[Sequence[str]], bool]


def off(env: Mapping[str, str] = os.environ) -> bool:
    """Whether releasing is turned off (``SLURMKIT_NO_RELEASE`` set and not 0)."""
    return env.get(ENV_OFF, "0") not in ("", "0")


def job_ref(env: Mapping[str, str] = os.environ) -> str | None:
    """How ``scontrol`` names this job: ``ARRAYJOBID_TASKID`` for an array task."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def sbatch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for ``sbatch`` inside a job: without the job's ``SLURM_*``/``SBATCH_*``
    variables (sbatch would read them as options), ``SLURM_CONF`` kept."""
    return {
        k: v
        for k, v in env.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))
    }


def command(job: str, restarts: int, record: str, sweep: str | None, trial: str | None) -> str:
    """The releaser's command line (for ``sbatch --wrap``)."""
    argv = [sys.executable, "-m", "slurmkit.runtime.releaser"]
    argv += ["--job", job, "--restarts", str(restarts), "--record", record]
    if sweep and trial:
        argv += ["--sweep", sweep, "--trial", trial]
    return "exec " + shlex.join(argv)


def submit(
    record: str,
    log: str,
    *,
    sweep: str | None = None,
    trial: str | None = None,
    env: Mapping[str, str] = os.environ,
) -> str | None:
    """Submit the releaser of this job (run by a runtime about to exit 75), named after it
    (``NAME-release``); its job id, or None when it is off, not a Slurm batch job (no
    ``SLURM_JOB_NAME``), or sbatch refused (said on stderr: the job then waits out the hold
    as before)."""
    job, name = job_ref(env), env.get("SLURM_JOB_NAME")
    if off(env) or not job or not name:
        return None
    restarts = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={name}-release",
        *shape(env),
        f"--output={log}",
        "--open-mode=append",
        f"--wrap={command(job, restarts, record, sweep, trial)}",
    ]
    try:
        proc = subprocess.run(argv, env=sbatch_env(env), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"slurmkit: no releaser for job {job}: {exc}", file=sys.stderr)
        return None
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1:] or [f"sbatch exited {proc.returncode}"]
        print(
            f"slurmkit: no releaser for job {job}: {why[0]} (it waits out Slurm's requeue hold; "
            f"{ENV_PARTITION}=PARTITION in the environment you submit from sends releasers, "
            "1 CPU for a few minutes, to a partition that takes them)",
            file=sys.stderr,
        )
        return None
    return proc.stdout.strip().split(";")[0]


# The releaser runs where its job may: the same partition, account and qos.
_SAME = (
    ("partition", "SLURM_JOB_PARTITION"),
    ("account", "SLURM_JOB_ACCOUNT"),
    ("qos", "SLURM_JOB_QOS"),
)


def shape(env: Mapping[str, str]) -> list[str]:
    """The releaser job's sbatch options of size and place (``doctor`` tries them with
    ``--test-only``): 1 CPU, :data:`TIME_LIMIT` minutes, never requeued, :func:`where`."""
    return [
        "--ntasks=1",
        "--cpus-per-task=1",
        "--mem=256M",
        f"--time={TIME_LIMIT}",
        "--no-requeue",
        *(f"--{option}={value}" for option, value in where(env).items()),
    ]


def where(env: Mapping[str, str]) -> dict[str, str]:
    """The releaser's ``partition``, ``account`` and ``qos``: its job's, the partition
    ``SLURMKIT_RELEASE_PARTITION`` where that is set."""
    out = {option: env[var] for option, var in _SAME if env.get(var)}
    if env.get(ENV_PARTITION):
        out["partition"] = env[ENV_PARTITION]
    return out


def show_job(job: str) -> dict[str, str]:
    """``scontrol show job -o JOB`` as a dict ({} when unknown or scontrol fails)."""
    return requeue.show("job", job)


def update(args: Sequence[str]) -> bool:
    """``scontrol update ARGS``; whether it took."""
    proc = requeue.scontrol("update", *args)
    return proc is not None and proc.returncode == 0


def cluster_hold() -> int:
    """The cluster's requeue hold (``scontrol show config``; Slurm's default when unread)."""
    proc = requeue.scontrol("show", "config")
    out = proc.stdout if proc and proc.returncode == 0 else ""
    return hold_seconds(slurmconf.parse(out))[0]


def release_args(job: str, start: str, exclude: Sequence[str]) -> list[str]:
    """The ``scontrol update`` arguments that start ``job`` at ``start``, off ``exclude``."""
    return [f"JobId={job}", f"StartTime={start}"] + (
        [f"ExcNodeList={','.join(exclude)}"] if exclude else []
    )


def write_record(path: str, by: str, job: Held, released_at: float) -> None:
    """``release-N.json``: who released ``job``, when, and when its hold would have ended."""
    atomic_write_json(
        path,
        {"by": by, "held_until": job.begin, "released_at": released_at, "job": job.job},
    )


def watch(
    job: str,
    restarts: int,
    hold: float,
    *,
    exclude: Callable[[], list[str]] = list,
    show: Show = show_job,
    act: Update = update,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, Held | None, float]:
    """Watch ``job`` (its attempt ran with Slurm's restart count ``restarts``) until its
    requeue lands, and release it from the hold: what happened (``released``, or why not),
    the job as last seen, and when it was released."""
    deadline = clock() + hold + MARGIN
    seen: Held | None = None
    while clock() < deadline:
        info = show(job)
        if not info:
            return "gone", seen, 0.0
        seen = replace(from_scontrol(info), job=job)
        if seen.state == "CANCELLED":
            return "cancelled", seen, 0.0  # a user's cancel sticks
        if seen.restarts <= restarts:  # the old attempt still ends, or the requeue failed
            if seen.state in _ENDED:
                return "not requeued", seen, 0.0
            sleep(LOOK)
            continue
        if seen.restarts > restarts + 1 or seen.state in _STARTED:
            return "not held", seen, 0.0  # running again: someone else's doing
        if seen.state != "PENDING":  # being requeued (COMPLETING, REQUEUED, ...)
            sleep(LOOK)
            continue
        at = releasable(seen, hold)
        if at is None and (seen.reason in ("None", "") or seen.begin is None):
            sleep(LOOK)  # requeued, its hold not set yet
            continue
        if at is None:
            return "not held", seen, 0.0  # held by the user, or its start moved by hand
        now = clock()
        start = start_time(at, now)
        if start != "now":
            sleep(max(at - now, 0.05))
            continue
        if act(release_args(job, start, exclude())):
            return "released", seen, clock()
        sleep(LOOK)  # it changed under us: look again
    return "timed out", seen, 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.runtime.releaser")
    parser.add_argument("--job", required=True, help="the requeued job (ARRAYJOBID_TASKID)")
    parser.add_argument("--restarts", type=int, required=True, help="its restart count")
    parser.add_argument("--record", required=True, help="where release-N.json goes")
    parser.add_argument("--sweep", help="the sweep directory (its bad nodes)")
    parser.add_argument("--trial", help="the trial id (its bad nodes)")
    args = parser.parse_args(argv)
    sweep, trial = args.sweep, args.trial

    def exclude() -> list[str]:
        return badnodes.for_trial(sweep, trial) if sweep and trial else []

    what, seen, at = watch(args.job, args.restarts, cluster_hold(), exclude=exclude)
    if what == "released" and seen is not None:
        write_record(args.record, "job", seen, at)
    print(f"slurmkit releaser: job {args.job}: {what}" + (f" (seen: {seen})" if seen else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
