"""submitit executors configured from slurmkit specs: :func:`executor` and :func:`executor_config`.

    ex = slurmkit.executor("job.yaml", ["resources.nodes=2"], time="0:30:00")
    job = ex.submit(train, cfg)          # submitit's API: submit, map_array, batch(), ...
    job.result()

The spec goes through slurmkit's loader and layers (profile < user config < spec < overrides <
keyword resources) and takes every key of a job spec but the sweep's own (``params``,
``num_samples``, ``seed``, ``args``), ``command`` (the submitted function is the command) and
``logs`` (submitit names its own log files).
What the spec asks for is rendered, nothing else: no ``--cpus-per-task`` unless asked, no
``--time`` without ``resources.time``, no ``--wckey``. The batch script keeps slurmkit's
requeue contract: ``--requeue``, ``--signal=B:SIG@LEAD``, the step supervised from the host by
``python -m slurmkit.runtime.fnjob supervise`` (see that module), ``scontrol requeue`` run by
the batch shell, never from inside a container.

This module imports submitit only when an executor is made (:func:`executor`); the classes are
:data:`SpecExecutor` (a ``submitit.SlurmExecutor``; its jobs are ``SpecJob``, submitit's
SlurmJob watched by ``squeue`` where ``sacct`` has no accounting to read) and
:data:`LocalSpecExecutor` (a ``submitit.LocalExecutor``, for machines without a cluster).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time as _time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core import slurmtime
from .core.contract import ENV_SIGNAL
from .errors import SpecError, UserError

if TYPE_CHECKING:
    import submitit

    from .pyxis import Container
    from .spec import SweepSpec

__all__ = ["executor", "executor_config"]

STEP = "slurmkit.runtime.fnjob"
# Keys of a job spec an executor refuses: the sweep's own, the command (the function is) and
# the log names (submitit's).
REFUSED = {
    "params": "use map_array(fn, values) for many calls",
    "num_samples": "use map_array(fn, values) for many calls",
    "seed": "seed the function's own randomness",
    "args": "the function gets its arguments from submit(fn, *args)",
    "command": "the function you submit is the command: leave it out, or pass '~command'",
    "logs": "submitit names its own logs (FOLDER/JOBID_TASK_log.out and .err); "
    "update_parameters(stderr_to_stdout=True) merges them",
}
DICT_SOURCE = "executor(spec)"  # the "file" of errors in a spec given as a dict
KEYWORDS = "executor() keywords"  # the "file" of errors in keyword resources
DEFAULT_NAME = "submitit"  # the name of a spec given as a dict or None (submitit's own default)
# The state of a job that neither the controller nor accounting knows: it ended, how is unknown.
GONE = "GONE"
UNTHROTTLED = 1_000_000  # submitit's array_parallelism without max_parallel: no %N limit
LOCAL_UNLIMITED_MIN = 60 * 24 * 365  # LocalExecutor's timeout without resources.time (its 2 min)
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
_PYXIS_PATH = re.compile(r"^/[^\s'\"$`\\,:]*$")  # a path pyxis can mount
_ID_TAGS = ("%j", "%t", "%A", "%a")
_said: set[str] = set()


@dataclass(frozen=True)
class Setup:
    """What an executor of ``spec`` uses: the submitit parameters, the srun options and the
    argv that runs before the step's Python (self-check, env wrapper)."""

    spec: SweepSpec
    folder: str  # absolute; may hold submitit's %j
    python: str  # the step's interpreter, a shell word (submitit's ``python``)
    parameters: dict[str, Any]  # SlurmExecutor.update_parameters(**parameters)
    srun_args: list[str] = field(default_factory=list)
    prefix: list[str] = field(default_factory=list)

    def command(self, python: str | None = None, folder: str | None = None) -> str:
        """The step's shell command (submitit's ``_submitit_command_str``)."""
        words = [*map(shlex.quote, self.prefix), python or self.python]
        return " ".join([*words, "-u", "-m", STEP, "run", shlex.quote(folder or self.folder)])


# --- the spec ---------------------------------------------------------------------------------


