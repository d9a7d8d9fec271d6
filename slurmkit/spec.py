"""Sweep specs: YAML file + Hydra-style overrides -> validated dataclasses.

The search space lives under ``params``. A YAML list is a grid of literal values; a string is
read with Hydra's override grammar (``0.1,0.01``, ``range(1,5)``, ``choice(a,b)``, or our
``uniform``/``loguniform``/``randint`` for random search); any other scalar is a fixed value;
nested mappings become dotted keys (``optim: {lr: ...}`` is ``optim.lr``).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterator, Mapping, Sequence

from .core import slurmtime
from .errors import SpecError
from .overrides import (Distribution, Override, OverrideError, Choice, format_value, parse_override,
                        parse_value)

ARG_STYLES = ("hydra", "argparse", "none")
TOP_KEYS = ("name", "command", "args", "params", "num_samples", "seed", "resources",
            "max_parallel", "output_root", "env", "workdir", "requeue", "container", "launcher",
            "profile", "self_check")
LAUNCHERS = ("torchrun", "srun")
REQUEUE_KEYS = ("enabled", "signal", "lead", "budgets")
CAUSES = ("preemption", "timeout", "node_failure", "error")
# Signals a trial may be asked to checkpoint with (USR1 is left to NCCL-based stacks by default).
SIGNALS = ("USR2", "USR1", "URG", "HUP", "INT", "ALRM", "PWR", "XCPU")
RESOURCE_KEYS = ("partition", "time", "nodes", "cpus", "gpus", "mem", "account", "qos",
                 "constraint", "extra", "tasks_per_node", "exclusive", "switches",
                 "cpus_per_task", "gpus_per_node")
_ALIASES = {"cpus_per_task": "cpus", "gpus_per_node": "gpus"}
CLI = "command line"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:|&!*()\[\]+=@/-]+$")
_MEM = re.compile(r"^\d+[KMGT]?$")
_GPUS = re.compile(r"^(\d+|[A-Za-z0-9_.-]+:\d+)$")
_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Options slurmkit renders itself: setting them through `extra` would break the sweep.
_RESERVED = {"array", "output", "error", "open-mode", "job-name", "parsable", "wrap", "chdir"}

Domain = Any  # a fixed value, a Choice, or a Distribution


@dataclass(frozen=True)
class Resources:
    """What every trial asks Slurm for (per array task)."""

    partition: str | None = None
    time: str | None = None
    nodes: int = 1
    cpus: int = 1
    gpus: int | str | None = None
    mem: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    extra: dict[str, str | int | bool] = field(default_factory=dict)
    tasks_per_node: int = 1
    exclusive: bool = False
    switches: str | None = None

    @property
    def gpu_count(self) -> int:
        """GPUs per node as a number (``h100:8`` -> 8)."""
        return int(str(self.gpus).rsplit(":", 1)[-1]) if self.gpus else 0

    def sbatch_options(self) -> list[str]:
        """``--key=value`` options, in a stable order (values are validated: no whitespace)."""
        opts = []
        for key, flag in (("partition", "partition"), ("time", "time"), ("nodes", "nodes"),
                          ("cpus", "cpus-per-task"), ("gpus", "gpus-per-node"), ("mem", "mem"),
                          ("account", "account"), ("qos", "qos"), ("constraint", "constraint"),
                          ("switches", "switches")):
            value = getattr(self, key)
            if value is not None:
                opts.append(f"--{flag}={value}")
        if self.tasks_per_node > 1:
            opts.append(f"--ntasks-per-node={self.tasks_per_node}")
        if self.exclusive:
            opts.append("--exclusive")
        for key, value in self.extra.items():
            if value is True:
                opts.append(f"--{key}")
            elif value is not False:
                opts.append(f"--{key}={value}")
        return opts


@dataclass(frozen=True)
class Requeue:
    """How a trial survives preemption, time limits, node failures and its own errors.

    ``budgets`` counts requeues per cause; ``None`` is unlimited.
    """

    enabled: bool = True
    signal: str = "USR2"
    lead: int = 120
    budgets: dict[str, int | None] = field(default_factory=lambda: {
        "preemption": None, "timeout": 3, "node_failure": 3, "error": 0})

    def sbatch_options(self) -> list[str]:
        return ["--requeue", f"--signal=B:{self.signal}@{self.lead}"] if self.enabled \
            else ["--no-requeue"]


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep."""

    name: str
    command: tuple[str, ...]
    params: dict[str, Domain]
    resources: Resources = field(default_factory=Resources)
    args: str = "hydra"
    num_samples: int = 1
    seed: int = 0
    max_parallel: int | None = None
    output_root: str = "runs"
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    requeue: Requeue = field(default_factory=Requeue)
    container: dict[str, Any] | None = None
    launcher: str | None = None
    profile: str | None = None
    self_check: bool = True
    source: str = CLI
    params_text: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict that :func:`from_dict` reads back to an equal spec.

        Parameters keep the form they were written in (``range(0,10000)`` stays short).
        """
        data = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("source", "params_text", "params")}
        data.update(command=list(self.command), resources=asdict(self.resources),
                    env=dict(self.env), requeue=asdict(self.requeue))
        data["params"] = {k: self.params_text.get(k, _written(v)) for k, v in self.params.items()}
        return data


def _written(domain: Domain) -> Any:
    """A YAML form that parses back to ``domain`` (for parameters set from Python)."""
    if isinstance(domain, Distribution):
        return f"{domain.name}({format_value(domain.low)}, {format_value(domain.high)})"
    return list(domain.values) if isinstance(domain, Choice) else [domain]


def load(path: str, overrides: Sequence[str] = (), *, job: bool = False) -> SweepSpec:
    """Read ``path`` (YAML) over the profile and user config, apply Hydra-style ``overrides``
    and validate. A ``job`` may have no ``params`` (it is one trial)."""
    if not os.path.isfile(path):
        raise SpecError("no such file", file=path)
    try:
        data, parsed = _resolve_plain(path, overrides)
    except SpecError:
        raise  # a mistake the omegaconf path would report the same way
    except Exception:  # not plain data, or malformed: omegaconf gives the result or the message
        data, parsed = _resolve(path, overrides)
    texts: dict[str, Any] = {}
    params = _param_space(data.get("params"), path, texts)
    for ov, text in zip(parsed, overrides):
        if ov.key.split(".")[0] != "params":
            continue
        sub = ov.key[len("params."):]
        if not sub:
            raise SpecError("name a parameter: params.NAME=VALUES", file=CLI, key=ov.key)
        if ov.prefix == "~":
            if sub not in params:
                raise SpecError("no such parameter to delete", file=CLI, key=ov.key)
            del params[sub]
            texts.pop(sub, None)
        else:
            params[sub] = _single(ov.value)
            texts[sub] = text.split("=", 1)[1]
    data["params"] = params
    return validate(data, path, texts, job=job)


def _resolve(path: str, overrides: Sequence[str]) -> tuple[dict[str, Any], list[Override]]:
    """The spec's keys (``path`` over the user config and profile, overrides of keys other than
    ``params`` applied, interpolations resolved) with omegaconf, and the parsed overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        raise SpecError(f"malformed YAML: {exc}".replace("\n", " "), file=path) from None
    except OmegaConfBaseException as exc:
        raise SpecError(str(exc).splitlines()[0], file=path) from None
    if not OmegaConf.is_dict(cfg):
        raise SpecError("the top level must be a mapping of keys", file=path,
                        hint=f"allowed keys: {', '.join(TOP_KEYS)}")
    parsed = [_parse_cli(text) for text in overrides]
    user, layers = _defaults(cfg, parsed)
    merged = OmegaConf.merge(*map(OmegaConf.create, layers), OmegaConf.create(user), cfg)
    _drop_container(merged, cfg, parsed)
    for ov in _settings(parsed):
        try:
            if ov.prefix == "~":
                _delete(merged, ov.key)
            else:
                OmegaConf.update(merged, ov.key, ov.value, force_add=True, merge=False)
        except OmegaConfBaseException as exc:
            raise SpecError(str(exc).splitlines()[0], file=CLI, key=ov.key) from None
    try:
        return OmegaConf.to_container(merged, resolve=True), parsed
    except OmegaConfBaseException as exc:
        raise SpecError(f"cannot resolve: {str(exc).splitlines()[0]}", file=path) from None


