"""Validation: plain data (the merged layers) -> a :class:`~.model.SweepSpec`, or a SpecError that
names the file, the key and what is allowed.

Each key's kind, default, allowed values and words live in :data:`.keys.KEYS` and are checked by
:mod:`.check`; what is here is what one key's table entry cannot say: the search space, the
command line, values checked against other keys (``num_samples`` and the random parameters,
``requeue.lead`` and ``resources.time``, ...), and the entries of maps (``env``, ``labels``).

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
from ..core.values import Choice, Distribution, OverrideError
from ..errors import SpecError, reject_unknown
from ..overrides import parse_value
from .check import entries, error, fits, mapping, misshapen, read, typed
from .keys import KEY, KEYS, SLURM_WORD
from .model import (
    DATA_KEYS,
    SRUN_OPTIONS,
    TOP_KEYS,
    DataEntry,
    Domain,
    Logs,
    Resources,
    SweepSpec,
)
from .requeueblock import requeue_block
from .searchblock import search_block

ALIASES = {k.name: k.alias for k in KEYS if k.alias}  # resources keys: alias -> key
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
    name = read(data, "name", source, default=os.path.splitext(os.path.basename(source))[0])
    command = _command(data.get("command"), source)
    args = read(data, "args", source)
    params, num_samples = _search(data, source, job)
    seed = read(data, "seed", source)
    max_parallel = read(data, "max_parallel", source)
    output_root = read(data, "output_root", source)
    workdir = read(data, "workdir", source)
    resources = _resources(data, source)
    env, env_default, env_prepend, env_append, env_runtime = _envs(data, source)
    launcher = read(data, "launcher", source)
    torchrun = _torchrun(data, launcher, source)
    if launcher == "srun" and resources.tasks_per_node == 1 and resources.gpu_count > 1:
        # one task per GPU: the allocation must hold them (else srun says "More processors
        # requested than permitted")
        resources = dataclasses.replace(resources, tasks_per_node=resources.gpu_count)
    container = data.get("container")
    if container is not None:
        from .. import pyxis  # ~3 ms (its regexes, hashlib): only container specs need it

        container = pyxis.parse(mapping(data, "container", source), source)
    profile = typed(data, "profile", source)  # its values: layers.profile
    srun = _srun(data, source)
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
        env_default=env_default,
        env_prepend=env_prepend,
        env_append=env_append,
        env_runtime=env_runtime,
        container=container,
        launcher=launcher,
        torchrun=torchrun,
        srun=srun,
        profile=profile,
        self_check=read(data, "self_check", source),
        workdir=workdir,
        source=source,
        params_text=dict(params_text or {}),
        requeue=requeue_block(data, source, resources.time),
        logs=_logs(data, source),
        data=_data(data, source),
        labels=_labels(data, resources, source),
        search=search_block(data, source),
    )


def _search(data: Mapping[str, Any], source: str, job: bool) -> tuple[dict[str, Domain], int]:
    """``params`` (a space already: :func:`param_space`) and ``num_samples``, which must draw
    from a random parameter."""
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
    num_samples = read(data, "num_samples", source)
    if num_samples > 1 and not any(isinstance(d, Distribution) for d in params.values()):
        raise SpecError(
            "num_samples > 1 needs a random parameter",
            file=source,
            key="num_samples",
            hint="use uniform(a,b), loguniform(a,b) or randint(a,b) in params",
        )
    return params, num_samples


def _torchrun(data: Mapping[str, Any], launcher: Any, source: str) -> dict[str, int]:
    """torchrun's own options: ``nproc_per_node`` (workers per node) when it is not the GPUs
    or tasks per node (a script that asks Slurm for no GPUs and passes --nproc_per_node=8)."""
    raw = data.get("torchrun")
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return {}
    if isinstance(raw, Mapping) and launcher != "torchrun":
        raise SpecError(
            "only for launcher: torchrun",
            file=source,
            key="torchrun",
            hint="set launcher: torchrun",
        )
    nproc = read(mapping(data, "torchrun", source), "torchrun.nproc_per_node", source)
    return {"nproc_per_node": nproc} if nproc is not None else {}


def _labels(data: Mapping[str, Any], resources: Resources, source: str) -> dict[str, str]:
    """``labels``: names to short texts ({team: nlp}), kept in sweep.json; the sweep's jobs
    then carry the job comment ``slurmkit:SWEEP_DIR`` (so no comment of the spec's own)."""
    hint = KEY["labels"].example
    out: dict[str, str] = {}
    for name, text, where in entries(data, "labels", source):
        if isinstance(text, (bool, float)) or not isinstance(text, (str, int)):
            raise SpecError(f"must be a text, got {text!r}", file=source, key=where, hint=hint)
        out[name] = str(text)
        if not out[name] or len(out[name]) > 200 or not out[name].isprintable():
            raise SpecError(
                "must be 1 to 200 printable characters", file=source, key=where, hint=hint
            )
    if out and "comment" in resources.extra:
        raise SpecError(
            "slurmkit puts the sweep directory in the job comment of a sweep with labels",
            file=source,
            key="resources.extra.comment",
            hint="leave out the comment: `slurmkit report --by label` attributes the sweep",
        )
    return out


def _data(data: Mapping[str, Any], source: str) -> tuple[DataEntry, ...]:
    """``data``: datasets staged to the shared filesystem before the trials start."""
    raw = data.get("data")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise misshapen("data", raw, source)
    entries = [_data_entry(item, source, f"data.{i}.") for i, item in enumerate(raw)]
    for key, what in (("name", "env name"), ("dst", "destination")):
        seen: dict[str, int] = {}
        for i, entry in enumerate(entries):
            found = getattr(entry, key)
            found = found.upper() if key == "name" else found.rstrip("/")
            if found in seen:
                raise SpecError(
                    f"datasets {seen[found]} and {i} have the same {what} {found!r}",
                    file=source,
                    key=f"data.{i}.{key}",
                    hint="give each dataset its own name and dst",
                )
            seen[found] = i
    return tuple(entries)


def _data_entry(raw: Any, source: str, p: str) -> DataEntry:
    if not isinstance(raw, Mapping):
        raise SpecError(
            "must be a mapping", file=source, key=p[:-1], hint=f"keys: {', '.join(DATA_KEYS)}"
        )
    reject_unknown(raw, DATA_KEYS, file=source, prefix=p)
    src, dst = (_data_text(raw, key, source, p) for key in ("src", "dst"))
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
    cache = raw.get("cache", KEY["data.cache"].default)
    if not fits(KEY["data.cache"], cache):
        raise error("data.cache", cache, source, at=p + "cache")
    if paths["cache_dir"] is not None and cache != "node":
        raise SpecError("only with cache: node", file=source, key=p + "cache_dir")
    name = raw.get("name", re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(dst.rstrip("/")))[:64])
    if not isinstance(name, str) or not fits(KEY["data.name"], name):
        raise error("data.name", name, source, at=p + "name")
    return DataEntry(src, dst.rstrip("/"), name, cache, paths["cache_dir"])