def _refused(key: str, file: str | None) -> SpecError:
    return SpecError(
        "not a setting of an executor (it runs the function you submit)",
        file=file,
        key=key,
        hint=REFUSED[key],
    )


def _plain(value: Any) -> Any:
    """A spec given as Python data, as YAML can hold it (tuples as lists)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _dump(data: Mapping[str, Any], path: str) -> None:
    """``data`` as YAML that slurmkit's loader reads back as the same data: every string is
    quoted (``15:00`` and ``1e-3`` stay strings, as they are in Python)."""
    from .yamlimport import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(
        str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="'")
    )
    try:
        text = yaml.dump(_plain(data), Dumper=Dumper, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError as exc:
        raise SpecError(f"cannot be read as a spec: {exc}", file=DICT_SOURCE) from None
    Path(path).write_text(text, encoding="utf-8")


def load(
    spec_or_path: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    resources: Mapping[str, Any] | None = None,
) -> SweepSpec:
    """The job spec of an executor: a YAML file, a dict or None (the defaults), through
    slurmkit's layers (profile < user config < spec < ``overrides`` < ``resources``)."""
    from .spec.layers import Sources, owner, resolve
    from .spec.model import CLI
    from .spec.validate import canonical, validate

    if isinstance(overrides, str):
        raise UserError(
            "overrides must be a list of strings, not one string",
            key="overrides",
            hint="executor(spec, ['resources.nodes=2', 'requeue.lead=300'])",
        )
    overrides = list(overrides)
    for text in overrides:
        top = text.partition("=")[0].lstrip("~+").split(".")[0]
        if top in REFUSED and not text.startswith("~"):  # deleting one is harmless
            raise _refused(top, CLI)
    label: str | None = None
    with tempfile.TemporaryDirectory(prefix="slurmkit-executor-") as tmp:
        if spec_or_path is None or isinstance(spec_or_path, Mapping):
            label = DICT_SOURCE
            path = os.path.join(tmp, f"{DEFAULT_NAME}.yaml")  # its stem: the default name
            _dump(spec_or_path or {}, path)
        else:
            path = os.fspath(spec_or_path)
            if not os.path.isfile(path):
                raise SpecError(
                    "is a directory" if os.path.isdir(path) else "no such file", file=path
                )
        sources: Sources = []
        try:
            data, _, sources = resolve(path, overrides)
            for key in REFUSED:
                if key in data:
                    raise _refused(key, owner(key, sources) or path)
            if resources:
                given = data.get("resources") or {}
                if isinstance(given, Mapping):
                    data["resources"] = {
                        **canonical(dict(given), path),
                        **canonical(dict(resources), KEYWORDS),
                    }
                    sources.append((KEYWORDS, {"resources": dict(resources)}))
            data["command"] = [STEP]  # never run: the submitted function is the command
            spec = validate(data, path, {}, job=True)
            if spec.launcher == "torchrun":
                raise SpecError(
                    "submitit runs one Python per task: torchrun cannot start it",
                    file=path,
                    key="launcher",
                    hint="launcher: srun (one task per GPU; slurmkit.runtime.distributed.init() "
                    "reads Slurm's ranks), or leave it out",
                )
        except SpecError as exc:
            if exc.file == path and exc.key:
                exc.file = owner(exc.key, sources) or path
            if exc.file == path and label:
                exc.file = label
            raise
    return dataclasses.replace(spec, source=label) if label else spec


# --- what the spec becomes ------------------------------------------------------------------


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


def _id_free(folder: str) -> str:
    """The part of ``folder`` before submitit's first per-job tag (``%j``, ...)."""
    parts = Path(folder).parts
    kept = []
    for part in parts:
        if any(tag in part for tag in _ID_TAGS):
            break
        kept.append(part)
    return str(Path(*kept))


def _covers(mount: str, path: str) -> bool:
    src, _, rest = mount.partition(":")
    dst = rest.partition(":")[0] or src
    inside = path == dst or path.startswith(dst.rstrip("/") + "/")
    return src == dst and inside


