"""Spec layers as Python data: what omegaconf makes of them, without importing omegaconf.

Specs and the user config are read by :func:`read` (its :class:`Loader`) on both paths, this one
and omegaconf's: the same YAML gives the same data, and what no spec may hold (nesting deeper
than :data:`MAX_DEPTH`, aliases that expand too far, NUL characters, text that is not UTF-8, ...)
is a SpecError before anything else sees it.

The layers are loaded, merged and updated here when everything is data omegaconf would not
change: string keys; strings, ints, floats, booleans, nulls, lists and mappings; no ``${``
interpolation and no ``???``; merges and updates that keep each value's kind (mapping, list or
scalar); well-formed YAML. Then the result is the one omegaconf gives. Anything else raises
:class:`NeedsOmegaConf`, and :mod:`slurmkit.spec.layers` lets omegaconf decide (the result, or
the error message). ``tests/test_yamldata.py`` checks both paths against each other.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import SpecError

MAX_DEPTH = 64
"""How deep mappings and lists may nest in a spec (its top-level values are at depth 1)."""
MAX_ALIASED = 10_000
"""How many values a file's YAML aliases (``*name``) may repeat ("billion laughs" repeat 10^9)."""

_FLOAT = "tag:yaml.org,2002:float"
_INT = "tag:yaml.org,2002:int"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class NeedsOmegaConf(Exception):
    """The input needs omegaconf (to resolve it, or to word its error)."""


def too_deep(file: str, keys: Sequence[str]) -> SpecError:
    """The error for a value at ``keys`` (the first of them are named) nested too deep."""
    where = ".".join(keys[:3]) + ("..." if len(keys) > 3 else "")
    return SpecError(
        f"nested more than {MAX_DEPTH} levels deep",
        file=file,
        key=where,
        hint=f"mappings and lists may nest at most {MAX_DEPTH} levels",
    )


def holds_nul(file: str, keys: Sequence[str]) -> SpecError:
    """The error for a NUL character in the value (or the last key) at ``keys``."""
    return SpecError(
        "a NUL character (no argument, variable or path can hold one)",
        file=file,
        key=".".join(keys).replace("\0", "\\0"),
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def joined_surrogates(text: str, file: str, keys: Sequence[str]) -> str:
    """``text`` with each UTF-16 surrogate pair (``"\\ud83d\\ude80"``, as ``json.dump`` writes
    an emoji, which YAML reads as two characters) joined into its character, as JSON reads it;
    a lone surrogate is no character: a SpecError."""
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        code = f"U+{ord(_lone(text)):04X}"
        raise SpecError(
            f"a lone UTF-16 surrogate ({code}): half of a character, which no argument, "
            "variable or path can hold",
            file=file,
            key=".".join(keys).replace("\0", "\\0"),
            hint="write the character itself, or its whole escape (\\U0001F680 in YAML)",
        ) from None


def _lone(text: str) -> str:
    """The first surrogate of ``text`` that is not half of a pair."""
    i = 0
    while i < len(text):
        pair = text[i : i + 2]
        if len(pair) == 2 and "\ud800" <= pair[0] <= "\udbff" and "\udc00" <= pair[1] <= "\udfff":
            i += 2
        elif "\ud800" <= text[i] <= "\udfff":
            return text[i]
        else:
            i += 1
    return "\ufffd"


if TYPE_CHECKING:
    from yaml import SafeLoader as _Loading  # what _Checks is mixed into
else:
    _Loading = object


class _Checks(_Loading):
    """What the spec loader adds to PyYAML's safe loading (see :class:`Loader`)."""

    source: str

    def _start(self, source: str) -> None:
        self.source = source
        self._keys: list[str] = []  # where the node being composed is: its parents' keys, its own
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node): (values, depth), aliases expanded
        self._aliased = 0

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError):
            # PyYAML's constructors of explicit tags fail bare on text they cannot read:
            # ``!!int abc``, ``!!int ""``, ``!!bool maybe``, ``!!timestamp 2001-12-114``.
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {node.value!r} as {node.tag}", node.start_mark
            ) from None

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

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if parent is not None:
            self._keys.append(_label(index))
        if self.check_event(yaml.AliasEvent):
            self._count_alias(self.anchors.get(self.peek_event().anchor))
            node = super().compose_node(parent, index)
        else:
            if len(self._keys) > MAX_DEPTH:
                raise too_deep(self.source, self._keys)
            node = super().compose_node(parent, index)
            self._measure(node, is_key=parent is not None and index is None)
        if parent is not None:
            self._keys.pop()
        return node

    def _count_alias(self, target: yaml.Node | None) -> None:
        """Count what an alias repeats (an undefined one is PyYAML's error)."""
        if target is None:
            return
        key = ".".join(self._keys)
        if id(target) not in self._sizes:
            raise SpecError(
                "an alias inside the value it names (the value would contain itself)",
                file=self.source,
                key=key,
            )
        size, depth = self._sizes[id(target)]
        self._aliased += size
        if self._aliased > MAX_ALIASED:
            raise SpecError(
                f"YAML aliases repeat more than {MAX_ALIASED:,} values",
                file=self.source,
                key=key,
                hint="write the values out, or repeat smaller ones",
            )
        if len(self._keys) + depth > MAX_DEPTH:
            raise too_deep(self.source, self._keys)

    def _measure(self, node: yaml.Node, is_key: bool) -> None:
        """Record a composed node's size and depth; refuse a scalar no spec may hold."""
        if isinstance(node, yaml.ScalarNode):
            self._sizes[id(node)] = (1, 0)
            keys = [*self._keys[:-1], node.value] if is_key else self._keys
            if "\0" in node.value:
                raise holds_nul(self.source, keys)
            if _SURROGATE.search(node.value):
                node.value = joined_surrogates(node.value, self.source, keys)
            if node.tag == _FLOAT and not is_key and len(keys) == 2 and keys[0] == "env":
                try:
                    seen = str(self.construct_yaml_float(node))
                except ValueError:  # !!float x: construct_object's error
                    return
                raise SpecError(
                    f"{node.value} is a YAML float: the job would see {seen!r}",
                    file=self.source,
                    key=f"env.{keys[1]}",
                    hint=f"quote it: {keys[1]}: '{node.value}'",
                )
            return
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = node.value
        sizes = [self._sizes[id(child)] for child in children]
        self._sizes[id(node)] = (
            1 + sum(size for size, _ in sizes),
            max((1 + depth for _, depth in sizes), default=0),
        )


