"""Validation: plain data (the merged layers) -> a :class:`~.model.SweepSpec`, or a SpecError that
names the file, the key and what is allowed.

The search space lives under ``params``. A YAML list is a grid of literal values; a string is
read with Hydra's override grammar (``0.1,0.01``, ``range(1,5)``, ``choice(a,b)``, or our
``uniform``/``loguniform``/``randint`` for random search); any other scalar is a fixed value;
nested mappings become dotted keys (``optim: {lr: ...}`` is ``optim.lr``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Mapping
from typing import Any

from ..core import slurmtime
from ..core.contract import DEFAULT_SIGNAL, SIGNALS
from ..core.jobcontract import DEFAULT_LEAD
from ..core.values import Choice, Distribution, OverrideError
from ..errors import SpecError, reject_unknown
from ..overrides import MAX_SWEEP_SIZE, parse_value
from .model import (
    ARG_STYLES,
    CAUSES,
    DATA_CACHE,
    DATA_KEYS,
    LAUNCHERS,
    LOG_STDERR,
    LOG_TOKENS,
    LOGS_KEYS,
    REQUEUE_KEYS,
    RESOURCE_KEYS,
    SRUN_OPTIONS,
    TOP_KEYS,
    TORCHRUN_KEYS,
    DataEntry,
    Domain,
    Logs,
    Requeue,
    Resources,
    SweepSpec,
)

ALIASES = {"cpus_per_task": "cpus", "gpus_per_node": "gpus"}  # resources keys: alias -> key
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:|&!*()\[\]+=@/-]+$")
_MEM = re.compile(r"^\d+([KMGT]B?)?$", re.IGNORECASE)  # Slurm: 16G, 16GB, 16384, 512m
_GPUS = re.compile(r"^(\d+|[A-Za-z0-9_.-]+:\d+)$")
_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Options slurmkit renders itself: setting them through `extra` would break the sweep.
_RESERVED = {"array", "output", "error", "open-mode", "job-name", "parsable", "wrap", "chdir"}


def single(domain: Domain) -> Domain:
    """A sweep of exactly one value is that fixed value."""
    return domain.values[0] if isinstance(domain, Choice) and len(domain.values) == 1 else domain


def param_space(
    raw: Any, source: str, texts: dict[str, Any], prefix: str = "params"
) -> dict[str, Domain]:
    """Flatten ``params`` into ``{dotted_key: domain}``; ``texts`` gets each one as written."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError("must be a mapping of parameter names to values", file=source, key=prefix)
    space: dict[str, Domain] = {}
    owners: dict[str, str] = {}  # each parameter's key in raw: "a.b" and "a" both set a.b
    for key, value in raw.items():
        key = str(key)
        full = f"{prefix}.{key}"
        if not key or key.startswith(".") or key.endswith("."):
            raise SpecError("empty parameter name", file=source, key=full)
        entries: dict[str, tuple[Domain, Any]] = {}  # what key sets: parameter -> (domain, text)
        if isinstance(value, Mapping):
            sub_texts: dict[str, Any] = {}
            for sub, dom in param_space(value, source, sub_texts, full).items():
                entries[f"{key}.{sub}"] = dom, sub_texts[sub]
        elif isinstance(value, list):
            entries[key] = single(Choice(tuple(value))), value
        elif isinstance(value, str):
            try:
                entries[key] = single(parse_value(value)), value
            except OverrideError as exc:
                raise SpecError(
                    f"cannot read {value!r}: {exc.message} (column {exc.column})",
                    file=source,
                    key=full,
                    hint="quote a literal string inside the YAML string: \"'text'\", "
                    "or put it in a list: [text]",
                ) from None
        else:
            entries[key] = value, value
        for name, (dom, text) in entries.items():
            if name in space:
                raise SpecError(
                    f"the keys {owners[name]!r} and {key!r} both set {prefix}.{name}",
                    file=source,
                    key=f"{prefix}.{name}",
                    hint="write each parameter once, as a dotted key or nested",
                )
            space[name], texts[name], owners[name] = dom, text, key
    return space


