"""A spec's layers, merged: built-in profile < user config < spec file < command-line overrides.

The user config is ``$SLURMKIT_CONFIG`` or ``~/.config/slurmkit/config.yaml``; its keys are spec
keys (``resources``, ``output_root``, ``container``, ``profile``, ``env``, ``requeue``), and the
``report`` section (``slurmkit report``'s prices), left out before the merge.

Files are read by :func:`.yamldata.read` on both paths. Layers of plain data are merged by
:mod:`.yamldata` (fast: no omegaconf import); anything else (``${...}`` interpolation, ``???``,
malformed YAML, merges that change a value's kind) by omegaconf, which gives the result or words
the error.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import yaml

from ..core.profiles import PROFILES
from ..core.values import Choice, Distribution, tokenize
from ..errors import SpecError, reject_unknown
from ..overrides import Override, OverrideError, parse_override
from . import yamldata
from .keys import KEYS
from .model import CLI, TOP_KEYS
from .validate import ALIASES, canonical

SECTIONS = ("report",)  # user-config sections that are no spec keys: never merged into specs
# The user config's keys: the spec keys it may set (keys.Key.config), and its sections.
CONFIG_KEYS = (*(k.path for k in KEYS if k.config), *SECTIONS)
_MAPPINGS = (*(k.path for k in KEYS if k.config and k.kind in ("block", "map")), *SECTIONS)
_OPENERS = ("BRACKET_OPEN", "BRACE_OPEN", "POPEN")
_CLOSERS = ("BRACKET_CLOSE", "BRACE_CLOSE", "PCLOSE")

Sources = list[tuple[str, Mapping[str, Any]]]
"""The layers a spec's values came from, lowest first, each with the file errors name: see
:func:`owner`."""
Resolved = tuple[dict[str, Any], list[Override], Sources]


def resolve(path: str, overrides: Sequence[str]) -> Resolved:
    """The spec's keys (``path`` over the user config and profile, overrides of keys other than
    ``params`` applied, interpolations resolved), the parsed overrides, and the layers' sources:
    the user config, the spec file, and the overrides (an override's bad value names the spec
    file: it is the spec's value that the override changes)."""
    try:
        return resolve_data(path, overrides)
    except yamldata.NeedsOmegaConf:
        return resolve_omegaconf(path, overrides)


def resolve_data(path: str, overrides: Sequence[str]) -> Resolved:
    """:func:`resolve` without omegaconf; NeedsOmegaConf when a layer is not plain data."""
    cfg = _canonical(yamldata.load(path), path)
    parsed = [parse_cli(text) for text in overrides]
    if isinstance(cfg.get("profile"), (dict, list)):
        raise yamldata.NeedsOmegaConf("profile")
    user, user_path, layers = _defaults(cfg, parsed, path)
    merged = yamldata.merge(*layers, user, cfg)
    _drop_container(merged, cfg, parsed)
    for ov in _settings(parsed):
        if ov.prefix == "~":
            yamldata.delete(merged, ov.key)
        else:
            yamldata.update(merged, ov.key, ov.value)
    return merged, parsed, [(user_path, user), (path, cfg), (path, _given(parsed))]


def resolve_omegaconf(path: str, overrides: Sequence[str]) -> Resolved:
    """:func:`resolve` with omegaconf."""
    # omegaconf (and antlr) cost ~60 ms to import: only specs that need it pay for it
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        data = yamldata.read(path)
    except yaml.YAMLError as exc:
        raise SpecError(f"malformed YAML: {exc}".replace("\n", " "), file=path) from None
    if not isinstance(data, dict | None):
        raise SpecError(
            "the top level must be a mapping of keys",
            file=path,
            hint=f"allowed keys: {', '.join(TOP_KEYS)}",
        )
    data = _canonical(data or {}, path)
    try:
        cfg = OmegaConf.create(data)
    except OmegaConfBaseException as exc:
        raise SpecError(str(exc).splitlines()[0], file=path) from None
    parsed = [parse_cli(text) for text in overrides]
    try:  # reading profile and container resolves them
        user, user_path, layers = _defaults(cfg, parsed, path)
        found = yamldata.clash(list(enumerate([*layers, user, data])))
        if found:
            raise SpecError(
                "a mapping in one layer and a list in another cannot be merged",
                file=path if found[0] == len(layers) + 1 else user_path,
                key=found[1],
                hint="the layers: built-in profile < user config < spec file",
            )
        merged = OmegaConf.merge(*map(OmegaConf.create, layers), OmegaConf.create(user), cfg)
        _drop_container(merged, cfg, parsed)
    except OmegaConfBaseException as exc:
        raise SpecError(f"cannot resolve: {str(exc).splitlines()[0]}", file=path) from None
    for ov in _settings(parsed):
        try:
            if ov.prefix == "~":
                parent, _, leaf = ov.key.rpartition(".")
                node: Any = OmegaConf.select(merged, parent) if parent else merged
                if not OmegaConf.is_dict(node) or leaf not in node:
                    raise SpecError("no such key to delete", file=CLI, key=ov.key)
                del node[leaf]
            else:
                OmegaConf.update(merged, ov.key, ov.value, force_add=True, merge=False)
        except OmegaConfBaseException as exc:
            raise SpecError(str(exc).splitlines()[0], file=CLI, key=ov.key) from None
        except (ValueError, TypeError):  # omegaconf's int() of a key on the way through a list
            raise SpecError(
                "a list on the way: its items are numbered",
                file=CLI,
                key=ov.key,
                hint="e.g. command.0=python",
            ) from None
    try:
        resolved: Any = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        raise SpecError(f"cannot resolve: {str(exc).splitlines()[0]}", file=path) from None
    return resolved, parsed, [(user_path, user), (path, data), (path, _given(parsed))]


def parse_cli(text: str) -> Override:
    """One command-line override, or a SpecError that shows where it cannot be read (or that it
    nests too deep, or sets an env value to a float)."""
    key, _, value = text.partition("=")
    keys = key.lstrip("~+").split(".")
    if len(keys) + _brackets(value) > yamldata.MAX_DEPTH:  # before the parser recurses
        raise yamldata.too_deep(CLI, keys)
    if "\0" in text:  # only the Python API can pass one (argv cannot)
        raise yamldata.holds_nul(CLI, keys)
    try:
        ov = parse_override(text)
    except OverrideError as exc:
        raise SpecError(
            f"cannot read {text!r}: {exc.message} (column {exc.column})",
            file=CLI,
            hint="overrides look like key=value, params.lr=0.1,0.01 or params.n='range(1,5)'",
        ) from None
    if keys[0] == "resources" and len(keys) == 2 and keys[1] in ALIASES:  # as in a layer
        ov = dataclasses.replace(ov, key=f"resources.{ALIASES[keys[1]]}")
    if keys[0] == "env" and isinstance(ov.value, float):
        value = value.strip()
        raise SpecError(
            f"{value} is a float: the job would see {str(ov.value)!r}",
            file=CLI,
            key=ov.key,
            hint=f"quote it: \"{ov.key}='{value}'\"",
        )
    return ov


def _brackets(value: str) -> int:
    """How deep the brackets of an override's value nest (0 when it cannot be read)."""
    try:
        tokens = tokenize(value, 0)
    except OverrideError:  # parse_override says why
        return 0
    depth = deepest = 0
    for token in tokens:
        if token.kind in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        elif token.kind in _CLOSERS:
            depth -= 1
    return deepest


def user_config_path() -> str:
    return os.environ.get("SLURMKIT_CONFIG") or os.path.expanduser("~/.config/slurmkit/config.yaml")


def user_config() -> tuple[dict[str, Any], str]:
    """The user's spec defaults (``{}`` without a file) and the file's path, for messages;
    without the sections that are no spec keys (:func:`user_section`)."""
    data, where = _user_file()
    return _canonical({k: v for k, v in data.items() if k not in SECTIONS}, where), where


def user_section(name: str) -> tuple[dict[str, Any], str]:
    """A section of the user config that is no spec key (``report``; ``{}`` when it has none)
    and the file's path."""
    data, where = _user_file()
    return data.get(name) or {}, where


def _user_file() -> tuple[dict[str, Any], str]:
    """The user config as read (``{}`` without a file), its top level checked."""
    where = user_config_path()
    if not os.path.isfile(where):
        return {}, where
    try:
        data: Any = yamldata.load(where)
    except yamldata.NeedsOmegaConf:
        data = _user_config_omegaconf(where)
    if data is None:
        return {}, where
    if not isinstance(data, dict):
        raise SpecError(
            "the top level must be a mapping",
            file=where,
            hint=f"allowed keys: {', '.join(CONFIG_KEYS)}",
        )
    reject_unknown(data, CONFIG_KEYS, file=where)
    for key in _MAPPINGS:
        if not isinstance(data.get(key), dict | None):
            raise SpecError("must be a mapping", file=where, key=key)
    return data, where


def _user_config_omegaconf(where: str) -> Any:
    try:
        data = yamldata.read(where)
    except yaml.YAMLError as exc:
        raise SpecError(f"malformed: {str(exc).splitlines()[0]}", file=where) from None
    if not isinstance(data, dict):
        return data  # user_config() words the error
    # see resolve_omegaconf: imported only for a user config that needs it
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True)
    except OmegaConfBaseException as exc:
        raise SpecError(f"malformed: {str(exc).splitlines()[0]}", file=where) from None


