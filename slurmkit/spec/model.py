"""The validated spec: dataclasses and the names of their keys (what :mod:`.validate` checks)."""

from __future__ import annotations

from dataclasses import asdict, field, fields
from typing import TYPE_CHECKING, Any

from ..core.record import record
from ..core.search import Search
from ..core.values import Choice, Distribution, format_value
from . import keys

if TYPE_CHECKING:
    from ..pyxis import Container

CLI = "command line"  # the "file" of errors in command-line overrides

CAUSES = keys.CAUSES  # of requeues, each with its budget
# The keys each block allows, in the order its "allowed keys" hint names them: see keys.KEYS.
TOP_KEYS = keys.names("")
RESOURCE_KEYS = keys.names("resources")
REQUEUE_KEYS = keys.names("requeue")
LOGS_KEYS = keys.names("logs")
TORCHRUN_KEYS = keys.names("torchrun")  # torchrun's own options (launcher: torchrun)
DATA_KEYS = keys.names("data")
CONTAINER_KEYS = keys.names("container")
# The srun options a spec may set (`srun: {mpi: pmix, label: true}`): True renders a flag.
SRUN_OPTIONS: dict[str, type] = {
    k.name: {"bool": bool, "positive": int}.get(k.kind, str) for k in keys.below("srun")
}
# Keys that `slurmkit sweep --resume DIR KEY=VALUE` may change (the trials stay as they are).
RESUMABLE = tuple(k.path for k in keys.KEYS if k.resumable)
_D = {k.path: k.default for k in keys.KEYS}  # each key's default, from the table

Domain = Any  # a fixed value, a Choice, or a Distribution


@record
class Resources:
    """What every trial asks Slurm for (per array task)."""

    partition: str | None = None
    time: str | None = None
    nodes: int = _D["resources.nodes"]
    cpus: int | None = None  # None: not asked for, so not rendered (srun steps inherit it)
    gpus: int | str | None = None
    mem: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    extra: dict[str, str | int | bool] = field(default_factory=dict)
    tasks_per_node: int = _D["resources.tasks_per_node"]
    exclusive: bool = _D["resources.exclusive"]
    switches: str | None = None

    @property
    def gpu_count(self) -> int:
        """GPUs per node as a number (``h100:8`` -> 8)."""
        return int(str(self.gpus).rsplit(":", 1)[-1]) if self.gpus else 0


@record
class Requeue:
    """How a trial survives preemption, time limits, node failures and its own errors.

    ``budgets`` counts requeues per cause; ``None`` is unlimited.
    """

    enabled: bool | str = _D["requeue.enabled"]  # True, False or LEFT_TO_CLUSTER
    signal: str = _D["requeue.signal"]
    lead: int = _D["requeue.lead"]
    budgets: dict[str, int | None] = field(default_factory=lambda: dict(keys.BUDGETS))
    exclude_after: int = _D["requeue.exclude_after"]
    node_fault: dict[str, Any] = field(default_factory=dict)  # {patterns, exit_codes}
    hang_timeout: int | None = None  # seconds; None: auto, 0: off (runtime.hang)


@record
class Logs:
    """Where output goes. ``name``: Slurm's own log of each array task, ``SWEEP_DIR/logs/NAME
    .out`` (sbatch's tokens: LOG_TOKENS); ``stderr``: ``merged`` into the output, or
    ``separate`` (the trial's ``output.err`` beside ``output.log``, Slurm's ``NAME.err``)."""

    name: str = _D["logs.name"]
    stderr: str = _D["logs.stderr"]


@record
class DataEntry:
    """A dataset of the ``data`` block: staged from ``src`` (an fsspec URL or a path) to ``dst``
    on the shared filesystem once, before the trials start; with ``cache: node`` each node also
    copies it to ``cache_dir`` (default ``$TMPDIR``). Trials find it in ``SLURMKIT_DATA_<NAME>``
    (``name`` upper-cased)."""

    src: str
    dst: str
    name: str
    cache: str = _D["data.cache"]
    cache_dir: str | None = None


@record
class SweepSpec:
    """A validated sweep."""

    name: str
    command: tuple[str, ...]
    params: dict[str, Domain]
    resources: Resources = field(default_factory=Resources)
    args: str = _D["args"]
    num_samples: int = _D["num_samples"]
    seed: int = _D["seed"]
    max_parallel: int | None = None
    output_root: str = _D["output_root"]
    env: dict[str, str] = field(default_factory=dict)
    # set only where the image (in a container) or the job's environment does not
    env_default: dict[str, str] = field(default_factory=dict)
    # path-like values joined with ':' before / after the task's own value (the image's)
    env_prepend: dict[str, str] = field(default_factory=dict)
    env_append: dict[str, str] = field(default_factory=dict)
    # values with {job_id}-style placeholders that the runtime fills in (core.placeholders)
    env_runtime: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    requeue: Requeue = field(default_factory=Requeue)
    container: Container | None = None
    launcher: str | None = None
    srun: dict[str, str | int | bool] = field(default_factory=dict)  # options of the step
    profile: str | None = None
    self_check: bool = _D["self_check"]
    logs: Logs = field(default_factory=Logs)
    torchrun: dict[str, int] = field(default_factory=dict)  # e.g. nproc_per_node
    data: tuple[DataEntry, ...] = ()  # datasets staged before the trials start (slurmkit.data)
    # attribution ({team: nlp}): kept in sweep.json for `slurmkit report --by label`
    labels: dict[str, str] = field(default_factory=dict)
    search: Search | None = None  # early stopping (core/search.py)
    source: str = CLI
    params_text: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict that :func:`slurmkit.spec.from_dict` reads back to an equal spec.

        Parameters keep the form they were written in (``range(0,10000)`` stays short).
        """
        data = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("source", "params_text", "params")
        }
        data.update(
            command=list(self.command),
            resources=asdict(self.resources),
            env=dict(self.env),
            env_default=dict(self.env_default),
            env_prepend=dict(self.env_prepend),
            env_append=dict(self.env_append),
            env_runtime=dict(self.env_runtime),
            requeue=asdict(self.requeue),
            logs=asdict(self.logs),
            torchrun=dict(self.torchrun),
            data=[asdict(d) for d in self.data],
            labels=dict(self.labels),
            container=self.container.to_dict() if self.container else None,
            search=self.search.to_dict() if self.search else None,
        )
        data["params"] = {k: self.params_text.get(k, _written(v)) for k, v in self.params.items()}
        return data


def _written(domain: Domain) -> Any:
    """A YAML form that parses back to ``domain`` (for parameters set from Python)."""
    if isinstance(domain, Distribution):
        return format_value(domain)
    return list(domain.values) if isinstance(domain, Choice) else [domain]