def validate(
    data: Mapping[str, Any],
    source: str,
    params_text: dict[str, Any] | None = None,
    *,
    job: bool = False,
) -> SweepSpec:
    """Check every key and type; raise SpecError naming the file and key."""
    reject_unknown(data, TOP_KEYS, file=source)
    name = _typed(data, "name", str, source, default=os.path.splitext(os.path.basename(source))[0])
    if not _NAME.match(name):
        raise SpecError(
            f"{name!r} is not a valid name",
            file=source,
            key="name",
            hint="letters, digits, '_', '.', '-'; starting with a letter or digit",
        )
    command = _command(data.get("command"), source)
    args = _typed(data, "args", str, source, default="hydra")
    if args not in ARG_STYLES:
        raise SpecError(
            f"{args!r} is not allowed",
            file=source,
            key="args",
            hint=f"allowed values: {', '.join(ARG_STYLES)}",
        )
    params: dict[str, Domain] = data.get("params") or {}
    if not params and not job:
        raise SpecError(
            "empty search space: no parameters",
            file=source,
            key="params",
            hint="add at least one parameter, e.g. params: {lr: [0.1, 0.01]}",
        )
    for key, dom in params.items():
        if isinstance(dom, Choice) and not dom.values:
            raise SpecError("empty search space: no values", file=source, key=f"params.{key}")
    num_samples = _positive(data, "num_samples", source, default=1)
    if num_samples > MAX_SWEEP_SIZE:
        raise SpecError(
            f"must be at most {MAX_SWEEP_SIZE:,}, got {num_samples:,}",
            file=source,
            key="num_samples",
            hint="split the search into sweeps of fewer samples (each with its own seed)",
        )
    if num_samples > 1 and not any(isinstance(d, Distribution) for d in params.values()):
        raise SpecError(
            "num_samples > 1 needs a random parameter",
            file=source,
            key="num_samples",
            hint="use uniform(a,b), loguniform(a,b) or randint(a,b) in params",
        )
    seed = _typed(data, "seed", int, source, default=0)
    max_parallel = data.get("max_parallel")
    if max_parallel is not None:
        max_parallel = _positive(data, "max_parallel", source, default=None)
    output_root = _typed(data, "output_root", str, source, default="runs")
    if not output_root or re.search(r"[\s\"'%\\]", output_root):
        raise SpecError(
            f"{output_root!r} is not a usable directory",
            file=source,
            key="output_root",
            hint="a path without whitespace, quotes, '%' or backslashes",
        )
    workdir = data.get("workdir")
    if workdir is not None:
        workdir = _typed(data, "workdir", str, source, default=None)
    resources = _resources(data.get("resources"), source)
    env = _env(data.get("env"), source)
    env_prepend = _env_paths(data.get("env_prepend"), "env_prepend", source)
    env_append = _env_paths(data.get("env_append"), "env_append", source)
    env_runtime = _env_runtime(data.get("env_runtime"), source)
    for name in env_runtime.keys() & env.keys():
        raise SpecError(
            f"{name} is set in env as well",
            file=source,
            key=f"env_runtime.{name}",
            hint="set each variable in one of env (as written) and env_runtime (filled in)",
        )
    launcher = data.get("launcher")
    if launcher is not None and launcher not in LAUNCHERS:
        raise SpecError(
            f"{launcher!r} is not allowed",
            file=source,
            key="launcher",
            hint=f"allowed values: {', '.join(LAUNCHERS)} (or leave it out)",
        )
    torchrun = _torchrun(data.get("torchrun"), launcher, source)
    if launcher == "srun" and resources.tasks_per_node == 1 and resources.gpu_count > 1:
        # one task per GPU: the allocation must hold them (else srun says "More processors
        # requested than permitted")
        resources = dataclasses.replace(resources, tasks_per_node=resources.gpu_count)
    container = data.get("container")
    if container is not None and not isinstance(container, Mapping):
        raise SpecError(
            f"must be a mapping, got {type(container).__name__} {container!r}",
            file=source,
            key="container",
            hint="container: {image: nvcr.io/nvidia/pytorch:24.01-py3}",
        )
    if container is not None:
        from .. import pyxis  # ~3 ms (its regexes, hashlib): only container specs need it

        container = pyxis.parse(container, source)
    profile = _typed(data, "profile", str, source, default=None)
    srun = _srun(data.get("srun"), data.get("mpi"), source)
    return SweepSpec(
        name=name,
        command=command,
        params=dict(params),
        args=args,
        num_samples=num_samples,
        seed=seed,
        max_parallel=max_parallel,
        output_root=output_root,
        resources=resources,
        env=env,
        env_prepend=env_prepend,
        env_append=env_append,
        env_runtime=env_runtime,
        container=container,
        launcher=launcher,
        torchrun=torchrun,
        srun=srun,
        profile=profile,
        self_check=_typed(data, "self_check", bool, source, default=True),
        workdir=workdir,
        source=source,
        params_text=dict(params_text or {}),
        requeue=_requeue(data.get("requeue"), source, resources.time),
        logs=_logs(data.get("logs"), source),
        data=_data(data.get("data"), source),
        labels=_labels(data.get("labels"), resources, source),
    )