def _resolve_plain(path: str, overrides: Sequence[str]) -> tuple[dict[str, Any], list[Override]]:
    """What :func:`_resolve` returns, without omegaconf when every layer is plain data
    (:mod:`slurmkit.plainconf`); raises otherwise."""
    from . import plainconf

    cfg = plainconf.load(path)
    parsed = [_parse_cli(text) for text in overrides]
    if isinstance(cfg.get("profile"), (dict, list)):
        raise plainconf.NotPlain("profile")
    user, layers = _defaults(cfg, parsed)
    merged = plainconf.merge(*layers, user, cfg)
    _drop_container(merged, cfg, parsed)
    for ov in _settings(parsed):
        if ov.prefix == "~":
            plainconf.delete(merged, ov.key)
        else:
            plainconf.update(merged, ov.key, ov.value)
    return merged, parsed


def _defaults(cfg: Any, parsed: list[Override]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The layers under the spec file ``cfg``: the user config, and the chosen profile's."""
    from . import userconfig

    user, user_path = userconfig.load()
    chosen = next((ov.value for ov in parsed if ov.key == "profile" and ov.prefix != "~"),
                  cfg.get("profile") or user.get("profile"))
    return user, [userconfig.profile(str(chosen), user_path)] if chosen else []


def _drop_container(merged: Any, cfg: Any, parsed: list[Override]) -> None:
    """Container defaults (profile, user config) apply only to specs that name an image."""
    if "container" in merged and not (merged["container"] or {}).get("image"):
        container_given = "container" in cfg or any(ov.key.startswith("container.") for ov in parsed)
        if not container_given:
            del merged["container"]


def _settings(parsed: list[Override]) -> Iterator[Override]:
    """The overrides of keys other than ``params``, in order (they cannot be swept)."""
    for ov in parsed:
        if ov.key.split(".")[0] == "params":
            continue
        if isinstance(ov.value, (Choice, Distribution)):
            raise SpecError("only params.* can be swept", file=CLI, key=ov.key)
        yield ov


def from_dict(data: Mapping[str, Any], source: str) -> SweepSpec:
    """Validate a plain dict (as written by :meth:`SweepSpec.to_dict`)."""
    data = dict(data)
    texts: dict[str, Any] = {}
    data["params"] = _param_space(data.get("params"), source, texts)
    return validate(data, source, texts, job=True)


def _parse_cli(text: str) -> Override:
    try:
        return parse_override(text)
    except OverrideError as exc:
        raise SpecError(f"cannot read {text!r}: {exc.message} (column {exc.column})", file=CLI,
                        hint="overrides look like key=value, "
                        "params.lr=0.1,0.01 or params.n='range(1,5)'") from None


def _delete(cfg: Any, key: str) -> None:
    parent, _, leaf = key.rpartition(".")
    from omegaconf import OmegaConf
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if node is None or leaf not in node:
        raise SpecError("no such key to delete", file=CLI, key=key)
    del node[leaf]


def _single(domain: Domain) -> Domain:
    """A sweep of exactly one value is that fixed value."""
    return domain.values[0] if isinstance(domain, Choice) and len(domain.values) == 1 else domain


def _param_space(raw: Any, source: str, texts: dict[str, Any],
                 prefix: str = "params") -> dict[str, Domain]:
    """Flatten ``params`` into ``{dotted_key: domain}``; ``texts`` gets each one as written."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError("must be a mapping of parameter names to values", file=source, key=prefix)
    space: dict[str, Domain] = {}
    for key, value in raw.items():
        key = str(key)
        full = f"{prefix}.{key}"
        if not key or key.startswith(".") or key.endswith("."):
            raise SpecError("empty parameter name", file=source, key=full)
        if isinstance(value, Mapping):
            sub_texts: dict[str, Any] = {}
            for sub, dom in _param_space(value, source, sub_texts, full).items():
                space[f"{key}.{sub}"] = dom
                texts[f"{key}.{sub}"] = sub_texts[sub]
            continue
        elif isinstance(value, list):
            space[key] = _single(Choice(tuple(value)))
        elif isinstance(value, str):
            try:
                space[key] = _single(parse_value(value))
            except OverrideError as exc:
                raise SpecError(f"cannot read {value!r}: {exc.message} (column {exc.column})",
                                file=source, key=full,
                                hint="quote a literal string inside the YAML string: \"'text'\", "
                                "or put it in a list: [text]") from None
        else:
            space[key] = value
        texts[key] = value
    return space


def validate(data: Mapping[str, Any], source: str,
             params_text: dict[str, Any] | None = None, *, job: bool = False) -> SweepSpec:
    """Check every key and type; raise SpecError naming the file and key."""
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r}", file=source, key=unknown[0],
                        hint=f"allowed keys: {', '.join(TOP_KEYS)}")
    name = _typed(data, "name", str, source, default=os.path.splitext(os.path.basename(source))[0])
    if not _NAME.match(name):
        raise SpecError(f"{name!r} is not a valid name", file=source, key="name",
                        hint="letters, digits, '_', '.', '-'; starting with a letter or digit")
    command = _command(data.get("command"), source)
    args = _typed(data, "args", str, source, default="hydra")
    if args not in ARG_STYLES:
        raise SpecError(f"{args!r} is not allowed", file=source, key="args",
                        hint=f"allowed values: {', '.join(ARG_STYLES)}")
    params: dict[str, Domain] = data.get("params") or {}
    if not params and not job:
        raise SpecError("empty search space: no parameters", file=source, key="params",
                        hint="add at least one parameter, e.g. params: {lr: [0.1, 0.01]}")
    for key, dom in params.items():
        if isinstance(dom, Choice) and not dom.values:
            raise SpecError("empty search space: no values", file=source, key=f"params.{key}")
    num_samples = _positive(data, "num_samples", source, default=1)
    if num_samples > 1 and not any(isinstance(d, Distribution) for d in params.values()):
        raise SpecError("num_samples > 1 needs a random parameter", file=source, key="num_samples",
                        hint="use uniform(a,b), loguniform(a,b) or randint(a,b) in params")
    seed = _typed(data, "seed", int, source, default=0)
    max_parallel = data.get("max_parallel")
    if max_parallel is not None:
        max_parallel = _positive(data, "max_parallel", source, default=None)
    output_root = _typed(data, "output_root", str, source, default="runs")
    if not output_root or re.search(r"[\s\"'%\\]", output_root):
        raise SpecError(f"{output_root!r} is not a usable directory", file=source, key="output_root",
                        hint="a path without whitespace, quotes, '%' or backslashes")
    workdir = data.get("workdir")
    if workdir is not None:
        workdir = _typed(data, "workdir", str, source, default=None)
    resources = _resources(data.get("resources"), source)
    env = _env(data.get("env"), source)
    launcher = data.get("launcher")
    if launcher is not None and launcher not in LAUNCHERS:
        raise SpecError(f"{launcher!r} is not allowed", file=source, key="launcher",
                        hint=f"allowed values: {', '.join(LAUNCHERS)} (or leave it out)")
    container = data.get("container")
    if container is not None:
        from . import pyxis

        pyxis.container_options(container, submit_dir=data.get("workdir") or os.getcwd(),
                                env_names=env, source=source)
        container = dict(container)
    profile = _typed(data, "profile", str, source, default=None)
    return SweepSpec(
        name=name, command=command, params=dict(params), args=args, num_samples=num_samples,
        seed=seed, max_parallel=max_parallel, output_root=output_root,
        resources=resources, env=env, container=container, launcher=launcher, profile=profile,
        self_check=_typed(data, "self_check", bool, source, default=True),
        workdir=workdir, source=source, params_text=dict(params_text or {}),
        requeue=_requeue(data.get("requeue"), source, resources.time),
    )


def _typed(data: Mapping[str, Any], key: str, kind: type, source: str, *, default: Any,
           prefix: str = "") -> Any:
    value = data.get(key, default)
    if value is None:
        return default
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise SpecError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}",
                        file=source, key=prefix + key)
    return value


def _positive(data: Mapping[str, Any], key: str, source: str, *, default: Any,
              prefix: str = "") -> Any:
    value = _typed(data, key, int, source, default=default, prefix=prefix)
    if value is not None and value < 1:
        raise SpecError(f"must be at least 1, got {value}", file=source, key=prefix + key)
    return value


def _command(raw: Any, source: str) -> tuple[str, ...]:
    import shlex

    if isinstance(raw, str):
        try:
            argv = shlex.split(raw)
        except ValueError as exc:
            raise SpecError(f"cannot split: {exc}", file=source, key="command") from None
    elif isinstance(raw, list) and all(isinstance(a, (str, int, float)) for a in raw):
        if any(isinstance(a, bool) for a in raw):
            raise SpecError("an item is a YAML boolean (true/false/yes/no)", file=source,
                            key="command", hint="quote it: ['true']")
        argv = [str(a) for a in raw]
    else:
        raise SpecError("required: the trial's program and arguments (a string or a list)",
                        file=source, key="command", hint="command: python train.py --epochs 3")
    if not argv:
        raise SpecError("is empty", file=source, key="command")
    return tuple(argv)


def _env(raw: Any, source: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError("must be a mapping of variable names to values", file=source, key="env")
    env = {}
    for key, value in raw.items():
        if not _ENV.match(str(key)):
            raise SpecError("not a valid environment variable name", file=source, key=f"env.{key}")
        if isinstance(value, (dict, list)) or value is None:
            raise SpecError("must be a string or number", file=source, key=f"env.{key}")
        env[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def _resources(raw: Any, source: str) -> Resources:
    if raw is None:
        return Resources()
    if not isinstance(raw, Mapping):
        raise SpecError("must be a mapping", file=source, key="resources",
                        hint=f"allowed keys: {', '.join(RESOURCE_KEYS)}")
    unknown = [k for k in raw if k not in RESOURCE_KEYS]
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r}", file=source, key=f"resources.{unknown[0]}",
                        hint=f"allowed keys: {', '.join(RESOURCE_KEYS)}")
    raw = {_ALIASES.get(k, k): v for k, v in raw.items()}
    p = "resources."
    words = {}
    for key in ("partition", "account", "qos", "constraint", "switches"):
        value = _typed(raw, key, str, source, default=None, prefix=p)
        if value is not None and not _SLURM_WORD.match(value):
            raise SpecError(f"{value!r} has characters Slurm does not accept here", file=source,
                            key=p + key, hint="no whitespace or quotes")
        words[key] = value
    time = raw.get("time")
    if time is not None:
        time = str(time) if isinstance(time, int) and not isinstance(time, bool) else time
        if not isinstance(time, str):
            raise SpecError(f"expected a Slurm time string, got {time!r}", file=source, key=p + "time",
                            hint=f"accepted forms: {slurmtime.ACCEPTED}")
        try:
            slurmtime.parse_seconds(time)
        except ValueError as exc:
            raise SpecError(str(exc), file=source, key=p + "time",
                            hint=f"accepted forms: {slurmtime.ACCEPTED}; e.g. 2:00:00") from None
    mem = raw.get("mem")
    if mem is not None:
        mem = str(mem)
        if not _MEM.match(mem):
            raise SpecError(f"{mem!r} is not a memory size", file=source, key=p + "mem",
                            hint="a number with an optional unit K, M, G or T, e.g. 16G")
    gpus = raw.get("gpus")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, (int, str)) or not _GPUS.match(str(gpus)):
            raise SpecError(f"{gpus!r} is not a GPU count", file=source, key=p + "gpus",
                            hint="a count per node (8) or TYPE:COUNT (h100:8)")
        if gpus == 0:
            gpus = None
    return Resources(
        time=time, mem=mem, gpus=gpus,
        nodes=_positive(raw, "nodes", source, default=1, prefix=p),
        cpus=_positive(raw, "cpus", source, default=1, prefix=p),
        tasks_per_node=_positive(raw, "tasks_per_node", source, default=1, prefix=p),
        exclusive=_typed(raw, "exclusive", bool, source, default=False, prefix=p),
        extra=_extra(raw.get("extra"), source), **words,
    )


def _extra(raw: Any, source: str) -> dict[str, str | int | bool]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError("must be a mapping of sbatch option names to values", file=source,
                        key="resources.extra", hint="extra: {exclusive: true, comment: run42}")
    extra: dict[str, str | int | bool] = {}
    for key, value in raw.items():
        key = str(key).lstrip("-")
        full = f"resources.extra.{key}"
        if not _OPTION.match(key):
            raise SpecError("not an sbatch long option name", file=source, key=full)
        if key in _RESERVED:
            raise SpecError("slurmkit sets this option itself", file=source, key=full)
        if isinstance(value, (dict, list)) or value is None:
            raise SpecError("must be a string, number or true/false", file=source, key=full)
        if not isinstance(value, bool) and not _SLURM_WORD.match(str(value)):
            raise SpecError(f"{value!r} has characters slurmkit will not put in a batch script",
                            file=source, key=full, hint="no whitespace, quotes or '$'")
        extra[key] = value
    return extra


RESUMABLE = ("resources", "max_parallel", "env", "requeue", "container", "self_check")


def resumed(config: Mapping[str, Any], overrides: Sequence[str], source: str) -> SweepSpec:
    """The spec of an existing sweep (``sweep.json``) with ``overrides`` of ``RESUMABLE`` keys."""
    data = copy.deepcopy({k: v for k, v in config.items() if k in TOP_KEYS})
    for text in overrides:
        ov = _parse_cli(text)
        parts = ov.key.split(".")
        if parts[0] not in RESUMABLE or isinstance(ov.value, (Choice, Distribution)):
            raise SpecError("cannot change this when resuming (the trials are fixed)", file=CLI,
                            key=ov.key, hint=f"keys that may change: {', '.join(RESUMABLE)}")
        node: dict[str, Any] = data
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if ov.prefix == "~":
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = ov.value
    return from_dict(data, source)


def _requeue(raw: Any, source: str, time: str | None) -> Requeue:
    if raw is None:
        return Requeue()
    p = "requeue."
    if not isinstance(raw, Mapping):
        raise SpecError("must be a mapping", file=source, key="requeue",
                        hint=f"allowed keys: {', '.join(REQUEUE_KEYS)}")
    unknown = [k for k in raw if k not in REQUEUE_KEYS]
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r}", file=source, key=p + str(unknown[0]),
                        hint=f"allowed keys: {', '.join(REQUEUE_KEYS)}")
    enabled = _typed(raw, "enabled", bool, source, default=True, prefix=p)
    sig = str(_typed(raw, "signal", str, source, default="USR2", prefix=p)).upper()
    sig = sig[3:] if sig.startswith("SIG") else sig
    if sig not in SIGNALS:
        raise SpecError(f"{raw.get('signal')!r} is not allowed", file=source, key=p + "signal",
                        hint=f"allowed values: {', '.join(SIGNALS)}")
    lead = _positive(raw, "lead", source, default=120, prefix=p)
    limit = slurmtime.parse_seconds(time) if time else None
    if limit is not None and lead >= limit:
        raise SpecError(f"lead {lead} s is not shorter than the time limit ({time})", file=source,
                        key=p + "lead", hint="the signal must come before the limit")
    budgets = dict(Requeue().budgets)
    given = raw.get("budgets") or {}
    if not isinstance(given, Mapping):
        raise SpecError("must be a mapping of cause to count", file=source, key=p + "budgets",
                        hint=f"causes: {', '.join(CAUSES)}; null = unlimited")
    for cause, count in given.items():
        if cause not in CAUSES:
            raise SpecError(f"unknown cause {cause!r}", file=source, key=f"{p}budgets.{cause}",
                            hint=f"allowed causes: {', '.join(CAUSES)}")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise SpecError(f"expected a count >= 0 or null, got {count!r}", file=source,
                            key=f"{p}budgets.{cause}")
        budgets[cause] = count
    return Requeue(enabled=enabled, signal=sig, lead=lead, budgets=budgets)