def profile(name: str, source: str) -> dict[str, Any]:
    """The spec layer of a built-in profile: its environment, and SUNK's container habits."""
    if name == "none":
        return {}
    if name not in PROFILES:
        raise SpecError(
            f"unknown profile {name!r}",
            file=source,
            key="profile",
            hint=f"allowed values: none, {', '.join(PROFILES)}",
        )
    return {"env": dict(PROFILES[name]), "container": {"mount_home": False}}


def _defaults(
    cfg: Any, parsed: list[Override], path: str
) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """The layers under the spec file ``cfg`` (read from ``path``): the user config (and its
    path), and the chosen profile's."""
    user, user_path = user_config()
    chosen, source = next(
        ((ov.value, CLI) for ov in parsed if ov.key == "profile" and ov.prefix != "~"),
        (cfg.get("profile"), path) if cfg.get("profile") else (user.get("profile"), user_path),
    )
    return user, user_path, [profile(str(chosen), source)] if chosen else []


def _given(parsed: Iterable[Override]) -> dict[str, Any]:
    """What the overrides ``parsed`` set, as a layer of :data:`Sources` (deletions set nothing)."""
    layer: dict[str, Any] = {}
    for ov in parsed:
        if ov.prefix == "~":
            continue
        *parents, leaf = ov.key.split(".")
        node = layer
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = ov.value
    return layer