class Worded(_Checks, yaml.SafeLoader):
    """:class:`Loader` on PyYAML's own parser: for malformed YAML, so that its error is PyYAML's
    (libyaml words some differently, and refuses flow nesting over 1,000 levels, which is
    MAX_DEPTH's error here); the loader itself where PyYAML was built without libyaml."""

    def __init__(self, stream: Any, source: str = "<string>") -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._start(source)


if yaml.__with_libyaml__:

    class Loader(
        _Checks,
        yaml.composer.Composer,
        yaml.cyaml.CParser,
        yaml.constructor.SafeConstructor,
        yaml.resolver.Resolver,
    ):
        """The YAML loader of specs and the user config, on both paths.

        It is omegaconf's (``omegaconf._utils.get_yaml_loader``) without its pathlib tags and
        without YAML 1.1's base-60 numbers: duplicate keys are an error, ``1e-5`` is a float,
        timestamps stay strings, and so do ``15:00`` and ``1:30`` (not 900 and 90). As SpecError
        naming ``source`` and the key, it refuses nesting deeper than MAX_DEPTH, aliases that
        repeat more than MAX_ALIASED values or contain themselves, NUL characters (no argument,
        variable or path holds one), and an ``env`` value that YAML reads as a float (``1e-3``
        would reach the job as ``0.001``).

        Its events come from libyaml (PyYAML's ``CParser``: about 4x faster than PyYAML's own
        parser); what it composes and constructs is PyYAML's Python code, where the checks above
        live. YAML that libyaml refuses is read again by :class:`Worded`, so that errors say what
        PyYAML (and omegaconf) say.
        """

        def __init__(self, stream: Any, source: str = "<string>") -> None:
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._start(source)

        def compose_scalar_node(self, anchor: str | None) -> yaml.ScalarNode:
            event = self.peek_event()
            if event.tag == "!":  # an empty one (``a: !``) is resolved as plain, as PyYAML does
                event.implicit = (True, False)
            return super().compose_scalar_node(anchor)

else:  # PyYAML built without libyaml
    Loader = Worded  # type: ignore[misc]


