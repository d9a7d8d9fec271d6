"""The one adapter between slurmkit and submitit: one ``SlurmExecutor`` subclass, its
:func:`parameters` and its batch :func:`script`, for whatever a job's task runs.

Two front-ends use it, each with its :class:`Task`: ``slurmkit.executor()`` (the function
supervisor, ``python -m slurmkit.runtime.fnjob``: :class:`slurmkit.executors.Setup`) and the
submitit backend of ``slurmkit sweep`` (the trial runtime, ``python -m
slurmkit.runtime.submitit_trial``: :class:`slurmkit.backends.submitit.Trials`). The batch
script is submitit's ``#SBATCH`` header over a body whose requeue options and supervision come
from :func:`slurmkit.render.supervised`, as the sbatch path's do. This module imports submitit
only when an executor is made, and nothing of ``backends/`` or ``executors``: the job class that
reads slurmkit's poll cache is made from the query its caller gives (:func:`job_class`).

This is also slurmkit's compatibility shim for submitit: every private name of submitit that
the login side uses is here, and nowhere else (``tests/test_submitit_adapter.py`` holds it so;
the in-job runtime, which may not import this module, has its own in ``runtime/fnjob.py``).
Tested with submitit 1.5.4 (the newest release when written); 1.5.3's source has every name
below, releases before it lack the public ``max_pickle_size_gb`` used here. Each name, and why
no public API does it:

- ``SlurmExecutor._internal_process_submissions`` and ``LocalExecutor``'s (overridden): the one
  hook between ``submit``/``map_array``/``batch()`` and sbatch. submitit's own copies a plain
  ``SlurmExecutor`` for an array (our script would be lost), pickles and submits one call at a
  time, and lets pickling errors out as they come; ours pickles every call first (an
  unpicklable one is a UserError before anything is submitted), submits one array, and leaves
  no pickle or script behind when sbatch refuses.
- ``PicklingExecutor._submit_command`` (called): writes the script, runs sbatch and makes the
  Job; no public function submits a prepared command.
- ``SlurmExecutor._make_submission_file_text`` (overridden): the hook that writes the batch
  script; submitit's parameters (``setup``, ``teardown``) cannot put the task under the batch
  shell's supervision.
- ``SlurmExecutor._num_tasks`` (overridden): a job whose task runs in the batch shell
  (``use_srun=False``) has one task, not nodes x tasks per node.
- ``submitit.slurm.slurm._make_sbatch_string`` (called): submitit's ``#SBATCH`` header, the
  one public-less way to it; :func:`script` renders without an executor too.
- ``SlurmInfoWatcher._registered``, ``_finished``, ``_info_dict``, ``_last_status_check`` (read
  and written by an overridden ``update``): the watcher's state, filled from slurmkit's poll
  cache (one ``squeue`` for every watcher of a user) instead of one sacct per watcher.
- ``SlurmJob._get_outcome_and_result`` (overridden): a job that neither the controller nor
  accounting knows has ended without a result; ``result()`` says so instead of waiting.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .core import slurmtime
from .errors import UserError

if TYPE_CHECKING:
    from .spec import SweepSpec

# The state of a job that neither the controller nor accounting knows: it ended, how is unknown.
GONE = "GONE"
UNTHROTTLED = 1_000_000  # submitit's array_parallelism without max_parallel: no %N limit
# resources field -> SlurmExecutor parameter, when the spec sets it
_PARAMETERS = (
    ("partition", "partition"),
    ("account", "account"),
    ("qos", "qos"),
    ("constraint", "constraint"),
    ("cpus", "cpus_per_task"),
    ("gpus", "gpus_per_node"),
    ("mem", "mem"),
)
# AutoExecutor's generic parameter names -> SlurmExecutor's (mem_gb is converted: _memory)
_GENERIC = {"name": "job_name", "timeout_min": "time", "tasks_per_node": "ntasks_per_node"}
# A query of the scheduler: job ids -> {(job id, array task or -1): Slurm state}; a UserError
# when the controller does not answer.
Poll = Callable[[set[str]], Mapping[tuple[str, int], str]]


class Body(NamedTuple):
    """What a :class:`Task` puts in its batch script's body."""

    preamble: list[str]  # shell lines before the Python check
    task: str  # the command the batch shell runs under render.supervised
    quoted: bool = False  # it holds script text quoted on purpose (shellcheck is told)