def _mounted(c: Container, folder: str, submit_dir: str) -> Container:
    """``c`` with the executor's folder mounted at its own path when no mount holds it (the
    step reads its pickles there and writes its results)."""
    base = _id_free(folder)
    mounts = list(c.pyxis_mounts)
    if c.workdir in (None, "image"):
        mounts.append(f"{submit_dir}:{submit_dir}")  # pyxis.srun_options mounts it
    if any(_covers(m, base) for m in mounts):
        return c
    if not _PYXIS_PATH.match(base):
        raise UserError(
            f"the executor's folder {base} cannot be mounted in the container",
            key="folder",
            hint="a folder without whitespace, quotes, '$', '\\', ',' or ':' (folder=...), "
            "or mount one that holds it (container.mounts)",
        )
    return dataclasses.replace(c, pyxis_mounts=(*c.pyxis_mounts, f"{base}:{base}"))


def setup(spec: SweepSpec, folder: str | os.PathLike[str] | None, python: str | None) -> Setup:
    from . import launch

    where = folder if folder is not None else os.path.join(spec.output_root, spec.name, "submitit")
    where = os.path.abspath(os.path.expanduser(os.fspath(where)))
    srun_args = ["--kill-on-bad-exit=1", *launch.srun_options(spec.srun)]
    if spec.container is not None:
        from . import pyxis

        submit_dir = os.path.abspath(spec.workdir or os.getcwd())
        srun_args += pyxis.srun_options(
            _mounted(spec.container, where, submit_dir),
            submit_dir=submit_dir,
            env_names=[*spec.env, *spec.env_runtime],
            source=spec.source,
        )
    prefix = [
        *(launch.self_check() if spec.container is not None and spec.self_check else []),
        *launch.env_wrapper(spec.env_prepend, spec.env_append),
    ]
    return Setup(
        spec=spec,
        folder=where,
        # in a container the image's Python runs the step (it needs submitit and slurmkit)
        python=python or ("python3" if spec.container is not None else shlex.quote(sys.executable)),
        parameters={**parameters(spec), "srun_args": srun_args},
        srun_args=srun_args,
        prefix=prefix,
    )


def _srun(params: Mapping[str, Any], folder: str) -> list[str]:
    """submitit's srun line (its log paths), with the srun arguments."""
    stdout, stderr = (os.path.join(folder, f"%j_%t_log.{ext}") for ext in ("out", "err"))
    if params.get("map_count") is not None:
        stdout, stderr = (p.replace("%j", "%A_%a") for p in (stdout, stderr))
    errors = [] if params.get("stderr_to_stdout") else ["--error", stderr]
    return ["srun", "--unbuffered", "--output", stdout, *errors, *params.get("srun_args", [])]


def _tasks(params: Mapping[str, Any]) -> int:
    return int(params.get("nodes") or 1) * max(1, int(params.get("ntasks_per_node") or 1))


def supervise_config(s: Setup, params: Mapping[str, Any], folder: str) -> dict[str, Any]:
    """What ``python -m slurmkit.runtime.fnjob supervise`` is told (JSON on its command line):
    the job contract (:class:`~slurmkit.core.jobcontract.JobContract`), its defaults left out."""
    from .core.jobcontract import JobContract, Policy

    policy = s.spec.requeue
    lead = params.get("signal_delay_s", policy.lead)
    return JobContract(
        requeue=Policy(**{**asdict(policy), "lead": lead}),
        env_runtime=dict(s.spec.env_runtime),
        workdir=s.spec.workdir,
        folder=folder,
        tasks=_tasks(params) if params.get("use_srun", True) else 1,
    ).to_dict()


def _supervised(
    task: str, signal: str | None, job_ref: str, teardown: list[str], quoted: bool
) -> list[str]:
    """render's supervision of ``task`` (and the teardown lines before the exit); ``quoted``:
    the step's argv holds script text (self-check, env wrapper) that must not expand here."""
    from .render import _supervise

    lines = _supervise(task, signal, job_ref)
    if teardown:
        done = lines[:-1] if signal is not None else [task, "rc=$?"]
        lines = [*done, "", "# teardown", *teardown, 'exit "$rc"']
    if quoted:
        at = next(i for i, line in enumerate(lines) if task in line)
        lines.insert(at, "# shellcheck disable=SC2016  # script text for sh -c, quoted on purpose")
    return lines