def _torchrun(raw: Any, launcher: Any, source: str) -> dict[str, int]:
    """torchrun's own options: ``nproc_per_node`` (workers per node) when it is not the GPUs
    or tasks per node (a script that asks Slurm for no GPUs and passes --nproc_per_node=8)."""
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(
            "must be a mapping", file=source, key="torchrun", hint="{nproc_per_node: 8}"
        )
    if launcher != "torchrun":
        raise SpecError(
            "only for launcher: torchrun",
            file=source,
            key="torchrun",
            hint="set launcher: torchrun",
        )
    reject_unknown(raw, TORCHRUN_KEYS, file=source, prefix="torchrun.")
    nproc = _positive(raw, "nproc_per_node", source, default=None, prefix="torchrun.")
    return {"nproc_per_node": nproc} if nproc is not None else {}


_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")  # a Prometheus label name too


def _labels(raw: Any, resources: Resources, source: str) -> dict[str, str]:
    """``labels``: names to short texts ({team: nlp}), kept in sweep.json; the sweep's jobs
    then carry the job comment ``slurmkit:SWEEP_DIR`` (so no comment of the spec's own)."""
    hint = "labels: {team: nlp, project: llm}"
    out: dict[str, str] = {}
    for name, value in _mapping(raw, "labels", "label names to texts", source, hint).items():
        where = f"labels.{name}"
        if not isinstance(name, str) or not _LABEL.match(name):
            raise SpecError(
                "not a label name",
                file=source,
                key=where,
                hint="letters, digits and '_', not starting with a digit (at most 63)",
            )
        if isinstance(value, (bool, float)) or not isinstance(value, (str, int)):
            raise SpecError(f"must be a text, got {value!r}", file=source, key=where, hint=hint)
        text = str(value)
        if not text or len(text) > 200 or not text.isprintable():
            raise SpecError(
                "must be 1 to 200 printable characters", file=source, key=where, hint=hint
            )
        out[name] = text
    if out and "comment" in resources.extra:
        raise SpecError(
            "slurmkit puts the sweep directory in the job comment of a sweep with labels",
            file=source,
            key="resources.extra.comment",
            hint="leave out the comment: `slurmkit report --by label` attributes the sweep",
        )
    return out


_DATA_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")  # SLURMKIT_DATA_<NAME upper-cased>