def _data_text(raw: Mapping[str, Any], key: str, source: str, p: str) -> str:
    text: str = typed(raw, f"data.{key}", source, at=p + key)
    if any(ch in text for ch in "\n\r\0"):
        raise SpecError("may not hold a newline or NUL", file=source, key=p + key)
    return text


def _logs(data: Mapping[str, Any], source: str) -> Logs:
    raw = mapping(data, "logs", source)
    name = read(raw, "logs.name", source)
    if not re.search(r"(?<!%)(?:%%)*%[aj]", name):
        raise SpecError(
            f"{name!r} would give every array task the same file",
            file=source,
            key="logs.name",
            hint="put %a (array task id) or %j (job id) in it, e.g. '%x-%A_%a'",
        )
    return Logs(name, read(raw, "logs.stderr", source))


def _srun(data: Mapping[str, Any], source: str) -> dict[str, str | int | bool]:
    """The ``srun`` block (options of the job step, rendered as argv) with the ``mpi`` shorthand
    (``mpi: pmix`` is ``srun: {mpi: pmix}``)."""
    raw: Mapping[str, Any] = mapping(data, "srun", source)
    mpi = data.get("mpi")
    if mpi is not None:
        if "mpi" in raw and raw["mpi"] != mpi:
            raise SpecError("set twice, differently: mpi and srun.mpi", file=source, key="mpi")
        raw = {"mpi": mpi, **{k: v for k, v in raw.items() if k != "mpi"}}
    out: dict[str, str | int | bool] = {}
    for key, found in raw.items():
        kind = SRUN_OPTIONS[key]
        full = "mpi" if key == "mpi" and mpi is not None else f"srun.{key}"
        if kind is int:
            out[key] = typed(raw, f"srun.{key}", source)
            continue
        if not isinstance(found, kind) or (kind is str and isinstance(found, bool)):
            raise SpecError(
                f"expected {'true or false' if kind is bool else 'a string'}, got {found!r}",
                file=source,
                key=full,
            )
        if isinstance(found, str) and not fits(KEY[f"srun.{key}"], found):
            raise error(f"srun.{key}", found, source, at=full)
        if found is not False:
            out[key] = raw[key]
    return out


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


