"""The Slurm backend over its command-line tools (sbatch, squeue, sacct, scancel, scontrol).

Every query is ONE call for the whole sweep, whatever its size.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import store
from ..core import badnodes, slurmconf, states
from ..core.arrays import DEFAULT_MAX_ARRAY_SIZE, expand_array_spec
from ..core.fsutil import atomic_write_json
from ..errors import SchedulerError, UserError
from . import pollcache, schedq
from .base import Backend, LiveTask, Probe, Progress, Stopped, Submission, TaskState
from .submit_limits import Limit, limit

if TYPE_CHECKING:
    from ..core.layout import SweepDir
    from ..plan import Chunk, Plan
    from ..spec import SweepSpec


class SlurmBackend(Backend):
    """Trials as ``sbatch`` job arrays, one per chunk of trials under MaxArraySize; with
    ``max_parallel``, each array waits for the one before it."""

    name = "slurm"
    needs = "sbatch on PATH and a Slurm controller that answers"
    where = "on the Slurm cluster"
    cancel_key = "jobs"
    runs_here = False
    sticky = True
    stages_data = True

    @classmethod
    def absent(cls) -> str:
        return "" if available() else "no sbatch on PATH"

    @classmethod
    def probe(cls, timeout: float) -> ConfigProbe:
        return ConfigProbe(start_config(timeout))

    def __init__(self, *, accounting: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.accounting = accounting  # slurmdbd keeps accounting: submit limits can be asked

    def check(self, spec: SweepSpec, trials: int) -> None:
        super().check(spec, trials)
        room = headroom(spec.resources.account, spec.resources.qos) if self.accounting else None
        if room is not None and room[1] + trials > room[0].jobs:
            lim, queued = room
            raise UserError(
                f"{trials} trials do not fit: you may have at most {lim.jobs} jobs queued "
                f"({lim.source}) and have {queued} already",
                file=spec.source,
                key="params",
                hint="split the search space over several sweeps, wait for running ones, or "
                "ask the admins (every array task is a job)",
            )
        if spec.container is not None and not has_pyxis():
            raise UserError(
                "this cluster has no pyxis: srun does not know --container-image",
                file=spec.source,
                key="container",
                hint="pyxis (NVIDIA's SPANK plugin for enroot) must be installed on "
                "the cluster, or leave out the container block",
            )

    def submit(
        self,
        sweep: SweepDir,
        plan: Plan,
        indices: list[int],
        scripts: Sequence[tuple[Chunk, str]],
        on_done: Progress | None,
        recorded: Callable[[], None],
    ) -> Submission:
        """One ``sbatch`` per chunk; on a refusal, the arrays already submitted are cancelled
        and the submission record is removed."""
        result = Submission(sweep.root, self.name, plan.total, indices, note=self.note)
        number = store.record_submission(
            sweep, {"backend": self.name, "state": "submitting", "jobs": [], "user": user()}
        )
        jobs: list[dict[str, Any]] = []
        staged: list[str] = []  # the stage job of the spec's data, when one is needed
        try:
            if plan.spec.data:
                from .. import data

                text = data.stage_job(plan.spec, sweep.root)
                if text is not None:
                    staged.append(sbatch(data.write_stage_script(sweep, number, text)))
                    result.scripts.append(text)
            exclude = exclude_option(sweep.root, plan.spec.resources.extra)  # for every chunk
            for c, (chunk, text) in enumerate(scripts):
                path = store.write_script(sweep, number, c, text)
                after = [f"afterok:{job}" for job in staged]
                if jobs and plan.spec.max_parallel:
                    after.append(f"afterany:{jobs[-1]['job_id']}")
                jobs.append(
                    {
                        "job_id": sbatch(
                            path,
                            dependency=",".join(after) or None,
                            options=exclude,
                        ),
                        "offset": chunk.offset,
                        "array": chunk.array_spec(),
                        "script": path,
                    }
                )
                result.scripts.append(text)
        except BaseException:  # refused, a full disk, Ctrl-C: no array left queued unrecorded
            if jobs or staged:
                cancel([*staged, *(j["job_id"] for j in jobs)])
            store.drop_submission(sweep, number)
            raise
        stage = {"stage_job": staged[0]} if staged else {}
        store.update_submission(sweep, number, state="submitted", jobs=jobs, **stage)
        recorded()
        result.jobs = jobs
        result.described = described(jobs, plan.spec.max_parallel)
        return result

    @classmethod
    def standalone_record(cls, array_job_id: str, offset: int, array: str) -> dict[str, Any]:
        """The submission record of a standalone script submitted with plain sbatch (written by
        its first task; ``script`` None: Slurm's log is beside where it was submitted)."""
        job = {"job_id": array_job_id, "offset": offset, "array": array, "script": None}
        return {"backend": cls.name, "state": "submitted", "jobs": [job], "user": user()}

    def indices(self, record: dict[str, Any]) -> list[int]:
        return [
            job["offset"] + task
            for job in record.get("jobs", [])
            for task in expand_array_spec(job["array"])
        ]

    def live(
        self,
        records: Sequence[dict[str, Any]],
        owned: Callable[[int], bool] | None,
        ask: Callable[[int], bool],
        *,
        fresh: bool = False,
    ) -> dict[int, LiveTask]:
        tasks: dict[int, tuple[str, int]] = {}
        owners: set[str] = set()
        for record in records:
            owner = record.get("user")
            owners.add(owner if isinstance(owner, str) else user())
            for job in record.get("jobs", []):
                for task in expand_array_spec(job["array"]):
                    tasks[job["offset"] + task] = (job["job_id"], task)
        jobs = {job for i, (job, _) in tasks.items() if ask(i)}
        every = pollcache.interval()
        if not jobs or not available():
            answer: dict[tuple[str, int], TaskState] = {}
        elif fresh or not every or len(owners) != 1:
            answer = query(jobs)
        else:  # one query per interval for all of this user's pollers
            [owner] = owners
            answer = pollcache.PollCache(owner, every).tasks(jobs, lambda: user_tasks(owner), ended)
        return {
            i: LiveTask(f"{job}_{task}", answer.get((job, task)), False)
            for i, (job, task) in tasks.items()
            if owned is None or owned(i)
        }

    def cancel(
        self, records: Sequence[dict[str, Any]], live_jobs: set[str], dry_run: bool
    ) -> list[Stopped]:
        ours = {job["job_id"] for record in records for job in record.get("jobs", [])}
        ours |= {record["stage_job"] for record in records if record.get("stage_job")}
        # every array of ours that the scheduler still runs or queues, also those that no
        # longer own a trial (a concurrent resume's): one more query, only when cancelling
        answer = query(ours) if ours and available() else {}
        still = {job for (job, _), task in answer.items() if task.state in states.SLURM_ACTIVE}
        arrays = sorted(({job.split("_")[0] for job in live_jobs} | still) & ours)
        if not dry_run:
            cancel(arrays)
            for name in {r["user"] for r in records if isinstance(r.get("user"), str)}:
                pollcache.PollCache(name, 0).forget()  # the next status asks the scheduler
        return [Stopped(self.cancel_key, job, job) for job in arrays]


class ConfigProbe(Probe):
    """The controller asked for its configuration; :meth:`result` reads MaxArraySize and
    MaxJobCount."""

    def __init__(self, command: Command) -> None:
        self.command = command

    def result(self) -> SlurmBackend:
        config = read_config(self.command)
        return SlurmBackend(
            max_array_size=max_array_size(config),
            max_jobs=max_job_count(config),
            accounting="slurmdbd" in config.get("AccountingStorageType", ""),
        )

    def cancel(self) -> None:
        self.command.kill()


def described(jobs: Sequence[dict[str, Any]], max_parallel: int | None) -> str:
    """A submission's arrays for people, each with the ``--array`` its script has (the
    ``%N`` throttle included)."""
    throttle = f"%{max_parallel}" if max_parallel else ""
    shown = (f"{j['job_id']} (--array={j['array']}{throttle})" for j in jobs)
    return "as job array " + ", ".join(shown)


def available(tool: str = "sbatch") -> bool:
    """``tool`` is an executable on PATH (what ``shutil.which`` checks, without its imports)."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", tool)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return True
    return False


class Command:
    """A Slurm command started now and waited for later, so the caller can work meanwhile."""

    def __init__(self, argv: Sequence[str], timeout: float = 60) -> None:
        self.argv, self.timeout = list(argv), timeout
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except FileNotFoundError:
            raise SchedulerError(
                f"{argv[0]} not found on PATH",
                hint="run on a Slurm login node, or use --backend local",
            ) from None

    def wait(self) -> subprocess.CompletedProcess[str]:
        """Its output; SchedulerError when it does not finish within the timeout."""
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            said = _first(self.kill()[1], last=True)  # what it said while it waited, if anything
            raise SchedulerError(
                f"{self.argv[0]} did not finish within {self.timeout:.0f} s"
                + (f"; it said: {said}" if said else ""),
                hint="the controller may be busy or full (MaxJobCount)"
                if said
                else "is slurmctld up? try: scontrol ping",
            ) from None
        return subprocess.CompletedProcess(self.argv, self.proc.returncode, out, err)

    def kill(self) -> tuple[str, str]:
        """Stop it (when its answer is no longer wanted); what it wrote until then."""
        if self.proc.poll() is None:
            self.proc.kill()
        out, err = self.proc.communicate()
        return out or "", err or ""


def _run(argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return Command(argv, timeout).wait()


def start_config(timeout: float = 30) -> Command:
    """Start ``scontrol show config``; :func:`read_config` waits for it and parses it into a
    dict (SchedulerError when no controller answers)."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.exists(conf):  # scontrol would retry for a minute
        raise SchedulerError(f"SLURM_CONF={conf} does not exist")
    return Command(["scontrol", "show", "config"], timeout)


def read_config(command: Command) -> dict[str, str]:
    """The answer of :func:`start_config` as a dict."""
    proc = command.wait()
    if proc.returncode != 0:
        raise SchedulerError(
            f"no Slurm controller answered ({_first(proc.stderr)[:80]})",
            hint="check SLURM_CONF and `scontrol ping`, or use --backend local",
        )
    return slurmconf.parse(proc.stdout)


def max_array_size(cfg: dict[str, str]) -> int:
    """The cluster's MaxArraySize: array task ids must stay below it."""
    try:
        return int(cfg.get("MaxArraySize", DEFAULT_MAX_ARRAY_SIZE))
    except ValueError:
        return DEFAULT_MAX_ARRAY_SIZE


def max_job_count(cfg: dict[str, str]) -> int | None:
    """The cluster's MaxJobCount (jobs it holds at once, each array task counting), if known."""
    try:
        return int(cfg["MaxJobCount"])
    except (KeyError, ValueError):
        return None


LIMITS_TTL = 600.0
"""Seconds a user's submit limit is kept in the cache (``SLURMKIT_LIMITS_TTL``; 0: ask each time).
Asking slurmdbd costs several round trips (about 0.3 s on the test cluster) on every submit,
while limits change seldom; the jobs queued are always counted now."""


def headroom(account: str | None, qos: str | None) -> tuple[Limit, int] | None:
    """The user's tightest submit limit (association or QOS MaxSubmitJobs) and how many jobs
    they have queued now; None when none applies or accounting does not answer (the sweep is
    then not held back: Slurm itself still refuses what is over a limit)."""
    name = user()
    key = f"{os.environ.get('SLURM_CONF', '')}|{name}|{account or ''}|{qos or ''}"
    try:
        found = _cached_limit(key, lambda: _ask_limit(name, account, qos))
    except SchedulerError:  # accounting does not answer
        return None
    if found is None:
        return None
    queued = _run(["squeue", "-h", "-r", "-u", name, "-o", "%i"], timeout=30)
    return (found, len(queued.stdout.split())) if queued.returncode == 0 else None


def _ttl() -> float:
    try:
        return max(0.0, float(os.environ.get("SLURMKIT_LIMITS_TTL") or LIMITS_TTL))
    except ValueError:
        return LIMITS_TTL


def _cached_limit(key: str, ask: Callable[[], Limit | None]) -> Limit | None:
    """``ask()``, or its answer for ``key`` from the last :func:`_ttl` seconds (kept in
    ``limits.json`` beside the poll cache; two callers racing both ask, the last one's stays)."""
    path = os.path.join(pollcache.directory(), "limits.json")
    now, ttl = time.time(), _ttl()
    try:
        with open(path, encoding="utf-8") as fh:
            kept = json.load(fh)
        when, jobs, source = kept[key]
        if 0 <= now - float(when) < ttl:
            return None if jobs is None else Limit(int(jobs), str(source))
    except (OSError, ValueError, KeyError, TypeError):
        kept = {}
    found = ask()
    if ttl > 0:
        kept = {k: v for k, v in kept.items() if isinstance(v, list) and now - v[0] < ttl}
        kept[key] = [now, *((found.jobs, found.source) if found else (None, None))]
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write_json(path, kept, fsync=False)
        except OSError:
            pass  # no cache directory: ask again next time
    return found


def _ask_limit(name: str, account: str | None, qos: str | None) -> Limit | None:
    """The tightest limit, asked from accounting now (three ``sacctmgr`` at once);
    SchedulerError when accounting does not answer."""
    assoc = "format=Account,Partition,MaxSubmit,DefaultQOS"
    asks = [
        Command(["sacctmgr", "-nP", "show", "assoc", "where", f"user={name}", assoc], 30),
        Command(["sacctmgr", "-nP", "show", "qos", "format=Name,MaxSubmitPU"], 30),
        Command(["sacctmgr", "-nP", "show", "user", name, "format=DefaultAccount"], 30),
    ]
    answers = [ask.wait() for ask in asks]
    if any(a.returncode != 0 for a in answers):
        raise SchedulerError("sacctmgr failed")
    return limit(answers[0].stdout, answers[1].stdout, answers[2].stdout, account, qos)


def has_pyxis() -> bool:
    """pyxis (the SPANK plugin) adds ``--container-image`` to srun's options."""
    proc = _run(["srun", "--help"], timeout=30)
    return "--container-image" in proc.stdout


def exclude_option(sweep_dir: str, extra: Mapping[str, Any]) -> list[str]:
    """``--exclude=`` the nodes excluded from this sweep (core/badnodes.py) and the spec's own
    (``resources.extra.exclude``, which the command line would otherwise override); [] when the
    sweep excludes none (the script's own option stands)."""
    avoid = badnodes.excluded(sweep_dir)
    if not avoid:
        return []
    own = extra.get("exclude")
    return [f"--exclude={','.join(badnodes.merged(avoid, [own] if isinstance(own, str) else []))}"]


def partitions() -> list[str]:
    proc = _run(["sinfo", "--noheader", "--format=%R"], timeout=30)
    return sorted(set(proc.stdout.split())) if proc.returncode == 0 else []


def sbatch(script: str, *, dependency: str | None = None, options: Sequence[str] = ()) -> str:
    """Submit ``script`` (a path) with ``options`` beside its own; return the job id. Slurm's
    refusal becomes a clear error."""
    argv = ["sbatch", "--parsable", *options]
    if dependency:
        argv.append(f"--dependency={dependency}")
    proc = _run([*argv, script])
    if proc.returncode != 0:
        raise refused(proc.stderr, proc.returncode)
    return proc.stdout.strip().split(";")[0]


def refused(stderr: str, returncode: int) -> UserError:
    """``sbatch``'s refusal (its stderr and exit code) as a clear error: a bad partition is the
    spec's mistake, named with the cluster's partitions; anything else is the scheduler's."""
    message = _first(stderr, all_lines=True) or f"sbatch exited {returncode}"
    if "partition" in message.lower():
        names = partitions()
        return UserError(
            f"Slurm refused the job: {message}",
            key="resources.partition",
            hint=f"partitions on this cluster: {', '.join(names) or '(none found)'}",
        )
    return SchedulerError(f"Slurm refused the job: {message}")


def user() -> str:
    """The name of the user running this (whose jobs squeue -u lists)."""
    return pwd.getpwuid(os.getuid()).pw_name


NOT_AN_ARRAY = -1  # the task id of a job that is no array (submitit's single jobs)


def _squeue(selection: str) -> dict[tuple[str, int], TaskState]:
    """One ``squeue`` of every task that ``selection`` (``--jobs=...``, ``--user=...``) picks,
    finished ones included (the controller keeps them for MinJobAge); a job that is no array
    is task NOT_AN_ARRAY."""
    # Without --array: squeue 22.05 drops tasks when it expands a pending "1-19:2" record.
    proc = _run(["squeue", "--noheader", "--states=all", selection, "--format=%F|%K|%T|%r"])
    out: dict[tuple[str, int], TaskState] = {}
    if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():
        raise SchedulerError(
            f"squeue failed: {_first(proc.stderr)}", hint="is slurmctld up? try: scontrol ping"
        )
    if proc.returncode == 0:
        for line in proc.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 4 and parts[1][:1].isdigit():
                for task in expand_array_spec(parts[1]):
                    out[(parts[0], task)] = TaskState(parts[2], parts[3])
            elif len(parts) == 4 and parts[1] == "N/A":
                out[(parts[0], NOT_AN_ARRAY)] = TaskState(parts[2], parts[3])
    return out


def user_tasks(name: str) -> dict[tuple[str, int], TaskState]:
    """Every task of every job of user ``name`` that the controller knows: one squeue (or one
    pyslurm call, :mod:`.schedq`)."""
    chosen = schedq.choice()
    if chosen.name == "pyslurm":
        return schedq.pyslurm_tasks(chosen.module, user=name)
    return _squeue(f"--user={name}")


def query(job_ids: Iterable[str]) -> dict[tuple[str, int], TaskState]:
    """``{(array_job_id, task_id): TaskState}`` for every task of the given arrays, asked now.

    One ``squeue`` call (it keeps finished jobs for MinJobAge); jobs it no longer knows are
    looked up with one ``sacct`` call when accounting is enabled.
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    chosen = schedq.choice()
    if chosen.name == "pyslurm":
        out = schedq.pyslurm_tasks(chosen.module, jobs=set(ids))
    else:
        out = _squeue(f"--jobs={','.join(ids)}")
    seen = {job for job, _ in out}
    missing = [j for j in ids if j not in seen]
    if missing:
        out.update(ended(missing))
    return out


def ended(ids: Sequence[str]) -> dict[tuple[str, int], TaskState]:
    """How jobs gone from the queue ended, from accounting: one ``sacct`` ({} without it)."""
    if not available("sacct"):
        return {}
    proc = _run(
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            f"--jobs={','.join(ids)}",
            "--format=JobID,State,ExitCode",
        ]
    )
    out: dict[tuple[str, int], TaskState] = {}
    if proc.returncode != 0:
        return out
    for line in proc.stdout.splitlines():
        m = re.match(r"^(\d+)(?:_(\d+))?\|([^|]*)\|(\d+):(\d+)$", line.strip())
        if m:
            task = int(m[2]) if m[2] is not None else NOT_AN_ARRAY
            out[(m[1], task)] = TaskState(m[3].split()[0], "", int(m[4]))
    return out


def cancel(job_ids: Iterable[str]) -> None:
    """Cancel whole arrays, one ``scancel`` call."""
    ids = sorted(set(job_ids))
    if ids:
        proc = _run(["scancel", *ids])
        if proc.returncode != 0:
            raise SchedulerError(f"scancel failed: {_first(proc.stderr)}")


def _first(text: str, all_lines: bool = False, last: bool = False) -> str:
    """The first (or ``last``) non-blank line of ``text``, or all of them joined."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    return "; ".join(lines) if all_lines else lines[-1 if last else 0]