def _data(raw: Any, source: str) -> tuple[DataEntry, ...]:
    """``data``: datasets staged to the shared filesystem before the trials start."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SpecError(
            "must be a list of datasets",
            file=source,
            key="data",
            hint="data: [{src: s3://bucket/ds, dst: /mnt/data/ds, cache: node}]",
        )
    entries = [_data_entry(item, source, f"data.{i}.") for i, item in enumerate(raw)]
    for key, what in (("name", "env name"), ("dst", "destination")):
        seen: dict[str, int] = {}
        for i, entry in enumerate(entries):
            value = getattr(entry, key)
            value = value.upper() if key == "name" else value.rstrip("/")
            if value in seen:
                raise SpecError(
                    f"datasets {seen[value]} and {i} have the same {what} {value!r}",
                    file=source,
                    key=f"data.{i}.{key}",
                    hint="give each dataset its own name and dst",
                )
            seen[value] = i
    return tuple(entries)


def _data_entry(raw: Any, source: str, p: str) -> DataEntry:
    if not isinstance(raw, Mapping):
        raise SpecError(
            "must be a mapping", file=source, key=p[:-1], hint=f"keys: {', '.join(DATA_KEYS)}"
        )
    reject_unknown(raw, DATA_KEYS, file=source, prefix=p)
    src, dst = _data_text(raw, "src", source, p), _data_text(raw, "dst", source, p)
    from .. import stage  # the URL rules of `slurmkit stage` (only specs with data load them)
    from ..errors import UserError

    try:
        stage.source_protocol(src)
    except UserError as exc:
        raise SpecError(exc.message, file=source, key=p + "src", hint=exc.hint) from None
    if stage.public(src) != src:
        raise SpecError(
            "holds a user, password, query or fragment: credentials stay out of specs",
            file=source,
            key=p + "src",
            hint="credentials come from AWS's chain (AWS_PROFILE, ~/.aws, the environment)",
        )
    paths = {"dst": dst, "cache_dir": raw.get("cache_dir")}
    for key, path in paths.items():
        if path is not None and (not isinstance(path, str) or not os.path.isabs(path)):
            raise SpecError(
                f"must be an absolute path, got {path!r}",
                file=source,
                key=p + key,
                hint="dst on the shared filesystem (/mnt/data/ds); cache_dir on the node "
                "(/var/nvme/storage)",
            )
    if dst.strip("/") == "":
        raise SpecError("must name a directory to create (not /)", file=source, key=p + "dst")
    cache = raw.get("cache", "none")
    if cache not in DATA_CACHE:
        raise SpecError(
            f"{cache!r} is not allowed",
            file=source,
            key=p + "cache",
            hint=f"allowed values: {', '.join(DATA_CACHE)}",
        )
    if paths["cache_dir"] is not None and cache != "node":
        raise SpecError("only with cache: node", file=source, key=p + "cache_dir")
    default = re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(dst.rstrip("/")))[:64]
    name = raw.get("name", default)
    if not isinstance(name, str) or not _DATA_NAME.match(name):
        raise SpecError(
            f"{name!r} cannot name an environment variable",
            file=source,
            key=p + "name",
            hint="letters, digits and '_' (it becomes SLURMKIT_DATA_<NAME>, upper-cased)",
        )
    return DataEntry(src, dst.rstrip("/"), name, cache, paths["cache_dir"])


def _data_text(raw: Mapping[str, Any], key: str, source: str, p: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise SpecError(
            f"required: a string, got {value!r}",
            file=source,
            key=p + key,
            hint="src: s3://bucket/ds (or gs://, https://, a path); dst: /mnt/data/ds",
        )
    if any(ch in value for ch in "\n\r\0"):
        raise SpecError("may not hold a newline or NUL", file=source, key=p + key)
    return value


_LOG_NAME = re.compile(r"^(?:[A-Za-z0-9_.-]|%[%Aajxu])+$")


def _logs(raw: Any, source: str) -> Logs:
    if raw is None:
        return Logs()
    if not isinstance(raw, Mapping):
        raise SpecError(
            "must be a mapping", file=source, key="logs", hint="logs: {name: '%x-%A_%a'}"
        )
    reject_unknown(raw, LOGS_KEYS, file=source, prefix="logs.")
    name = _typed(raw, "name", str, source, default="%A_%a", prefix="logs.")
    tokens = ", ".join(f"%{t} ({what})" for t, what in LOG_TOKENS.items())
    if len(name) > 200 or not _LOG_NAME.match(name) or name.startswith("."):
        raise SpecError(
            f"{name!r} is not a log file name slurmkit can find again",
            file=source,
            key="logs.name",
            hint=f"letters, digits, '_', '.', '-' and the tokens {tokens}, %% for '%'; "
            "no '/': the logs stay in the sweep directory",
        )
    if not re.search(r"(?<!%)(?:%%)*%[aj]", name):
        raise SpecError(
            f"{name!r} would give every array task the same file",
            file=source,
            key="logs.name",
            hint="put %a (array task id) or %j (job id) in it, e.g. '%x-%A_%a'",
        )
    stderr = _typed(raw, "stderr", str, source, default="merged", prefix="logs.")
    if stderr not in LOG_STDERR:
        raise SpecError(
            f"{stderr!r} is not a way to keep stderr",
            file=source,
            key="logs.stderr",
            hint=f"allowed values: {', '.join(LOG_STDERR)}",
        )
    return Logs(name, stderr)


def _srun(raw: Any, mpi: Any, source: str) -> dict[str, str | int | bool]:
    """The ``srun`` block (options of the job step, rendered as argv) with the ``mpi`` shorthand
    (``mpi: pmix`` is ``srun: {mpi: pmix}``)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SpecError(
            "must be a mapping of srun options",
            file=source,
            key="srun",
            hint="srun: {mpi: pmix, label: true, cpu_bind: cores}",
        )
    reject_unknown(raw, tuple(SRUN_OPTIONS), file=source, prefix="srun.")
    if mpi is not None:
        if "mpi" in raw and raw["mpi"] != mpi:
            raise SpecError("set twice, differently: mpi and srun.mpi", file=source, key="mpi")
        raw = {"mpi": mpi, **{k: v for k, v in raw.items() if k != "mpi"}}
    out: dict[str, str | int | bool] = {}
    options: dict[str, Any] = dict(raw)
    for key, value in options.items():
        kind = SRUN_OPTIONS[key]
        full = "mpi" if key == "mpi" and mpi is not None else f"srun.{key}"
        if kind is int:
            out[key] = _positive(raw, key, source, default=None, prefix="srun.")
            continue
        if not isinstance(value, kind) or (kind is str and isinstance(value, bool)):
            raise SpecError(
                f"expected {'true or false' if kind is bool else 'a string'}, got {value!r}",
                file=source,
                key=full,
            )
        if isinstance(value, str) and not _SLURM_WORD.match(value):
            raise SpecError(
                f"{value!r} has characters srun does not accept here",
                file=source,
                key=full,
                hint="no whitespace, quotes or '$'",
            )
        if value is not False:
            out[key] = options[key]
    return out