def owner(key: str, sources: Sources) -> str | None:
    """The file of the last of ``sources`` that sets the dotted ``key`` (or else the nearest key
    above it that one sets): the layer an error about the merged value at ``key`` blames."""
    parts = key.split(".")
    for depth in range(len(parts), 0, -1):
        for file, layer in reversed(sources):
            if _holds(layer, parts[:depth]):
                return file
    return None


def _holds(node: Any, parts: Sequence[str]) -> bool:
    for part in parts:
        if not isinstance(node, Mapping):
            return False
        found = [value for name, value in node.items() if str(name) == part]
        if not found:
            return False
        node = found[0]
    return True


def _canonical(layer: dict[str, Any], file: str) -> dict[str, Any]:
    """A layer whose ``resources`` name no alias: a later layer's ``cpus`` replaces an earlier
    one's ``cpus_per_task``, as it would its ``cpus``."""
    if isinstance(layer.get("resources"), dict):
        layer["resources"] = canonical(layer["resources"], file)
    return layer


def _drop_container(merged: Any, cfg: Any, parsed: list[Override]) -> None:
    """Container defaults (profile, user config) apply only to specs that name an image."""
    container = merged.get("container")
    if "container" in merged and not (isinstance(container, Mapping) and container.get("image")):
        container_given = "container" in cfg or any(
            ov.key.startswith("container.") for ov in parsed
        )
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