def _env_paths(data: Mapping[str, Any], key: str, source: str) -> dict[str, str]:
    """``env_prepend``/``env_append``: variable -> a path or a list of paths (joined with ':')."""
    out: dict[str, str] = {}
    for name, found, where in entries(data, key, source):
        parts = found if isinstance(found, list) else [found]
        if not parts or not all(isinstance(p, str) and p for p in parts):
            raise SpecError(
                f"must be a path or a list of paths, got {found!r}",
                file=source,
                key=where,
                hint="quote a value that YAML reads as a number or boolean",
            )
        if any(ch in p for p in parts for ch in "\n\r\0"):
            raise SpecError("a path may not hold a newline or NUL", file=source, key=where)
        out[name] = ":".join(parts)
    return out


def _env_runtime(data: Mapping[str, Any], source: str) -> dict[str, str]:
    """``env_runtime``: variable -> text whose placeholders the runtime fills in."""
    from ..core import placeholders

    out: dict[str, str] = {}
    for name, found, where in entries(data, "env_runtime", source):
        if not isinstance(found, str):
            raise SpecError(f"must be a string, got {found!r}", file=source, key=where)
        why = placeholders.problem(found)
        if why:
            raise SpecError(
                why,
                file=source,
                key=where,
                hint="placeholders: " + ", ".join(f"{{{p}}}" for p in placeholders.PLACEHOLDERS),
            )
        out[name] = found
    return out


def _envs(
    data: Mapping[str, Any], source: str
) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, str], dict[str, str]]:
    """``env``, ``env_default``, ``env_prepend``, ``env_append``, ``env_runtime``; a name set
    in two of env, env_default and env_runtime is refused."""
    env = _env(data, source)
    env_default = _env(data, source, "env_default")
    for name in env_default.keys() & env.keys():
        raise SpecError(
            f"{name} is set in env as well",
            file=source,
            key=f"env_default.{name}",
            hint="env forces a value (over the image's); env_default gives one only where "
            "nothing else does: set each variable in one of them",
        )
    env_prepend = _env_paths(data, "env_prepend", source)
    env_append = _env_paths(data, "env_append", source)
    env_runtime = _env_runtime(data, source)
    for block, names in (("env_default", env_default), ("env", env)):
        for name in env_runtime.keys() & names.keys():
            raise SpecError(
                f"{name} is set in {block} as well",
                file=source,
                key=f"env_runtime.{name}",
                hint=f"set each variable in one of {block} (as written) and env_runtime "
                "(filled in)",
            )
    return env, env_default, env_prepend, env_append, env_runtime