def script(s: Setup, params: Mapping[str, Any], command: str, folder: str) -> str:
    """The batch script of a submission: submitit's ``#SBATCH`` header of ``params``, with
    slurmkit's requeue options, and the step under ``fnjob supervise``."""
    from submitit.slurm.slurm import _make_sbatch_string

    q = shlex.quote
    spec, policy = s.spec, s.spec.requeue
    given = dict(params)
    setup_lines = given.pop("setup", None)
    teardown = list(given.pop("teardown", None) or [])
    given.pop("srun_args", None)
    use_srun = given.pop("use_srun", True)
    extra = dict(given.pop("additional_parameters", None) or {})
    lead = given.get("signal_delay_s", policy.lead)
    ours: dict[str, Any] = (
        {"requeue": True, "signal": f"B:{policy.signal}@{lead}"}
        if policy.enabled
        else {"no-requeue": True}
    )
    if not use_srun and spec.container is not None:
        raise UserError(
            "use_srun=False runs the function in the batch shell, outside the container",
            key="use_srun",
            hint="keep use_srun=True for container jobs",
        )
    step = _srun(params, folder) if use_srun else []
    config = json.dumps(supervise_config(s, params, folder), separators=(",", ":"))
    task = " ".join(
        ['"$PY"', "-m", STEP, "supervise", "--config", q(config), "--", *map(q, step), command]
    )
    job_ref = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
    if given.get("map_count") is None:
        job_ref = '"$SLURM_JOB_ID"'
    body = [
        "# slurmkit: the step runs under its supervisor (requeue contract, budgets)",
        f"export {ENV_SIGNAL}={policy.signal}",
        *(f"export {name}={q(value)}" for name, value in spec.env.items()),
        f"PY=${{SLURMKIT_PYTHON:-{q(sys.executable)}}}",
        'command -v "$PY" >/dev/null || { echo "slurmkit: no Python $PY on $(hostname): set'
        ' SLURMKIT_PYTHON to one with slurmkit and submitit" >&2; exit 2; }',
        *_supervised(
            task, policy.signal if policy.enabled else None, job_ref, teardown, bool(s.prefix)
        ),
    ]
    text = _make_sbatch_string(
        command="\n".join(body),
        folder=folder,
        setup=setup_lines,
        use_srun=False,
        additional_parameters={**ours, **extra},
        **given,
    )
    if not policy.enabled:  # submitit always asks for its signal; without requeue, none
        text = "\n".join(
            line for line in text.split("\n") if not line.startswith("#SBATCH --signal=")
        )
    return text


def executor_config(
    spec_or_path: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    *,
    folder: str | os.PathLike[str] | None = None,
    python: str | None = None,
    **resources: Any,
) -> dict[str, Any]:
    """What :func:`executor` would use, as plain data (no submitit needed): ``parameters``
    (``SlurmExecutor.update_parameters`` keywords, ``srun_args`` among them), ``sbatch`` (the
    options slurmkit adds), ``srun`` (the step's srun prefix), ``command`` (the argv srun runs:
    self-check, env wrapper, the step's Python) and ``supervise`` (what the host side is told)."""
    s = setup(load(spec_or_path, overrides, resources), folder, python)
    from .render import requeue_options

    policy = s.spec.requeue
    return {
        "name": s.spec.name,
        "folder": s.folder,
        "python": s.python,
        "parameters": dict(s.parameters),
        "sbatch": [
            *requeue_options(policy)[:1],
            *([f"--signal=B:{policy.signal}@{policy.lead}"] if policy.enabled else []),
        ],
        "srun": _srun(s.parameters, s.folder),
        "command": [*s.prefix, *shlex.split(s.python), "-u", "-m", STEP, "run", s.folder],
        "supervise": supervise_config(s, s.parameters, s.folder),
    }