class Task(Protocol):
    """What the jobs of an :func:`Executor <executor_class>` run; the executor is the same."""

    @property
    def spec(self) -> SweepSpec: ...

    @property
    def folder(self) -> str:
        """submitit's folder (pickles, results, logs); may hold ``%j``."""

    @property
    def python(self) -> str:
        """The job's Python, a shell word (submitit's ``python``)."""

    @property
    def parameters(self) -> dict[str, Any]:
        """``update_parameters`` keywords (``srun_args`` among them) of a new executor."""

    @property
    def srun_args(self) -> list[str]:
        """srun options that stay first whatever ``update_parameters`` adds."""

    @property
    def one_array(self) -> bool:
        """Every submission is one array, one call too (a sweep's trial = offset + task)."""

    @property
    def throttle_s(self) -> float:
        """The least time between two submissions of one executor."""

    def command(self, python: str | None = None, folder: str | None = None) -> str:
        """The task's shell command, reading its pickle from ``folder``."""

    def body(self, params: Mapping[str, Any], command: str, folder: str) -> Body:
        """The batch script's body for ``command`` under the parameters ``params``."""


# --- the parameters ---------------------------------------------------------------------------


def minutes(time: str | None) -> int | str | None:
    """``resources.time`` as submitit's ``time`` (minutes, rounded up as Slurm rounds a limit
    with seconds); ``UNLIMITED`` as it is; None when not asked."""
    if time is None:
        return None
    seconds = slurmtime.parse_seconds(time)
    return "UNLIMITED" if seconds is None else math.ceil(seconds / 60)


def parameters(spec: SweepSpec) -> dict[str, Any]:
    """``SlurmExecutor.update_parameters`` keywords for what the spec asks for (and ``None``
    for submitit's defaults that it does not ask for: ``time``, ``wckey``)."""
    r = spec.resources
    params: dict[str, Any] = {
        "job_name": spec.name,
        "nodes": r.nodes,
        "time": minutes(r.time),
        "wckey": None,
        "signal_delay_s": spec.requeue.lead,
        "array_parallelism": spec.max_parallel or UNTHROTTLED,
    }
    if r.tasks_per_node > 1:
        params["ntasks_per_node"] = r.tasks_per_node
    for key, name in _PARAMETERS:
        if getattr(r, key) is not None:
            params[name] = getattr(r, key)
    if r.exclusive:
        params["exclusive"] = True
    extra: dict[str, Any] = {k: v for k, v in r.extra.items() if v is not False}
    if r.switches is not None:
        extra["switches"] = r.switches
    if extra:
        params["additional_parameters"] = extra
    return params


def _memory(gigabytes: float) -> str:
    """AutoExecutor's ``mem_gb`` as Slurm's ``mem`` (as submitit converts it)."""
    if gigabytes == int(gigabytes):
        return f"{int(gigabytes)}GB"
    return f"{int(gigabytes * 1024)}MB"


def _as_parameters(options: Sequence[str]) -> dict[str, Any]:
    """``--key=value``/``--flag`` options as ``additional_parameters`` of submitit."""
    out: dict[str, Any] = {}
    for option in options:
        key, has, value = option.removeprefix("--").partition("=")
        out[key] = value if has else True
    return out


# --- the batch script -------------------------------------------------------------------------


def script(task: Task, params: Mapping[str, Any], command: str, folder: str) -> str:
    """The batch script of a submission: submitit's ``#SBATCH`` header of ``params`` with
    slurmkit's requeue options, and ``task``'s body, whose command runs supervised
    (:func:`slurmkit.render.supervised`, as in every batch script slurmkit writes)."""
    from submitit.slurm.slurm import _make_sbatch_string

    from . import render

    body = task.body(params, command, folder)
    given = dict(params)
    setup_lines = given.pop("setup", None)
    teardown = list(given.pop("teardown", None) or [])
    for key in ("srun_args", "use_srun"):
        given.pop(key, None)
    extra = dict(given.pop("additional_parameters", None) or {})
    policy = task.spec.requeue
    policy = dataclasses.replace(policy, lead=given.get("signal_delay_s", policy.lead))
    job_ref = render.JOB if given.get("map_count") is None else render.ARRAY_TASK
    contract = render.supervised(policy, body.task, job_ref, teardown, body.quoted)
    lines = [
        *body.preamble,
        f"PY=${{SLURMKIT_PYTHON:-{shlex.quote(sys.executable)}}}",
        'command -v "$PY" >/dev/null || { echo "slurmkit: no Python $PY on $(hostname): set'
        ' SLURMKIT_PYTHON to one with slurmkit and submitit" >&2; exit 2; }',
        *contract.body,
    ]
    text: str = _make_sbatch_string(
        command="\n".join(lines),
        folder=folder,
        setup=setup_lines,
        use_srun=False,
        additional_parameters={**_as_parameters(contract.sbatch), **extra},
        **given,
    )
    if policy.enabled is not True:  # submitit always asks for its signal; without ours, none
        text = "\n".join(
            line for line in text.split("\n") if not line.startswith("#SBATCH --signal=")
        )
    return text


