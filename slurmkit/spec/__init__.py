"""Sweep and job specs: YAML file + Hydra-style overrides -> validated dataclasses.

:mod:`.layers` merges a spec's layers (profile < user config < file < overrides), :mod:`.validate`
checks the result into the dataclasses of :mod:`.model`, with each key's kind, default and
allowed values from the table of :mod:`.keys` (checked by :mod:`.check`; :mod:`.schema` turns the
table into JSON Schema and the README's key reference). An error in the result names the layer
that set the value at its key (:func:`.layers.owner`); a resumed sweep's, the command line unless
``sweep.json`` alone is invalid.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.values import Choice, Distribution
from ..errors import SpecError
from . import yamldata
from .layers import owner, parse_cli, resolve
from .model import CLI, RESUMABLE, TOP_KEYS, Requeue, Resources, SweepSpec
from .validate import param_space, single, validate

__all__ = ["CLI", "Requeue", "Resources", "SweepSpec", "from_dict", "load", "resumed"]


def load(path: str, overrides: Sequence[str] = (), *, job: bool = False) -> SweepSpec:
    """Read ``path`` (YAML) over the profile and user config, apply Hydra-style ``overrides``
    and validate. A ``job`` may have no ``params`` (it is one trial)."""
    if not os.path.isfile(path):
        raise SpecError("is a directory" if os.path.isdir(path) else "no such file", file=path)
    data, parsed, sources = resolve(path, overrides)
    texts: dict[str, Any] = {}
    params = param_space(data.get("params"), path, texts)
    for ov, text in zip(parsed, overrides):
        if ov.key.split(".")[0] != "params":
            continue
        sub = ov.key[len("params.") :]
        if not sub:
            raise SpecError("name a parameter: params.NAME=VALUES", file=CLI, key=ov.key)
        if ov.prefix == "~":
            if sub not in params:
                raise SpecError("no such parameter to delete", file=CLI, key=ov.key)
            del params[sub]
            texts.pop(sub, None)
        else:
            params[sub] = single(ov.value)
            texts[sub] = text.split("=", 1)[1]
    data["params"] = params
    try:
        return validate(data, path, texts, job=job)
    except SpecError as exc:  # the merged layers: name the one the value at the key came from
        if exc.file == path and exc.key:
            exc.file = owner(exc.key, sources) or path
        raise


def from_dict(data: Mapping[str, Any], source: str) -> SweepSpec:
    """Validate a plain dict (as written by :meth:`SweepSpec.to_dict`)."""
    data = dict(data)
    texts: dict[str, Any] = {}
    data["params"] = param_space(data.get("params"), source, texts)
    return validate(data, source, texts, job=True)


def resumed(config: Mapping[str, Any], overrides: Sequence[str], source: str) -> SweepSpec:
    """The spec of an existing sweep (``sweep.json``) with ``overrides`` of ``RESUMABLE`` keys."""
    base = {k: v for k, v in config.items() if k in TOP_KEYS}
    data = copy.deepcopy(base)
    for text in overrides:
        ov = parse_cli(text)
        if ov.key.split(".")[0] not in RESUMABLE or isinstance(ov.value, (Choice, Distribution)):
            raise SpecError(
                "cannot change this when resuming (the trials are fixed)",
                file=CLI,
                key=ov.key,
                hint=f"keys that may change: {', '.join(RESUMABLE)}",
            )
        try:
            node, leaf = yamldata.parent(data, ov.key)
        except yamldata.NeedsOmegaConf:
            raise SpecError("cannot set a key inside a list", file=CLI, key=ov.key) from None
        if ov.prefix == "~":
            node.pop(leaf, None)
        else:
            node[leaf] = ov.value
    try:
        return from_dict(data, source)
    except SpecError as exc:
        if overrides and exc.file == source:
            from_dict(base, source)  # sweep.json's own mistake names it
            exc.file = CLI  # sweep.json alone is valid: the overrides made the mistake
        raise