def _label(index: Any) -> str:
    """A node's part of a dotted key: its mapping key's text, its list index, or ``?``."""
    if isinstance(index, yaml.ScalarNode):
        return str(index.value)
    return str(index) if isinstance(index, int) else "?"


# YAML 1.1's int and float (PyYAML's) and omegaconf's float (1e-5 has no '.'), each without its
# base-60 form ([-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+ and the like, with a fraction for floats).
_NUMBERS = {
    _INT: re.compile(
        """^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    _FLOAT: re.compile(
        """^(?:[-+]?(?:[0-9][0-9_]*)\\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\\.(?:inf|Inf|INF)
                    |\\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
}
_OMEGACONF_FLOAT = re.compile(  # omegaconf's: 1e-5 is a float too
    """^(?:
     [-+]?[0-9]+(?:_[0-9]+)*\\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?\\.(?:inf|Inf|INF)
    |\\.(?:nan|NaN|NAN))$""",
    re.X,
)
# Both loaders' (Resolver.add_implicit_resolver would give the float to one class only).
_Checks.yaml_implicit_resolvers = {
    key: [(tag, _NUMBERS.get(tag, regexp)) for tag, regexp in resolvers if tag != _TIMESTAMP]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _first in "-+0123456789.":
    _Checks.yaml_implicit_resolvers.setdefault(_first, []).append((_FLOAT, _OMEGACONF_FLOAT))


def read(path: str) -> Any:
    """The data in the YAML file ``path`` (None when empty), read by :class:`Loader`: what both
    paths load. yaml.YAMLError when it is malformed; SpecError when it is not UTF-8 text, and for
    what the Loader refuses."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = io.StringIO(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start)
        raise SpecError(
            f"not UTF-8 text: byte {raw[exc.start]:#04x} on line {line + 1} ({exc.reason})",
            file=path,
            key=_key_on(raw.decode("utf-8", errors="replace"), line),
            hint="save the file as UTF-8",
        ) from None
    text.name = os.path.abspath(path)  # YAML errors name the file, as omegaconf's do
    try:
        return Loader(text, path).get_single_data()
    except yaml.YAMLError:
        text.seek(0)  # malformed, or beyond libyaml: PyYAML's parser gives the answer or error
        worded = Worded(text, path)
        try:
            return worded.get_single_data()
        finally:
            worded.dispose()


def _key_on(text: str, line: int) -> str | None:
    """The dotted key of the innermost value that starts on or before ``line`` (from 0) of the
    YAML ``text``; None if there is none, or ``text`` cannot be read."""
    try:
        node = Worded(text).get_single_node()
    except (yaml.YAMLError, SpecError):
        return None
    keys: list[str] = []
    while isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        if isinstance(node, yaml.MappingNode):
            items = [(_label(k), k.start_mark.line, v) for k, v in node.value]
        else:
            items = [(str(n), v.start_mark.line, v) for n, v in enumerate(node.value)]
        before = [(key, child) for key, start, child in items if start <= line]
        if not before:
            break
        key, node = before[-1]
        keys.append(key)
    return ".".join(keys) or None


def load(path: str) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (``{}`` when empty), as omegaconf gives it."""
    try:
        data = read(path)
    except yaml.YAMLError as exc:  # omegaconf words the error
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


def clash(layers: Sequence[tuple[int, dict[str, Any]]], prefix: str = "") -> tuple[int, str] | None:
    """Where ``OmegaConf.merge`` of ``layers`` (numbered mappings, lowest first) fails: the number
    of the layer whose list meets a mapping (or mapping a list) below it, and the dotted key."""
    for key in dict.fromkeys(k for _, layer in layers for k in layer):
        groups: list[
            list[tuple[int, Any]]
        ] = []  # the values at key: mappings merge, others replace
        for n, layer in layers:
            if key not in layer:
                continue
            value = layer[key]
            below = groups[-1][-1][1] if groups else None
            if {type(below), type(value)} == {dict, list}:
                return n, f"{prefix}{key}"
            if type(below) is dict and type(value) is dict:
                groups[-1].append((n, value))
            else:
                groups.append([(n, value)])
        for group in groups:
            if type(group[0][1]) is dict and (found := clash(group, f"{prefix}{key}.")):
                return found
    return None


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