# --- the executors ----------------------------------------------------------------------------


def unpicklable(delayed: Any, exc: BaseException) -> UserError:
    """The error of a submitted call that cannot be pickled."""
    fn = delayed.function
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return UserError(
        f"cannot pickle {name} or its arguments: {type(exc).__name__}: {exc}; nothing submitted",
        hint="submitit sends the function and its arguments to the job with cloudpickle: open "
        "files, locks, sockets, generators and the like cannot travel; create them in the function",
    )


def _dump_all(ex: Any, delayed: Sequence[Any], base: Path) -> list[Path]:
    """Every submission of ``ex`` pickled into ``base`` before anything is submitted."""
    limit = ex.parameters.get("time")
    paths: list[Path] = []
    try:
        for d in delayed:
            path = base / f"{uuid.uuid4().hex}.pkl"
            paths.append(path)
            d.set_timeout(limit if isinstance(limit, int) else 0, ex.max_num_timeout)
            try:
                d.dump(path)
            except OSError:
                raise
            except Exception as exc:
                raise unpicklable(d, exc) from None
            if len(paths) == 1:
                size = path.stat().st_size / 1024**3
                if len(delayed) * size > ex.max_pickle_size_gb:
                    raise UserError(
                        f"{len(delayed)} x {size:.2f} GB of pickled functions and arguments is "
                        f"more than max_pickle_size_gb ({ex.max_pickle_size_gb}); "
                        "nothing submitted",
                        hint="pass paths instead of data, or raise executor.max_pickle_size_gb",
                    )
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise
    return paths


@functools.cache
def executor_class() -> type[Any]:
    """The one ``submitit.SlurmExecutor`` subclass: ``Executor(task)``, its jobs running
    ``task`` (a :class:`Task`)."""
    import submitit
    from submitit.core import utils

    class Executor(submitit.SlurmExecutor):
        """A ``submitit.SlurmExecutor`` whose jobs run ``task``.

        ``update_parameters`` takes SlurmExecutor's names, AutoExecutor's ``slurm_`` ones
        and its generic ones (``timeout_min``, ``mem_gb``, ``tasks_per_node``, ``name``);
        ``srun_args`` given there come after the task's (its container options stay).
        """

        def __init__(
            self,
            task: Task,
            max_num_timeout: int = 3,
            python: str | None = None,
            job_class: type[Any] | None = None,
        ) -> None:
            self.task = task
            self.submitted_at = 0.0
            python = python or task.python
            super().__init__(task.folder, max_num_timeout=max_num_timeout, python=python)
            if job_class is not None:
                self.job_class = job_class
            self.update_parameters(**{k: v for k, v in task.parameters.items() if k != "srun_args"})
            self.parameters["srun_args"] = list(task.srun_args)

        def update_parameters(self, **kwargs: Any) -> None:
            params: dict[str, Any] = {}
            for key, value in kwargs.items():
                key = key.removeprefix("slurm_")
                if key == "mem_gb":
                    params["mem"] = _memory(value)
                else:
                    params[_GENERIC.get(key, key)] = value
            if "srun_args" in params:
                params["srun_args"] = [*self.task.srun_args, *(params["srun_args"] or [])]
            super().update_parameters(**params)

        def _num_tasks(self) -> int:
            tasks: int = super()._num_tasks()
            return tasks if self.parameters.get("use_srun", True) else 1

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return script(self.task, self.parameters, command, str(self.folder))

        def _internal_process_submissions(self, delayed: list[Any]) -> list[submitit.Job[Any]]:
            """Every submission pickled first, then one job (one call) or one array."""
            folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
            folder.mkdir(parents=True, exist_ok=True)
            before = set(folder.glob(".submission_file_*.sh"))
            paths = _dump_all(self, delayed, folder)
            command = self.task.command(self.python, str(self.folder))
            try:
                pause = self.submitted_at + self.task.throttle_s - time.time()
                if pause > 0:
                    time.sleep(pause)
                self.submitted_at = time.time()
                if len(paths) == 1 and not self.task.one_array:
                    jobs = [self._submit_command(command)]
                else:
                    array = copy.copy(self)
                    array.parameters = {**self.parameters, "map_count": len(paths)}
                    first = array._submit_command(command)
                    tasks = list(range(first.num_tasks))
                    ids = [f"{first.job_id}_{i}" for i in range(len(paths))]
                    jobs = [self.job_class(self.folder, job_id, tasks) for job_id in ids]
            except BaseException:  # nothing half-written left: pickles, the unsubmitted script
                for path in [*paths, *(set(folder.glob(".submission_file_*.sh")) - before)]:
                    path.unlink(missing_ok=True)
                raise
            for job, path in zip(jobs, paths):
                job.paths.move_temporary_file(path, "submitted_pickle")
            return jobs

    Executor.__module__, Executor.__qualname__ = __name__, "Executor"
    return Executor


