"""The job contract: what the login side writes for a job, as every in-job entry point reads it.

Two writers, one record: a sweep's ``sweep.json`` (its runtime part: the keys below, beside the
rest of the spec that a resume reads) and the function supervisor's ``--config`` JSON
(``executors.supervise_config``). :meth:`JobContract.from_dict` reads either; a key that is
missing takes its default here (directories written by an earlier slurmkit lack the newer keys),
and a value of the wrong type is a :class:`~slurmkit.core.fsutil.Damaged` naming the file and
the key (the runtime prints it and exits 2).

The requeue policy's defaults (signal, lead, budgets) are written here once: the spec's
``requeue`` block takes them from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, field, fields
from typing import Any

from .contract import DEFAULT_SIGNAL, LEFT_TO_CLUSTER, SIGNALS
from .fsutil import Damaged, read_json
from .record import record
from .search import Search

# Seconds between the requeue signal and the time limit (Slurm's --signal=B:SIG@LEAD).
DEFAULT_LEAD = 120
# Requeues allowed per cause; None is unlimited.
DEFAULT_BUDGETS: Mapping[str, int | None] = {
    "preemption": None,
    "timeout": 3,
    "node_failure": 3,
    "container": 0,
    "error": 0,
    "node": 3,  # a failure attributed to its node (runtime/nodefault.py)
    "hang": 3,  # the hang watchdog ended the attempt (runtime/hang.py)
}
# Attributed failures after which a node is excluded from the sweep (core/badnodes.py).
DEFAULT_EXCLUDE_AFTER = 2


def default_budgets() -> dict[str, int | None]:
    """A fresh copy of :data:`DEFAULT_BUDGETS`."""
    return dict(DEFAULT_BUDGETS)


@record
class Policy:
    """The requeue policy of a job (the spec's ``requeue`` block, as the job reads it)."""

    enabled: bool = True
    signal: str = DEFAULT_SIGNAL
    lead: int = DEFAULT_LEAD
    budgets: Mapping[str, int | None] = field(default_factory=default_budgets)
    exclude_after: int = DEFAULT_EXCLUDE_AFTER  # 0: exclude no node
    # the user's own node-fault signatures: {"patterns": [regex], "exit_codes": [int]}
    node_fault: Mapping[str, Any] = field(default_factory=dict)
    # seconds without progress that make a hang; None: auto (runtime.hang), 0: no watchdog
    hang_timeout: int | None = None


# A contract without a requeue block asks for no requeue (the runtime's reading since 0.1).
NO_REQUEUE = Policy(enabled=False)


@record
class JobContract:
    """What a job is told. The trial runtime reads ``command`` to ``search``; the function
    supervisor reads ``folder`` and ``tasks``; both read ``requeue``, ``env_runtime`` and
    ``workdir``."""

    requeue: Policy = NO_REQUEUE
    env_runtime: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    # a sweep's trials
    command: tuple[str, ...] = ()
    args: str = "hydra"
    env: Mapping[str, str] = field(default_factory=dict)
    env_default: Mapping[str, str] = field(default_factory=dict)  # where the job's env has none
    launch: Mapping[str, list[str]] = field(default_factory=dict)
    submit_dir: str | None = None
    data: tuple[Mapping[str, Any], ...] = ()
    container: bool = False  # the trial's step starts a container (its start can fail)
    stderr: str = "merged"  # logs.stderr: "separate" keeps the trial's stderr apart
    search: Search | None = None  # early stopping: given to the trial as SLURMKIT_SEARCH
    # a function job (submitit's folder and the step's task count)
    folder: str = ""
    tasks: int = 1

    @classmethod
    def from_dict(cls, raw: Any, source: str) -> JobContract:
        """The contract in ``raw`` (read from ``source``, named in errors)."""
        return _read(raw, source)

    @classmethod
    def read(cls, path: str) -> JobContract:
        """The contract in the JSON file ``path`` (``sweep.json``); Damaged when it is not one
        (missing included), OSError when it cannot be read."""
        return _read(read_json(path), path)

    def to_dict(self) -> dict[str, Any]:
        """As JSON, with the keys :meth:`from_dict` reads; those at their default are left out."""
        out: dict[str, Any] = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if value == _DEFAULT[name]:
                continue
            if name == "requeue":
                value = {**asdict(value), "budgets": dict(value.budgets)}
            elif name == "stderr":
                name, value = "logs", {"stderr": value}
            elif name == "search":
                value = value.to_dict()
            elif isinstance(value, tuple):  # command, data
                value = [v if isinstance(v, str) else dict(v) for v in value]
            elif isinstance(value, Mapping):
                value = {k: list(v) if isinstance(v, list) else v for k, v in value.items()}
            out[name] = value
        return out


_DEFAULT_CONTRACT = JobContract()
_FIELDS = tuple(f.name for f in fields(JobContract))
_DEFAULT = {name: getattr(_DEFAULT_CONTRACT, name) for name in _FIELDS}


def _typed(
    raw: Mapping[str, Any], key: str, kind: type, what: str, source: str, prefix: str = ""
) -> Any:
    """``raw[key]`` when it is a ``kind`` (a bool is no number), None when missing; Damaged
    otherwise."""
    value = raw.get(key)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    got = f"{type(value).__name__} {value!r}"
    raise Damaged(source, f"{prefix}{key}: expected {what}, got {got}")


def _strings(raw: Mapping[str, Any], key: str, source: str) -> dict[str, str] | None:
    value = _typed(raw, key, dict, "a mapping of names to strings", source)
    if value is not None and not all(isinstance(v, str) for v in value.values()):
        raise Damaged(source, f"{key}: expected a mapping of names to strings")
    return value


def _policy(raw: Any, source: str) -> Policy:
    if raw is None:
        return NO_REQUEUE
    if not isinstance(raw, dict):
        raise Damaged(source, f"requeue: expected a mapping, got {type(raw).__name__} {raw!r}")
    enabled = raw.get("enabled", True)
    if enabled == LEFT_TO_CLUSTER:  # the cluster may requeue; the runtime asks for none
        enabled = False
    if not isinstance(enabled, bool):
        raise Damaged(
            source,
            f"requeue.enabled: expected true or false (or {LEFT_TO_CLUSTER}), got {enabled!r}",
        )
    signal = _typed(raw, "signal", str, "a signal name", source, "requeue.") or DEFAULT_SIGNAL
    signal = signal.upper().removeprefix("SIG")
    if signal not in SIGNALS:
        raise Damaged(source, f"requeue.signal: {signal!r} is not one of {', '.join(SIGNALS)}")
    lead = _typed(raw, "lead", int, "seconds", source, "requeue.")
    budgets = _typed(raw, "budgets", dict, "a mapping of cause to count", source, "requeue.")
    if budgets is not None and not all(
        v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in budgets.values()
    ):
        raise Damaged(source, "requeue.budgets: expected counts (or null: unlimited)")
    after = _typed(raw, "exclude_after", int, "a count", source, "requeue.")
    hang_timeout = _typed(raw, "hang_timeout", int, "seconds", source, "requeue.")
    if hang_timeout is not None and hang_timeout < 0:
        raise Damaged(source, f"requeue.hang_timeout: expected seconds >= 0, got {hang_timeout}")
    return Policy(
        enabled=enabled,
        signal=signal,
        lead=DEFAULT_LEAD if lead is None else lead,
        budgets={**DEFAULT_BUDGETS, **(budgets or {})},
        exclude_after=DEFAULT_EXCLUDE_AFTER if after is None else after,
        node_fault=_node_fault(raw.get("node_fault"), source),
        hang_timeout=hang_timeout,
    )


def _node_fault(raw: Any, source: str) -> dict[str, Any]:
    """``requeue.node_fault``: ``patterns`` (strings) and ``exit_codes`` (integers)."""
    if not raw:
        return {}
    wrong = Damaged(source, "requeue.node_fault: expected {patterns: [str], exit_codes: [int]}")
    if not isinstance(raw, dict):
        raise wrong
    patterns, codes = raw.get("patterns") or [], raw.get("exit_codes") or []
    if not (
        isinstance(patterns, list)
        and isinstance(codes, list)
        and all(isinstance(p, str) for p in patterns)
        and all(isinstance(c, int) and not isinstance(c, bool) for c in codes)
    ):
        raise wrong
    return {"patterns": patterns, "exit_codes": codes}


def _read(raw: Any, source: str) -> JobContract:
    if raw is None:
        raise Damaged(source, "missing")
    if not isinstance(raw, dict):
        raise Damaged(source, f"not a JSON object but {type(raw).__name__}")
    command = _typed(raw, "command", list, "a list of arguments", source) or []
    launch = _typed(raw, "launch", dict, "a mapping of argument lists", source) or {}
    if not all(isinstance(a, str) for a in command) or not all(
        isinstance(v, list) and all(isinstance(a, str) for a in v) for v in launch.values()
    ):
        raise Damaged(source, "command and launch: expected lists of strings")
    data = _typed(raw, "data", list, "a list of datasets", source) or []
    if not all(isinstance(d, dict) for d in data):
        raise Damaged(source, "data: expected a list of mappings")
    logs = _typed(raw, "logs", dict, "a mapping", source) or {}
    tasks = _typed(raw, "tasks", int, "a task count", source)
    search = raw.get("search")
    return JobContract(
        requeue=_policy(raw.get("requeue"), source),
        env_runtime=_strings(raw, "env_runtime", source) or {},
        workdir=_typed(raw, "workdir", str, "a path", source),
        command=tuple(command),
        args=_typed(raw, "args", str, "hydra, argparse or none", source) or "hydra",
        env=_strings(raw, "env", source) or {},
        env_default=_strings(raw, "env_default", source) or {},
        launch=launch,
        submit_dir=_typed(raw, "submit_dir", str, "a path", source),
        data=tuple(data),
        container=bool(raw.get("container")),
        stderr=str(logs.get("stderr") or "merged"),
        search=None if search is None else Search.from_dict(search, source),
        folder=_typed(raw, "folder", str, "a path", source) or "",
        tasks=1 if tasks is None else tasks,
    )
