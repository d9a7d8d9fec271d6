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

The executor is :mod:`slurmkit.submitit_adapter`'s (the one submitit adapter, shared with the
submitit backend of ``slurmkit sweep``), its jobs running the function supervisor: :class:`Setup`
is what they run. This module imports submitit only when an executor is made (:func:`executor`):
``SpecExecutor`` is a ``submitit.SlurmExecutor`` whose jobs are ``SpecJob``, submitit's SlurmJob
watched by ``squeue`` where ``sacct`` has no accounting to read; ``LocalSpecExecutor`` is a
``submitit.LocalExecutor``, for machines without a cluster.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .core.contract import ENV_SIGNAL
from .errors import SpecError, UserError
from .submitit_adapter import Body, minutes, parameters
from .submitit_adapter import script as script  # an executor's batch script: script(Setup, ...)

__all__ = ["executor", "executor_config"]

if TYPE_CHECKING:
    import submitit

    from .pyxis import Container
    from .spec import SweepSpec

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
LOCAL_UNLIMITED_MIN = 60 * 24 * 365  # LocalExecutor's timeout without resources.time (its 2 min)
_PYXIS_PATH = re.compile(r"^/[^\s'\"$`\\,:]*$")  # a path pyxis can mount
_ID_TAGS = ("%j", "%t", "%A", "%a")
_said: set[str] = set()


@dataclass(frozen=True)
class Setup:
    """What an executor of ``spec`` uses: the submitit parameters, the srun options and the
    argv that runs before the step's Python (self-check, env wrapper); the adapter's
    :class:`~slurmkit.submitit_adapter.Task` of the function supervisor."""

    one_array: ClassVar[bool] = False  # one call is one job, many are one array
    throttle_s: ClassVar[float] = 0.2  # as submitit's executors: a loop of submit() waits

    spec: SweepSpec
    folder: str  # absolute; may hold submitit's %j
    python: str  # the step's interpreter, a shell word (submitit's ``python``)
    parameters: dict[str, Any]  # SlurmExecutor.update_parameters(**parameters)
    srun_args: list[str] = field(default_factory=list)
    prefix: list[str] = field(default_factory=list)

    def command(self, python: str | None = None, folder: str | None = None) -> str:
        """The step's shell command, reading its pickle from ``folder``."""
        words = [*map(shlex.quote, self.prefix), python or self.python]
        return " ".join([*words, "-u", "-m", STEP, "run", shlex.quote(folder or self.folder)])

    def body(self, params: Mapping[str, Any], command: str, folder: str) -> Body:
        """The batch script's body: the step under ``python -m slurmkit.runtime.fnjob
        supervise`` (srun, unless ``use_srun=False`` runs it in the batch shell)."""
        q = shlex.quote
        use_srun = params.get("use_srun", True)
        if not use_srun and self.spec.container is not None:
            raise UserError(
                "use_srun=False runs the function in the batch shell, outside the container",
                key="use_srun",
                hint="keep use_srun=True for container jobs",
            )
        step = _srun(params, folder) if use_srun else []
        config = json.dumps(supervise_config(self, params, folder), separators=(",", ":"))
        task = ['"$PY"', "-m", STEP, "supervise", "--config", q(config), "--", *map(q, step)]
        preamble = [
            "# slurmkit: the step runs under its supervisor (requeue contract, budgets)",
            f"export {ENV_SIGNAL}={self.spec.requeue.signal}",
            *(f"export {name}={q(value)}" for name, value in self.spec.env.items()),
        ]
        return Body(preamble, " ".join([*task, command]), quoted=bool(self.prefix))


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
    import yaml

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
        requeue=Policy(**{**asdict(policy), "enabled": policy.enabled is True, "lead": lead}),
        env_runtime=dict(s.spec.env_runtime),
        workdir=s.spec.workdir,
        folder=folder,
        tasks=_tasks(params) if params.get("use_srun", True) else 1,
    ).to_dict()


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

    return {
        "name": s.spec.name,
        "folder": s.folder,
        "python": s.python,
        "parameters": dict(s.parameters),
        "sbatch": requeue_options(s.spec.requeue),
        "srun": _srun(s.parameters, s.folder),
        "command": [*s.prefix, *shlex.split(s.python), "-u", "-m", STEP, "run", s.folder],
        "supervise": supervise_config(s, s.parameters, s.folder),
    }


# --- the executors ----------------------------------------------------------------------------


# --- the executors ----------------------------------------------------------------------------


def _poll(jobs: set[str]) -> dict[tuple[str, int], str]:
    """The Slurm state of the tasks of ``jobs``: from slurmkit's poll cache (one ``squeue`` for
    every caller of this user on this node), else one query; sacct for those gone from it."""
    from .backends import pollcache
    from .backends import slurm as sk

    every = pollcache.interval()
    if every:
        name = sk.user()
        cache = pollcache.PollCache(name, every)
        answer = cache.tasks(jobs, lambda: sk.user_tasks(name), sk.ended)
    else:
        answer = sk.query(jobs)
    return {key: state.state for key, state in answer.items()}


@functools.cache
def _spec_job() -> type[Any]:
    from .submitit_adapter import job_class

    cls = job_class(_poll)
    cls.__module__, cls.__qualname__ = __name__, "SpecJob"  # pickled jobs find it here
    return cls


def __getattr__(name: str) -> Any:
    from . import submitit_adapter

    if name == "SpecJob":
        return _spec_job()
    if name == "SpecExecutor":
        return submitit_adapter.executor_class()
    if name == "LocalSpecExecutor":
        return submitit_adapter.local_class()
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
    from .submitit_adapter import executor_class, local_class

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
    if chosen.runs_here:
        if backend == "auto":
            _note(
                f"{choosing.why or 'no Slurm cluster answers'}: submitit's LocalExecutor runs "
                "the jobs on this machine"
            )
        return _local(s, local_class())
    chosen.check(spec, 1)
    slurm: submitit.SlurmExecutor = executor_class()(s, job_class=_spec_job())
    return slurm
