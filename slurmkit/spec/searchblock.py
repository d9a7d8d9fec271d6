"""The spec's ``search`` block (early stopping): its keys checked, as a :class:`Search`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.search import Search, problems
from ..errors import SpecError
from .check import mapping, read


def search_block(data: Mapping[str, Any], source: str) -> Search | None:
    """The ``search`` block of ``data`` (None when there is none): its keys' kinds and allowed
    values (the table's words, spec/keys.py), then what core/search.py's
    :func:`~slurmkit.core.search.problems` says of the values together; SpecError naming the
    file and the key."""
    if data.get("search") is None:
        return None
    raw = mapping(data, "search", source)
    for name in ("method", "metric", "mode", "resource", "reduction_factor"):
        read(raw, f"search.{name}", source)
    if found := problems(raw):
        key, why = found[0]
        raise SpecError(why, file=source, key=f"search.{key}")
    return Search.from_dict(raw, source)