# --- the executors ----------------------------------------------------------------------------


def _unpicklable(delayed: Any, exc: BaseException) -> UserError:
    fn = delayed.function
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return UserError(
        f"cannot pickle {name} or its arguments: {type(exc).__name__}: {exc}; nothing submitted",
        hint="submitit sends the function and its arguments to the job with cloudpickle: open "
        "files, locks, sockets, generators and the like cannot travel; create them in the function",
    )


@functools.cache
def _classes() -> tuple[type[Any], type[Any], type[Any]]:
    import cloudpickle
    import submitit
    from submitit.core import logger as slogger
    from submitit.core import utils as sutils
    from submitit.slurm import slurm as sslurm

    class Watcher(sslurm.SlurmInfoWatcher):
        """submitit's watcher, reading slurmkit's shared poll cache instead of one sacct per
        watcher: any number of ``job.done()``/``job.result()`` callers of one user on one login
        node cost one ``squeue`` per SLURMKIT_POLL_INTERVAL; jobs gone from the queue are asked
        from sacct once (none when the cluster keeps no accounting). A job that neither knows
        (the controller forgot it after MinJobAge, and no accounting answers) has ended, how is
        unknown: its state is GONE, so that waiting on it ends."""

        def update(self) -> None:
            from .backends import pollcache
            from .backends import slurm as sk

            jobs = {x.split("_")[0] for x in self._registered - self._finished}
            if not jobs:
                return
            self._num_calls += 1
            every = pollcache.interval()
            try:
                if every:
                    name = sk.user()
                    answer = pollcache.PollCache(name, every).tasks(
                        jobs, lambda: sk.user_tasks(name), sk.ended
                    )
                else:
                    answer = sk.query(jobs)
            except UserError as exc:  # the controller is briefly away: ask again next time
                slogger.get_logger().warning(f"the scheduler did not answer: {exc}")
                answer = {}
            else:  # a job that neither the queue nor accounting knows has ended, how is unknown
                known = {job for job, _ in answer}
                for job_id in self._registered - self._finished:
                    if job_id.split("_")[0] not in known:
                        self._info_dict[job_id] = {"State": GONE}
            rows = [
                f"{job}{'' if task < 0 else f'_{task}'}|{state.state}|"
                for (job, task), state in answer.items()
            ]
            if rows:
                self._info_dict.update(self.read_info("JobID|State|NodeList\n" + "\n".join(rows)))
            self._last_status_check = _time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

    class SpecJob(sslurm.SlurmJob[Any]):
        """submitit's SlurmJob, watched by sacct or, without accounting, squeue."""

        watcher = Watcher(delay_s=600)

        def _get_outcome_and_result(self) -> tuple[str, Any]:
            """submitit's, but a GONE job without a result says so at once (it ended long ago:
            no result is on its way)."""
            gone = self.watcher.get_state(self.job_id, mode="cache") == GONE
            if gone and not self.paths.result_pickle.exists():
                raise sutils.UncompletedJobError(
                    f"job {self.job_id} ended without a result, and how is not known: the "
                    "controller no longer knows it and the cluster keeps no accounting (sacct); "
                    f"its logs: {self.paths.stdout}, {self.paths.stderr}"
                )
            outcome: tuple[str, Any] = super()._get_outcome_and_result()
            return outcome

    class SpecExecutor(submitit.SlurmExecutor):
        """A ``submitit.SlurmExecutor`` from a slurmkit spec (:func:`slurmkit.executor`).

        ``update_parameters`` takes SlurmExecutor's names, AutoExecutor's ``slurm_`` ones
        and its generic ones (``timeout_min``, ``mem_gb``, ``tasks_per_node``, ``name``);
        ``srun_args`` given there come after the spec's (its container options stay).
        """

        job_class = SpecJob

        def __init__(self, s: Setup, max_num_timeout: int = 3, python: str | None = None) -> None:
            self.slurmkit = s
            super().__init__(s.folder, max_num_timeout=max_num_timeout, python=python or s.python)
            given = {k: v for k, v in s.parameters.items() if k != "srun_args"}
            self.update_parameters(**given)
            self.parameters["srun_args"] = list(s.srun_args)

        def _internal_update_parameters(self, **kwargs: Any) -> None:
            names: dict[str, str] = dict(self._equivalence_dict() or {})  # type: ignore[arg-type]
            params: dict[str, Any] = {}
            for key, value in kwargs.items():
                key = key.removeprefix("slurm_")
                if key == "mem_gb":
                    params["mem"] = sslurm._convert_mem(value)
                else:
                    params[names.get(key, key)] = value
            if "srun_args" in params:
                params["srun_args"] = [*self.slurmkit.srun_args, *(params["srun_args"] or [])]
            super()._internal_update_parameters(**params)

        @property
        def _submitit_command_str(self) -> str:
            return self.slurmkit.command(self.python, str(self.folder))

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return script(self.slurmkit, self.parameters, command, str(self.folder))

        def _dump_all(self, delayed: Sequence[Any]) -> list[Path]:
            """Every submission pickled before anything is submitted."""
            base = sutils.JobPaths.get_first_id_independent_folder(self.folder)
            base.mkdir(parents=True, exist_ok=True)
            limit = self.parameters.get("time")
            paths: list[Path] = []
            try:
                for d in delayed:
                    path = base / f"{uuid.uuid4().hex}.pkl"
                    paths.append(path)
                    d.set_timeout(limit if isinstance(limit, int) else 0, self.max_num_timeout)
                    try:
                        d.dump(path)
                    except OSError:
                        raise
                    except Exception as exc:
                        raise _unpicklable(d, exc) from None
                    if len(paths) == 1:
                        size = path.stat().st_size / 1024**3
                        if len(delayed) * size > self.max_pickle_size_gb:
                            raise UserError(
                                f"{len(delayed)} x {size:.2f} GB of pickled functions and "
                                f"arguments is more than max_pickle_size_gb "
                                f"({self.max_pickle_size_gb}); nothing submitted",
                                hint="pass paths instead of data, or raise "
                                "executor.max_pickle_size_gb",
                            )
            except BaseException:
                for path in paths:
                    path.unlink(missing_ok=True)
                raise
            return paths

        def _internal_process_submissions(
            self, delayed_submissions: list[Any]
        ) -> list[submitit.Job[Any]]:
            paths = self._dump_all(delayed_submissions)
            try:
                self._throttle()
                self._last_job_submitted = _time.time()
                if len(paths) == 1:
                    job = self._submit_command(self._submitit_command_str)
                    jobs = [job]
                else:  # one array (submitit's own copies a plain SlurmExecutor for it)
                    array = SpecExecutor(self.slurmkit, self.max_num_timeout, self.python)
                    array.parameters = {**self.parameters, "map_count": len(paths)}
                    first = array._submit_command(self._submitit_command_str)
                    tasks = list(range(first.num_tasks))
                    jobs = [
                        SpecJob(self.folder, f"{first.job_id}_{i}", tasks)
                        for i in range(len(paths))
                    ]
            except BaseException:
                for path in paths:
                    path.unlink(missing_ok=True)
                raise
            for job, path in zip(jobs, paths):
                job.paths.move_temporary_file(path, "submitted_pickle")
            return jobs

    class LocalSpecExecutor(submitit.LocalExecutor):
        """submitit's LocalExecutor, set up from a spec where no cluster answers."""

        def _internal_process_submissions(
            self, delayed_submissions: list[Any]
        ) -> list[submitit.Job[Any]]:
            for d in delayed_submissions:
                try:
                    cloudpickle.dumps(d)
                except Exception as exc:
                    raise _unpicklable(d, exc) from None
            return super()._internal_process_submissions(delayed_submissions)

    for cls in (SpecExecutor, LocalSpecExecutor, SpecJob, Watcher):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return SpecExecutor, LocalSpecExecutor, SpecJob