def _env(data: Mapping[str, Any], source: str, block: str = "env") -> dict[str, str]:
    """``env`` (or ``env_default``): names to byte-exact values."""
    env: dict[str, str] = {}
    given: dict[str, Any] = {}  # each name's key in raw: true and 'True' both name True
    for key, found in mapping(data, block, source).items():
        name = str(key)
        if not fits(KEY[block], name):
            raise error(block, key, source, at=f"{block}.{key}")
        if name in given:
            raise SpecError(
                f"the keys {given[name]!r} and {key!r} both name {name}",
                file=source,
                key=f"{block}.{name}",
                hint="quote a name that YAML reads as a boolean or null: 'TRUE': ...",
            )
        if isinstance(found, (dict, list)) or found is None:
            raise SpecError("must be a string or number", file=source, key=f"{block}.{key}")
        if isinstance(found, float):
            raise SpecError(
                f"{found!r} is a float: the job would see {str(found)!r}, not the text written",
                file=source,
                key=f"{block}.{name}",
                hint=f"quote it: {name}: '{found!r}'",
            )
        given[name] = key
        env[name] = str(found).lower() if isinstance(found, bool) else str(found)
    return env


def _resources(data: Mapping[str, Any], source: str) -> Resources:
    if data.get("resources") is None:
        return Resources()
    raw = canonical(mapping(data, "resources", source), source)
    words = {
        k: read(raw, f"resources.{k}", source)
        for k in ("partition", "account", "qos", "constraint", "switches")
    }
    time = raw.get("time")
    if time is not None:
        time = str(time) if isinstance(time, int) and not isinstance(time, bool) else time
        if not isinstance(time, str):
            raise SpecError(
                f"expected a Slurm time string, got {time!r}",
                file=source,
                key="resources.time",
                hint=f"accepted forms: {slurmtime.ACCEPTED}",
            )
        try:
            slurmtime.parse_seconds(time)
        except ValueError as exc:
            raise SpecError(
                str(exc),
                file=source,
                key="resources.time",
                hint=f"accepted forms: {slurmtime.ACCEPTED}; e.g. 2:00:00",
            ) from None
    mem = read(raw, "resources.mem", source)
    gpus = raw.get("gpus")
    if gpus is not None and (
        isinstance(gpus, bool)
        or not isinstance(gpus, (int, str))
        or not fits(KEY["resources.gpus"], gpus)
    ):
        raise error("resources.gpus", gpus, source)
    return Resources(
        time=time,
        mem=mem,
        gpus=gpus or None,
        nodes=read(raw, "resources.nodes", source),
        cpus=read(raw, "resources.cpus", source),
        tasks_per_node=read(raw, "resources.tasks_per_node", source),
        exclusive=read(raw, "resources.exclusive", source),
        extra=_extra(raw, source),
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


def _extra(raw: Mapping[str, Any], source: str) -> dict[str, str | int | bool]:
    extra: dict[str, str | int | bool] = {}
    given: dict[str, Any] = {}  # each option's key in raw: comment and --comment are one option
    for written, found in mapping(raw, "resources.extra", source).items():
        key = str(written).lstrip("-")
        full = f"resources.extra.{key}"
        if not fits(KEY["resources.extra"], str(written)):
            raise error("resources.extra", key, source, at=full)
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
        if isinstance(found, (dict, list)) or found is None:
            raise SpecError("must be a string, number or true/false", file=source, key=full)
        if not isinstance(found, bool) and not re.fullmatch(SLURM_WORD, str(found)):
            raise SpecError(
                f"{found!r} has characters slurmkit will not put in a batch script",
                file=source,
                key=full,
                hint="no whitespace, quotes or '$'",
            )
        extra[key] = found
    return extra
