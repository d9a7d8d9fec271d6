"""Spec layers as Python data: what omegaconf makes of them, without importing omegaconf.

Specs, the user config and the overrides are loaded, merged and updated here when everything is
data omegaconf would not change: string keys; strings, ints, floats, booleans, nulls, lists and
mappings; no ``${`` interpolation and no ``???``; merges and updates that keep each value's kind
(mapping, list or scalar); well-formed UTF-8 YAML. Then the result is the one omegaconf gives.
Anything else raises :class:`NeedsOmegaConf`, and :mod:`slurmkit.spec.layers` lets omegaconf
decide (the result, or the error message). ``tests/test_yamldata.py`` checks both paths against
each other.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml


class NeedsOmegaConf(Exception):
    """The input needs omegaconf (to resolve it, or to word its error)."""


class Loader(yaml.SafeLoader):
    """omegaconf's YAML loader (``omegaconf._utils.get_yaml_loader``) without its pathlib tags:
    duplicate keys are an error, ``1e-5`` is a float, timestamps stay strings."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = set()
        for key_node, _ in node.value:
            if key_node.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                continue
            if key_node.value in keys:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key_node.value}",
                    key_node.start_mark,
                )
            keys.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        """^(?:
         [-+]?[0-9]+(?:_[0-9]+)*\\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
        |\\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\\.[0-9_]*
        |[-+]?\\.(?:inf|Inf|INF)
        |\\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)
Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in Loader.yaml_implicit_resolvers.items()
}


def load(path: str) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (``{}`` when empty), as ``OmegaConf.load`` +
    ``OmegaConf.to_container`` give it."""
    try:
        with open(os.path.abspath(path), encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=Loader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:  # omegaconf words the error
        raise NeedsOmegaConf(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise NeedsOmegaConf("not a mapping")
    return as_data(data)


def as_data(value: Any) -> Any:
    """A copy of ``value`` that shares nothing with it (YAML aliases do); NeedsOmegaConf when
    omegaconf would read it differently."""
    kind = type(value)
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise NeedsOmegaConf(f"key {key!r}")
            out[as_data(key)] = as_data(item)
        return out
    if kind is list:
        return [as_data(item) for item in value]
    if kind is str:
        if "${" in value or value == "???":
            raise NeedsOmegaConf(value)
        return value
    if value is None or kind in (int, float, bool):
        return value
    raise NeedsOmegaConf(kind.__name__)


def _kind(value: Any) -> type:
    return type(value) if type(value) in (dict, list) else object


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """``OmegaConf.merge(*layers)``: mappings merge key by key (later layers win, new keys come
    last); lists and scalars are replaced."""
    out: dict[str, Any] = {}
    for layer in layers:
        _merge_into(out, layer)
    return out


def _merge_into(dest: dict[str, Any], src: dict[str, Any]) -> None:
    for key, value in src.items():
        if key in dest and _kind(dest[key]) is not _kind(value):
            raise NeedsOmegaConf(f"{key}: a mapping, a list and a scalar merged into each other")
        if key in dest and type(value) is dict:
            _merge_into(dest[key], value)
        else:
            dest[key] = as_data(value)


def parent(cfg: dict[str, Any], key: str) -> tuple[dict[str, Any], str]:
    """The mapping that holds the dotted ``key``'s last part, and that part: missing or scalar
    mappings on the way become ``{}`` (NeedsOmegaConf for a list on the way)."""
    *parents, leaf = key.split(".")
    node = cfg
    for part in parents:
        child = node.get(part)
        if type(child) is list:
            raise NeedsOmegaConf(f"{key}: a list on the way")
        if type(child) is not dict:
            child = node[part] = {}
        node = child
    return node, leaf


def update(cfg: dict[str, Any], key: str, value: Any) -> None:
    """``OmegaConf.update(cfg, key, value, merge=False, force_add=True)``: a missing or scalar
    parent becomes ``{}``; the value replaces what was there."""
    node, leaf = parent(cfg, key)
    if leaf in node and _kind(node[leaf]) is not _kind(value):
        raise NeedsOmegaConf(f"{key}: a mapping, a list and a scalar set over each other")
    node[leaf] = as_data(value)


def delete(cfg: dict[str, Any], key: str) -> None:
    """``del`` the existing ``key`` (a dotted path through mappings)."""
    *parents, leaf = key.split(".")
    node: Any = cfg
    for part in parents:
        node = node.get(part)
        if type(node) is not dict:
            raise NeedsOmegaConf(f"{key}: no mapping on the way")
    if leaf not in node:
        raise NeedsOmegaConf(f"{key}: not there")
    del node[leaf]