def __getattr__(name: str) -> Any:
    classes = ("SpecExecutor", "LocalSpecExecutor", "SpecJob")
    if name in classes:
        return _classes()[classes.index(name)]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _note(text: str) -> None:
    """Say ``text`` on stderr, once per process."""
    if text not in _said:
        _said.add(text)
        print(f"slurmkit: {text}", file=sys.stderr)


def _shell_env(spec: SweepSpec) -> list[str]:
    """The spec's environment as shell lines (LocalExecutor's ``setup``)."""
    q = shlex.quote
    lines = [f"cd {q(spec.workdir)}"] if spec.workdir else []
    lines += [f"export {k}={q(v)}" for k, v in spec.env.items()]
    lines += [f'export {k}={q(v)}"${{{k}:+:${k}}}"' for k, v in spec.env_prepend.items()]
    lines += [f'export {k}="${{{k}:+${k}:}}"{q(v)}' for k, v in spec.env_append.items()]
    return lines


def _local(s: Setup, cls: type[Any]) -> submitit.LocalExecutor:
    spec, r = s.spec, s.spec.resources
    for bad, key, why in (
        (r.nodes > 1, "resources.nodes", f"{r.nodes} nodes need a Slurm cluster"),
        (spec.container is not None, "container", "a container needs Slurm with pyxis"),
        (bool(spec.env_runtime), "env_runtime", "its placeholders are filled in by Slurm jobs"),
    ):
        if bad:
            raise UserError(
                f"{why}; no cluster answers, and submitit's LocalExecutor runs none",
                file=spec.source,
                key=key,
                hint="submit from a login node of the cluster, or leave the setting out",
            )
    ex = cls(s.folder)
    limit = minutes(r.time)
    params: dict[str, Any] = {
        "timeout_min": limit if isinstance(limit, int) else LOCAL_UNLIMITED_MIN,
        "tasks_per_node": r.tasks_per_node,
        "signal_delay_s": spec.requeue.lead,
    }
    if r.gpu_count:
        params["gpus_per_node"] = r.gpu_count
    if _shell_env(spec):
        params["setup"] = _shell_env(spec)
    ex.update_parameters(**params)
    local: submitit.LocalExecutor = ex
    return local


