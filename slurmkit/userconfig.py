"""Cluster defaults from the user's config file and built-in profiles.

Precedence, lowest first: built-in defaults < profile < user config < spec file < CLI overrides.
The config file is ``$SLURMKIT_CONFIG`` or ``~/.config/slurmkit/config.yaml``; its keys are spec
keys (``resources``, ``output_root``, ``container``, ``profile``, ``env``, ``requeue``).
"""

from __future__ import annotations

import os
from typing import Any

from .errors import SpecError

CONFIG_KEYS = ("resources", "output_root", "container", "profile", "env", "requeue")


def path() -> str:
    return os.environ.get("SLURMKIT_CONFIG") or os.path.expanduser("~/.config/slurmkit/config.yaml")


def load() -> tuple[dict[str, Any], str]:
    """The user's defaults (``{}`` without a file) and the file's path, for messages."""
    from . import plainconf

    where = path()
    if not os.path.isfile(where):
        return {}, where
    try:
        data = plainconf.load(where)
    except Exception:  # not plain data, or a mistake: omegaconf gives the result or the message
        data = _load_omegaconf(where)
    if data is None:
        return {}, where
    if not isinstance(data, dict):
        raise SpecError("the top level must be a mapping", file=where,
                        hint=f"allowed keys: {', '.join(CONFIG_KEYS)}")
    unknown = [k for k in data if k not in CONFIG_KEYS]
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r}", file=where, key=str(unknown[0]),
                        hint=f"allowed keys: {', '.join(CONFIG_KEYS)}")
    return data, where


def _load_omegaconf(where: str) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    import yaml

    try:
        return OmegaConf.to_container(OmegaConf.load(where), resolve=True)
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise SpecError(f"malformed: {str(exc).splitlines()[0]}", file=where) from None


def profile(name: str, source: str) -> dict[str, Any]:
    """The spec layer of a built-in profile: its environment, and SUNK's container habits."""
    from .pyxis import PROFILES

    if name == "none":
        return {}
    if name not in PROFILES:
        raise SpecError(f"unknown profile {name!r}", file=source, key="profile",
                        hint=f"allowed values: none, {', '.join(PROFILES)}")
    return {"env": dict(PROFILES[name]), "container": {"mount_home": False}}