def _typed(
    data: Mapping[str, Any], key: str, kind: type, source: str, *, default: Any, prefix: str = ""
) -> Any:
    value = data.get(key, default)
    if value is None:
        return default
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise SpecError(
            f"expected {kind.__name__}, got {type(value).__name__} {value!r}",
            file=source,
            key=prefix + key,
        )
    return value


def _positive(
    data: Mapping[str, Any], key: str, source: str, *, default: Any, prefix: str = ""
) -> Any:
    value = _typed(data, key, int, source, default=default, prefix=prefix)
    if value is not None and value < 1:
        raise SpecError(f"must be at least 1, got {value}", file=source, key=prefix + key)
    return value


def _command(raw: Any, source: str) -> tuple[str, ...]:
    if isinstance(raw, str):
        try:
            argv = shlex.split(raw)
        except ValueError as exc:
            raise SpecError(f"cannot split: {exc}", file=source, key="command") from None
    elif isinstance(raw, list) and all(isinstance(a, (str, int, float)) for a in raw):
        if any(isinstance(a, bool) for a in raw):
            raise SpecError(
                "an item is a YAML boolean (true/false/yes/no)",
                file=source,
                key="command",
                hint="quote it: ['true']",
            )
        argv = [str(a) for a in raw]
    else:
        raise SpecError(
            "required: the trial's program and arguments (a string or a list)",
            file=source,
            key="command",
            hint="command: python train.py --epochs 3",
        )
    if not argv:
        raise SpecError("is empty", file=source, key="command")
    return tuple(argv)