def executor(
    spec_or_path: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    *,
    folder: str | os.PathLike[str] | None = None,
    python: str | None = None,
    backend: str = "auto",
    **resources: Any,
) -> submitit.Executor:
    """A submitit executor configured from a slurmkit job spec.

    ``spec_or_path``: a YAML spec, a dict, or None (the defaults: profile and user config);
    ``overrides``: Hydra-style, as on the command line; ``resources``: ``resources.KEY`` values
    (``nodes=2, gpus_per_node=8, time="2:00:00"``). ``folder``: where submitit keeps pickles
    and logs (default ``OUTPUT_ROOT/NAME/submitit``, on the shared filesystem); ``python``:
    the step's interpreter (default this one; ``python3`` of the image in a container);
    ``backend``: ``auto`` (Slurm when a controller answers, else submitit's LocalExecutor,
    said once on stderr), ``slurm`` or ``local``.

    Every mistake (an unknown resource key, a sweep key, a container on a cluster without
    pyxis) is a UserError here, before anything is submitted; so is a function or argument
    that cannot be pickled, at ``submit``/``map_array``.
    """
    from . import backends

    spec = load(spec_or_path, overrides, resources)
    s = setup(spec, folder, python)
    if backend not in backends.NAMES:
        raise UserError(
            f"unknown backend {backend!r}",
            key="backend",
            hint=f"allowed values: {', '.join(backends.NAMES)}",
        )
    choosing = backends.Choosing(backend)
    chosen = choosing.result()
    slurm_cls, local_cls, _ = _classes()
    if chosen.runs_here:
        if backend == "auto":
            _note(
                f"{choosing.why or 'no Slurm cluster answers'}: submitit's LocalExecutor runs "
                "the jobs on this machine"
            )
        return _local(s, local_cls)
    chosen.check(spec, 1)
    slurm: submitit.SlurmExecutor = slurm_cls(s)
    return slurm