@functools.cache
def local_class() -> type[Any]:
    """submitit's ``LocalExecutor`` (where no cluster answers), refusing a call that cannot be
    pickled before any runs."""
    import cloudpickle
    import submitit

    class LocalExecutor(submitit.LocalExecutor):
        """submitit's LocalExecutor, set up from a spec where no cluster answers."""

        def _internal_process_submissions(self, delayed: list[Any]) -> list[submitit.Job[Any]]:
            for d in delayed:
                try:
                    cloudpickle.dumps(d)
                except Exception as exc:
                    raise unpicklable(d, exc) from None
            jobs: list[submitit.Job[Any]] = super()._internal_process_submissions(delayed)
            return jobs

    LocalExecutor.__module__, LocalExecutor.__qualname__ = __name__, "LocalExecutor"
    return LocalExecutor


@functools.cache
def job_class(poll: Poll) -> type[Any]:
    """submitit's ``SlurmJob``, its state read through ``poll`` (slurmkit's poll cache: any
    number of ``job.done()``/``job.result()`` callers of one user on one login node cost one
    ``squeue`` per poll interval, instead of one sacct each). A job that ``poll`` does not know
    (the controller forgot it after MinJobAge, and no accounting answers) has ended, how is
    unknown: its state is GONE, so that waiting on it ends, and its ``result()`` says so."""
    from submitit.core import logger, utils
    from submitit.slurm import slurm

    class Watcher(slurm.SlurmInfoWatcher):
        def update(self) -> None:
            pending = self._registered - self._finished
            jobs = {x.split("_")[0] for x in pending}
            if not jobs:
                return
            try:
                answer = poll(jobs)
            except UserError as exc:  # the controller is briefly away: ask again next time
                logger.get_logger().warning(f"the scheduler did not answer: {exc}")
                answer = {}
            else:  # a job that neither the queue nor accounting knows has ended, how is unknown
                known = {job for job, _ in answer}
                for job_id in pending:
                    if job_id.split("_")[0] not in known:
                        self._info_dict[job_id] = {"State": GONE}
            rows = [
                f"{job}{'' if task < 0 else f'_{task}'}|{state}|"
                for (job, task), state in answer.items()
            ]
            if rows:
                self._info_dict.update(self.read_info("JobID|State|NodeList\n" + "\n".join(rows)))
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

    class Job(slurm.SlurmJob[Any]):
        """submitit's SlurmJob, watched through slurmkit's poll cache."""

        watcher = Watcher(delay_s=600)

        def _get_outcome_and_result(self) -> tuple[str, Any]:
            """submitit's, but a GONE job without a result says so at once (it ended long ago:
            no result is on its way)."""
            gone = self.watcher.get_state(self.job_id, mode="cache") == GONE
            if gone and not self.paths.result_pickle.exists():
                raise utils.UncompletedJobError(
                    f"job {self.job_id} ended without a result, and how is not known: the "
                    "controller no longer knows it and the cluster keeps no accounting (sacct); "
                    f"its logs: {self.paths.stdout}, {self.paths.stderr}"
                )
            outcome: tuple[str, Any] = super()._get_outcome_and_result()
            return outcome

    Watcher.__module__, Watcher.__qualname__ = __name__, "Watcher"
    return Job


def __getattr__(name: str) -> Any:
    if name == "Executor":
        return executor_class()
    if name == "LocalExecutor":
        return local_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