def _mapping(raw: Any, key: str, what: str, source: str, hint: str) -> Mapping[Any, Any]:
    """``raw`` when it is a mapping, ``{}`` when it is not given; else an error naming ``key``."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"must be a mapping of {what}", file=source, key=key, hint=hint)
    return raw


def _env_paths(raw: Any, key: str, source: str) -> dict[str, str]:
    """``env_prepend``/``env_append``: variable -> a path or a list of paths (joined with ':')."""
    hint = f"{key}: {{LD_LIBRARY_PATH: /opt/hpcx/lib}} (or a list of paths)"
    out: dict[str, str] = {}
    for name, value in _mapping(raw, key, "variable names to paths", source, hint).items():
        where = f"{key}.{name}"
        if not isinstance(name, str) or not _ENV.match(name):
            raise SpecError("not a valid environment variable name", file=source, key=where)
        parts = value if isinstance(value, list) else [value]
        if not parts or not all(isinstance(p, str) and p for p in parts):
            raise SpecError(
                f"must be a path or a list of paths, got {value!r}",
                file=source,
                key=where,
                hint="quote a value that YAML reads as a number or boolean",
            )
        if any(ch in p for p in parts for ch in "\n\r\0"):
            raise SpecError("a path may not hold a newline or NUL", file=source, key=where)
        out[name] = ":".join(parts)
    return out


def _env_runtime(raw: Any, source: str) -> dict[str, str]:
    """``env_runtime``: variable -> text whose placeholders the runtime fills in."""
    from ..core import placeholders

    hint = "env_runtime: {TMPDIR: '/scratch/{job_id}'}"
    out: dict[str, str] = {}
    for name, value in _mapping(
        raw, "env_runtime", "variable names to values", source, hint
    ).items():
        where = f"env_runtime.{name}"
        if not isinstance(name, str) or not _ENV.match(name):
            raise SpecError("not a valid environment variable name", file=source, key=where)
        if not isinstance(value, str):
            raise SpecError(f"must be a string, got {value!r}", file=source, key=where)
        why = placeholders.problem(value)
        if why:
            raise SpecError(
                why,
                file=source,
                key=where,
                hint="placeholders: " + ", ".join(f"{{{p}}}" for p in placeholders.PLACEHOLDERS),
            )
        out[name] = value
    return out


def _env(raw: Any, source: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError("must be a mapping of variable names to values", file=source, key="env")
    env: dict[str, str] = {}
    given: dict[str, Any] = {}  # each name's key in raw: true and 'True' both name True
    for key, value in raw.items():
        name = str(key)
        if not _ENV.match(name):
            raise SpecError("not a valid environment variable name", file=source, key=f"env.{key}")
        if name in given:
            raise SpecError(
                f"the keys {given[name]!r} and {key!r} both name {name}",
                file=source,
                key=f"env.{name}",
                hint="quote a name that YAML reads as a boolean or null: 'TRUE': ...",
            )
        if isinstance(value, (dict, list)) or value is None:
            raise SpecError("must be a string or number", file=source, key=f"env.{key}")
        if isinstance(value, float):
            raise SpecError(
                f"{value!r} is a float: the job would see {str(value)!r}, not the text written",
                file=source,
                key=f"env.{name}",
                hint=f"quote it: {name}: '{value!r}'",
            )
        given[name] = key
        env[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def _resources(raw: Any, source: str) -> Resources:
    if raw is None:
        return Resources()
    if not isinstance(raw, Mapping):
        raise SpecError(
            "must be a mapping",
            file=source,
            key="resources",
            hint=f"allowed keys: {', '.join(RESOURCE_KEYS)}",
        )
    reject_unknown(raw, RESOURCE_KEYS, file=source, prefix="resources.")
    p = "resources."
    raw = canonical(raw, source)
    words = {}
    if isinstance(raw.get("switches"), int) and not isinstance(raw["switches"], bool):
        raw = {**raw, "switches": str(raw["switches"])}  # --switches=COUNT[@MAX_WAIT]
    for key in ("partition", "account", "qos", "constraint", "switches"):
        value = _typed(raw, key, str, source, default=None, prefix=p)
        if value is not None and not _SLURM_WORD.match(value):
            raise SpecError(
                f"{value!r} has characters Slurm does not accept here",
                file=source,
                key=p + key,
                hint="no whitespace or quotes",
            )
        words[key] = value
    time = raw.get("time")
    if time is not None:
        time = str(time) if isinstance(time, int) and not isinstance(time, bool) else time
        if not isinstance(time, str):
            raise SpecError(
                f"expected a Slurm time string, got {time!r}",
                file=source,
                key=p + "time",
                hint=f"accepted forms: {slurmtime.ACCEPTED}",
            )
        try:
            slurmtime.parse_seconds(time)
        except ValueError as exc:
            raise SpecError(
                str(exc),
                file=source,
                key=p + "time",
                hint=f"accepted forms: {slurmtime.ACCEPTED}; e.g. 2:00:00",
            ) from None
    mem = raw.get("mem")
    if mem is not None:
        mem = str(mem)
        if not _MEM.match(mem):
            raise SpecError(
                f"{mem!r} is not a memory size",
                file=source,
                key=p + "mem",
                hint="a number (megabytes) with a unit K, M, G or T (or KB..TB), e.g. 16G",
            )
    gpus = raw.get("gpus")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, (int, str)) or not _GPUS.match(str(gpus)):
            raise SpecError(
                f"{gpus!r} is not a GPU count",
                file=source,
                key=p + "gpus",
                hint="a count per node (8) or TYPE:COUNT (h100:8)",
            )
        if gpus == 0:
            gpus = None
    return Resources(
        time=time,
        mem=mem,
        gpus=gpus,
        nodes=_positive(raw, "nodes", source, default=1, prefix=p),
        cpus=_positive(raw, "cpus", source, default=None, prefix=p),
        tasks_per_node=_positive(raw, "tasks_per_node", source, default=1, prefix=p),
        exclusive=_typed(raw, "exclusive", bool, source, default=False, prefix=p),
        extra=_extra(raw.get("extra"), source),
        **words,
    )


def canonical(resources: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``resources`` with each alias (``cpus_per_task``) renamed to its key (``cpus``); SpecError
    when both are there (one would silently replace the other)."""
    for alias, key in ALIASES.items():
        if alias in resources and key in resources:
            raise SpecError(
                f"resources.{key} and resources.{alias} are the same setting",
                file=source,
                key=f"resources.{alias}",
                hint=f"keep one of them: {key}",
            )
    return {ALIASES.get(k, k): v for k, v in resources.items()}


