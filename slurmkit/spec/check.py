"""The generic checks of the spec's keys, driven by :data:`.keys.KEY`: a value's kind, allowed
values, pattern and bounds; a block's or map's being a mapping, a block's unknown keys, a map's
names. Each error names the file and the key, with the table's words and hint."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import SpecError, reject_unknown
from .key import Key
from .keys import KEY, names

_TYPES = {"str": str, "int": int, "positive": int, "bool": bool, "word": str}
_PATTERNS: dict[str, re.Pattern[str]] = {}  # the table's patterns, compiled when first used


def error(path: str, value: Any, source: str, *, at: str | None = None) -> SpecError:
    """The error of a value of the key ``path`` (for a map: a name in it) that its allowed
    values, pattern or bound refuse, named ``at`` (default: ``path``)."""
    key = KEY[path]
    return _error(key, key.mismatch or "{value!r} is not allowed", key.hint, value, source, at)


def misshapen(path: str, value: Any, source: str) -> SpecError:
    """The error of a block or map that is no mapping (of ``blocks``: no list)."""
    key = KEY[path]
    text = key.mismatch if key.kind == "block" and key.mismatch else None
    text = text or ("must be a list" if key.kind == "blocks" else "must be a mapping") + (
        f" of {key.what}" if key.what else ""
    )
    hint = key.example or ("allowed keys: {allowed}" if key.kind == "block" else None)
    return _error(key, text, hint, value, source, None)


def _error(
    key: Key, text: str, hint: str | None, value: Any, source: str, at: str | None
) -> SpecError:
    fill = {
        "value": value,
        "type": type(value).__name__,
        "allowed": ", ".join(key.choices or names(key.path)),
        "maximum": key.maximum,
    }
    hint = hint and _fill(hint, fill)
    return SpecError(_fill(text, fill), file=source, key=at or key.path, hint=hint)


def _fill(text: str, fill: dict[str, Any]) -> str:
    """``text`` with ``{value!r}``, ``{type}``, ``{allowed}``, ``{maximum:,}`` filled in; other
    braces (``{image: ...}`` in an example) stay as written."""
    return re.sub(
        r"\{(value|type|allowed|maximum)(!r)?(:,)?\}",
        lambda m: format(fill[m[1]], m[3][1:] if m[3] else "") if not m[2] else repr(fill[m[1]]),
        text,
    )


def read(
    block: Mapping[str, Any],
    path: str,
    source: str,
    *,
    at: str | None = None,
    default: Any = KEY,
    rules: bool = True,
) -> Any:
    """The value of the key ``path`` in ``block`` (the mapping that holds it), or its default
    (also for null; ``default``: instead of the table's); SpecError, naming ``at`` (default:
    ``path``), when it is not of the key's kind or (``rules``) not one of its allowed values,
    or fails its pattern or maximum."""
    key = KEY[path]
    value: Any = block.get(key.name)
    if value is None:
        value = key.default if default is KEY else default
        if value is None or default is KEY:  # the table's defaults are allowed as they are
            if key.required:
                raise error(path, value, source, at=at)
            return value
    if key.required and (not isinstance(value, str) or not value):
        raise error(path, value, source, at=at)
    if key.kind == "word" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # --switches=COUNT
    elif key.kind == "text":
        value = str(value)
    kind = _TYPES.get(key.kind)
    if kind and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise SpecError(
            f"expected {kind.__name__}, got {type(value).__name__} {value!r}",
            file=source,
            key=at or path,
        )
    if key.kind == "positive" and value < 1:
        raise SpecError(f"must be at least 1, got {value}", file=source, key=at or path)
    if rules and not fits(key, value):
        raise error(path, value, source, at=at)
    return value


def typed(
    block: Mapping[str, Any], path: str, source: str, *, at: str | None = None, default: Any = KEY
) -> Any:
    """:func:`read` without the key's allowed values, pattern and maximum (its caller checks
    them otherwise: ``requeue.signal`` in any case, ``profile`` in :mod:`.layers`)."""
    return read(block, path, source, at=at, default=default, rules=False)


def fits(key: Key, value: Any) -> bool:
    """Whether ``value`` (of the key's kind) is one the key allows."""
    if key.kind == "switch" and isinstance(value, bool):
        return True  # a switch: true, false, or one of its words
    if key.choices and value not in key.choices:
        return False
    if key.pattern:
        pattern = _PATTERNS.get(key.pattern) or _PATTERNS.setdefault(
            key.pattern, re.compile(key.pattern)
        )
        if not pattern.fullmatch(str(value)):
            return False
    return key.maximum is None or value <= key.maximum


def mapping(block: Mapping[str, Any], path: str, source: str) -> Mapping[Any, Any]:
    """The mapping at ``path`` in ``block`` (``{}`` when not given, or false for a ``falsy``
    key); the error of one that is not a mapping. A block's keys are checked too (unknown key:
    did you mean ...?)."""
    key = KEY[path]
    raw = block.get(key.name)
    if raw is None or (key.falsy and not raw):
        return {}
    if not isinstance(raw, Mapping):
        raise misshapen(path, raw, source)
    if key.kind == "block":
        reject_unknown(raw, names(path), file=source, prefix=f"{path}.")
    return raw


def entries(block: Mapping[str, Any], path: str, source: str) -> Iterator[tuple[str, Any, str]]:
    """Each name, value and dotted key of the map at ``path`` in ``block``; the error of a name
    that is not one the map allows (its ``pattern`` or ``choices``)."""
    key = KEY[path]
    for name, value in mapping(block, path, source).items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not fits(key, name):
            raise error(path, name, source, at=where)
        yield name, value, where