def _extra(raw: Any, source: str) -> dict[str, str | int | bool]:
    options = _mapping(
        raw,
        "resources.extra",
        "sbatch option names to values",
        source,
        "extra: {exclusive: true, comment: run42}",
    )
    extra: dict[str, str | int | bool] = {}
    given: dict[str, Any] = {}  # each option's key in raw: comment and --comment are one option
    for written, value in options.items():
        key = str(written).lstrip("-")
        full = f"resources.extra.{key}"
        if not _OPTION.match(key):
            raise SpecError("not an sbatch long option name", file=source, key=full)
        if key in _RESERVED:
            raise SpecError("slurmkit sets this option itself", file=source, key=full)
        if key in given:
            raise SpecError(
                f"the keys {given[key]!r} and {written!r} are the same option",
                file=source,
                key=full,
                hint="keep one of them",
            )
        given[key] = written
        if isinstance(value, (dict, list)) or value is None:
            raise SpecError("must be a string, number or true/false", file=source, key=full)
        if not isinstance(value, bool) and not _SLURM_WORD.match(str(value)):
            raise SpecError(
                f"{value!r} has characters slurmkit will not put in a batch script",
                file=source,
                key=full,
                hint="no whitespace, quotes or '$'",
            )
        extra[key] = value
    return extra


def _requeue(raw: Any, source: str, time: str | None) -> Requeue:
    if raw is None:
        return Requeue()
    p = "requeue."
    if not isinstance(raw, Mapping):
        raise SpecError(
            "must be a mapping",
            file=source,
            key="requeue",
            hint=f"allowed keys: {', '.join(REQUEUE_KEYS)}",
        )
    reject_unknown(raw, REQUEUE_KEYS, file=source, prefix=p)
    enabled = _typed(raw, "enabled", bool, source, default=True, prefix=p)
    sig = str(_typed(raw, "signal", str, source, default=DEFAULT_SIGNAL, prefix=p)).upper()
    sig = sig[3:] if sig.startswith("SIG") else sig
    if sig not in SIGNALS:
        raise SpecError(
            f"{raw.get('signal')!r} is not allowed",
            file=source,
            key=p + "signal",
            hint=f"allowed values: {', '.join(SIGNALS)}",
        )
    lead = _positive(raw, "lead", source, default=DEFAULT_LEAD, prefix=p)
    limit = slurmtime.parse_seconds(time) if time else None
    if limit is not None and lead >= limit:
        raise SpecError(
            f"lead {lead} s is not shorter than the time limit ({time})",
            file=source,
            key=p + "lead",
            hint="the signal must come before the limit",
        )
    budgets = dict(Requeue().budgets)
    given = raw.get("budgets") or {}
    if not isinstance(given, Mapping):
        raise SpecError(
            "must be a mapping of cause to count",
            file=source,
            key=p + "budgets",
            hint=f"causes: {', '.join(CAUSES)}; null = unlimited",
        )
    for cause, count in given.items():
        if cause not in CAUSES:
            raise SpecError(
                f"unknown cause {cause!r}",
                file=source,
                key=f"{p}budgets.{cause}",
                hint=f"allowed causes: {', '.join(CAUSES)}",
            )
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 0
        ):
            raise SpecError(
                f"expected a count >= 0 or null, got {count!r}",
                file=source,
                key=f"{p}budgets.{cause}",
            )
        budgets[cause] = count
    return Requeue(enabled=enabled, signal=sig, lead=lead, budgets=budgets)
