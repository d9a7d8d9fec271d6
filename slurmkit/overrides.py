"""Hydra-style command-line overrides and sweep values, parsed without Hydra.

This is a stdlib-only re-implementation of the subset of Hydra 1.3's override
grammar (``hydra/grammar/Override{Lexer,Parser}.g4``) that a sweep launcher
needs. Values, types and sweep order match ``OverridesParser`` and
``BasicSweeper``; ``tests/test_overrides.py`` checks this against hydra-core.
The value types, the lexer and :func:`format_value` are in :mod:`slurmkit.core.values`
(the in-job runtime needs them without the parser) and are re-exported here.

Supported functions: ``choice``, ``range``, ``sort``, the casts ``int``,
``float``, ``str``, ``bool``, and the slurmkit-only random-search
distributions ``uniform``, ``loguniform`` and ``randint``. Hydra's
``interval``, ``glob``, ``shuffle`` and ``tag`` are rejected.

Deliberate differences from Hydra, all of them errors instead of values that
Hydra accepts but cannot sweep: empty keys (``=1``, ``~``), sweeps nested in
lists, dicts or other sweeps, ranges that are infinite or have a zero step,
ranges of more than ``MAX_SWEEP_SIZE`` values, and ``sort()`` of a range
where Hydra 1.3 gets the values wrong (``sort(range(5,0,-2))`` is 2,4,6).
"""

from __future__ import annotations

import builtins
import inspect
import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from .core.record import record
from .core.values import (
    DICT_KEY_KINDS,
    ID_PATTERN,
    INT_U,
    PRIMITIVE_KINDS,
    Choice,
    Distribution,
    OverrideError,
    Token,
    format_value,
    tokenize,
    unquote,
)

__all__ = [
    "MAX_SWEEP_SIZE",
    "Choice",
    "Distribution",
    "Override",
    "OverrideError",
    "format_value",
    "parse_override",
    "parse_value",
]

MAX_SWEEP_SIZE = 1_000_000
"""Largest number of values a ``range()`` may expand to."""


@record
class Override:
    """A parsed ``key=value``; ``value`` is None for a bare ``~key`` deletion."""

    key: str
    value: Any
    prefix: str


# --------------------------------------------------------------------------- #
# Internal values. They mirror Hydra's QuotedString, ChoiceSweep and RangeSweep
# so that functions see exactly what Hydra's functions see.
# --------------------------------------------------------------------------- #


@record
class _Quoted:
    """A quoted string: equality but no ordering, like Hydra's QuotedString."""

    text: str
    quote: str


@record
class _ChoiceSweep:
    """A choice sweep, like Hydra's ChoiceSweep (a docstring spares dataclasses an inspect call)."""

    items: tuple[Any, ...]
    simple: bool  # the `a,b` form (or a cast/sort of several arguments)


class _RangeSweep(NamedTuple):
    start: int | float
    stop: int | float
    step: int | float
    values: tuple[int | float, ...]


_SWEEPS = (_ChoiceSweep, _RangeSweep, Distribution)


def _new_choice(items: tuple[Any, ...], simple: bool) -> _ChoiceSweep:
    if any(isinstance(item, _SWEEPS) for item in items):
        raise ValueError("sweeps cannot be nested")
    return _ChoiceSweep(items, simple)


def _new_range(start: int | float, stop: int | float, step: int | float) -> _RangeSweep:
    """Expand a range exactly as Hydra 1.3 does (Python range, or Decimal steps)."""
    if step == 0:
        raise ValueError("step must not be zero")
    if all(isinstance(v, int) for v in (start, stop, step)):
        ints = range(start, stop, step)  # type: ignore[arg-type]
        if len(ints) > MAX_SWEEP_SIZE:
            raise ValueError(f"more than {MAX_SWEEP_SIZE} values")
        return _RangeSweep(start, stop, step, tuple(ints))
    if not all(math.isfinite(v) for v in (start, stop, step)):
        raise ValueError("arguments must be finite")
    import decimal  # ~3 ms: only float ranges need it

    # Hydra's FloatRange: Decimal(float) is exact, sums round to 28 digits.
    context = decimal.Context(prec=28, rounding=decimal.ROUND_HALF_EVEN)
    current, end, increment = (decimal.Decimal(v) for v in (start, stop, step))
    if context.divide(context.subtract(end, current), increment) > MAX_SWEEP_SIZE:
        raise ValueError(f"more than {MAX_SWEEP_SIZE} values")
    values: list[float] = []
    while current < end if increment > 0 else current > end:
        values.append(float(current))
        current = context.add(current, increment)
    return _RangeSweep(start, stop, step, tuple(values))


# --------------------------------------------------------------------------- #
# Functions callable in values, with Hydra's argument checks.
# --------------------------------------------------------------------------- #

_ELEMENT = (str, int, float, bool, list, dict)


def _choice(*args: Any) -> _ChoiceSweep:
    if not args:
        raise ValueError("empty choice is not legal")
    if len(args) == 1 and isinstance(args[0], _ChoiceSweep):
        if not args[0].simple:
            raise ValueError("nesting choices is not supported")
        return _ChoiceSweep(args[0].items, simple=False)
    return _new_choice(args, simple=False)


def _range(
    start: int | float, stop: int | float | None = None, step: int | float = 1
) -> _RangeSweep:
    if stop is None:
        start, stop = 0, start
    return _new_range(start, stop, step)


def _sort(*args: Any, sweep: Any = None, list: Any = None, reverse: bool = False) -> Any:
    if list is not None:
        return _sort(list, reverse=reverse)
    if sweep is not None:
        return _sort_sweep(sweep, reverse)
    if len(args) == 1:
        if isinstance(args[0], (_ChoiceSweep, _RangeSweep)):
            return _sort_sweep(args[0], reverse)
        if isinstance(args[0], builtins.list):
            return sorted(args[0], reverse=reverse)
        return args[0]
    if not all(isinstance(arg, (int, float, bool, str)) for arg in args):
        raise TypeError("several arguments must all be numbers, booleans or strings")
    if not args:
        raise ValueError("empty sort input")
    return _sort_sweep(_ChoiceSweep(args, simple=True), reverse)


def _sort_sweep(sweep: _ChoiceSweep | _RangeSweep, reverse: bool) -> _ChoiceSweep | _RangeSweep:
    if isinstance(sweep, _ChoiceSweep):
        return _ChoiceSweep(tuple(sorted(sweep.items, reverse=reverse)), sweep.simple)
    start, stop, step = sweep.start, sweep.stop, sweep.step
    # Hydra 1.3 flips a range this way, which is only right when the span is a
    # multiple of the step; refuse rather than silently differ from Hydra.
    if not reverse and start > stop:
        start, stop, step = stop + abs(step), start + abs(step), -step
    elif reverse and start < stop:
        start, stop, step = stop - abs(step), start - abs(step), -step
    flipped = _new_range(start, stop, step)
    if flipped.values != tuple(sorted(sweep.values, reverse=reverse)):
        raise ValueError(
            f"Hydra 1.3 sorts this range wrongly (to {list(flipped.values)}); "
            "write the range in the wanted order instead"
        )
    return flipped


def _cast_function(name: str, leaf: Callable[[Any], Any]) -> Callable[..., Any]:
    """Build Hydra's int()/float()/str()/bool(): cast elements, lists, dict values, sweeps."""

    def cast(value: Any) -> Any:
        if isinstance(value, _Quoted):
            return cast(value.text)
        if isinstance(value, dict):
            return {key: cast(item) for key, item in value.items()}
        if isinstance(value, list):
            return [cast(item) for item in value]
        if isinstance(value, _ChoiceSweep):
            return _new_choice(tuple(cast(item) for item in value.items), value.simple)
        if isinstance(value, _RangeSweep):
            if name not in ("int", "float"):
                raise ValueError("Range can only be cast to int or float")
            return _new_range(cast(value.start), cast(value.stop), cast(value.step))
        if isinstance(value, Distribution) or (value is None and name != "bool"):
            raise TypeError(f"cannot cast {_describe(value)}")
        return leaf(value)

    def function(*args: Any, value: Any = None) -> Any:
        if args and value is not None:
            raise TypeError("cannot use both position and named arguments")
        if value is None:
            if not args:
                raise TypeError("No positional args or value specified")
            value = args[0] if len(args) == 1 else _new_choice(args, simple=True)
        return cast(value)

    return function


def _to_str(value: int | float | bool | str) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _to_bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(f"Cannot cast '{value}' to bool")
    return bool(value)


def _distribution_function(name: str) -> Callable[..., Distribution]:
    def function(low: Any, high: Any) -> Distribution:
        for arg in (low, high):
            if isinstance(arg, bool) or not isinstance(arg, (int, float)):
                raise TypeError(f"arguments must be numbers, got {_describe(arg)}")
            if not math.isfinite(arg):
                raise ValueError("arguments must be finite")
        if not low < high:
            raise ValueError(f"low must be less than high, got low={low}, high={high}")
        if name == "loguniform" and low <= 0:
            raise ValueError(f"low must be positive, got {low}")
        if name == "randint" and not (isinstance(low, int) and isinstance(high, int)):
            raise TypeError("arguments must be integers")
        return Distribution(name, low, high)

    return function


_NONE = type(None)
# name -> (function, allowed types per parameter, as Hydra's annotations check them)
_FUNCTIONS: dict[str, tuple[Callable[..., Any], dict[str, tuple[type, ...]]]] = {
    "choice": (_choice, {"args": (*_ELEMENT, _ChoiceSweep)}),
    "range": (
        _range,
        {"start": (int, float), "stop": (int, float, _NONE), "step": (int, float)},
    ),
    "sort": (
        _sort,
        {
            "args": (*_ELEMENT, _ChoiceSweep, _RangeSweep),
            "sweep": (_ChoiceSweep, _RangeSweep, _NONE),
            "list": (list, _NONE),
            "reverse": (bool,),
        },
    ),
    "int": (_cast_function("int", int), {}),
    "float": (_cast_function("float", float), {}),
    "str": (_cast_function("str", _to_str), {}),
    "bool": (_cast_function("bool", _to_bool), {}),
    **{name: (_distribution_function(name), {}) for name in ("uniform", "loguniform", "randint")},
}
_UNSUPPORTED = ("glob", "interval", "shuffle", "tag")


def _describe(value: Any) -> str:
    if isinstance(value, _ChoiceSweep):
        return "a choice sweep"
    if isinstance(value, _RangeSweep):
        return "a range sweep"
    if isinstance(value, Distribution):
        return f"a {value.name}() distribution"
    return type(value).__name__


def _call(name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Evaluate a function the way Hydra's ``Functions.eval`` does."""
    if name in _UNSUPPORTED:
        raise ValueError(f"Hydra's {name}() is not supported by slurmkit")
    if name not in _FUNCTIONS:
        raise ValueError(f"unknown function '{name}' (available: {', '.join(sorted(_FUNCTIONS))})")
    function, types = _FUNCTIONS[name]
    args = [a.text if isinstance(a, _Quoted) else a for a in args]
    kwargs = {k: v.text if isinstance(v, _Quoted) else v for k, v in kwargs.items()}
    signature = inspect.signature(function)
    bound = signature.bind(*args, **kwargs)
    for param, value in bound.arguments.items():
        allowed = types.get(param)
        if allowed is None:
            continue
        variadic = signature.parameters[param].kind is inspect.Parameter.VAR_POSITIONAL
        for item in value if variadic else (value,):
            if not isinstance(item, allowed):
                raise TypeError(f"argument '{param}' cannot be {_describe(item)}")
    return function(*bound.args, **bound.kwargs)


_NESTED = "sweeps and distributions cannot be nested in lists, dicts or sweeps"
_CLOSERS = {"BRACKET_OPEN": "]", "BRACE_OPEN": "}", "POPEN": ")"}


# --------------------------------------------------------------------------- #
# Parser (OverrideParser.g4 from rule `value` down).
# --------------------------------------------------------------------------- #


def _column(token: Token) -> int:
    """Column of the token's first non-blank character (some tokens absorb blanks)."""
    blanks = len(token.text) - len(token.text.lstrip(" \t"))
    return token.pos + (blanks if token.text.strip() else 0)


class _Parser:
    def __init__(self, text: str, start: int) -> None:
        self.text = text
        self.tokens = tokenize(text, start)
        self.index = 0

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[self.index + ahead]  # never past EOF: only an ID looks ahead

    def take(self) -> Token:
        token = self.peek()
        self.index += 1
        return token

    def error(self, message: str, token: Token | None = None) -> OverrideError:
        return OverrideError(message, self.text, _column(token or self.peek()))

    def unexpected(self, expected: str, opener: Token | None = None) -> OverrideError:
        token = self.peek()
        found = "end of input" if token.kind == "EOF" else repr(token.text.strip() or token.text)
        message = f"expected {expected} but found {found}"
        if opener is not None:
            message += f" (unbalanced {opener.text.strip()!r} at column {_column(opener)})"
        return self.error(message)

    def value(self) -> Any:
        if self.peek().kind == "EOF":
            return ""
        items = [self.element()]
        while self.peek().kind == "COMMA":
            self.take()
            items.append(self.unnested_element())
        if self.peek().kind != "EOF":
            raise self.unexpected("',' or end of value")
        if len(items) == 1:
            return items[0]
        if isinstance(items[0], _SWEEPS):
            raise self.error(_NESTED, self.tokens[0])
        return _ChoiceSweep(tuple(items), simple=True)

    def unnested_element(self) -> Any:
        token = self.peek()
        value = self.element()
        if isinstance(value, _SWEEPS):
            raise self.error(_NESTED, token)
        return value

    def element(self) -> Any:
        token = self.peek()
        if token.kind == "ID" and self.peek(1).kind == "POPEN":
            return self.function()
        if token.kind == "BRACKET_OPEN":
            return self.list_()
        if token.kind == "BRACE_OPEN":
            return self.dict_()
        if token.kind == "QUOTED":
            self.take()
            return _Quoted(unquote(token.text), token.text[0])
        if token.kind in PRIMITIVE_KINDS:
            return self.primitive(PRIMITIVE_KINDS)
        raise self.unexpected("a value")

    def primitive(self, kinds: frozenset[str]) -> Any:
        tokens = []
        while self.peek().kind in kinds:
            tokens.append(self.take())
        while tokens and tokens[-1].kind == "WS":  # Hydra strips trailing blanks
            tokens.pop()
        if not tokens:
            raise self.unexpected("a dict key")
        if len(tokens) > 1:
            return "".join(t.text[1::2] if t.kind == "ESC" else t.text for t in tokens)
        kind, text, _ = tokens[0]
        if kind == "INT":
            return int(text)
        if kind == "FLOAT":
            return float(text)
        if kind == "BOOL":
            return text.lower() == "true"
        if kind == "NULL":
            return None
        return text[1::2] if kind == "ESC" else text

    def sequence(self, opener: Token, item: Callable[[], Any]) -> list[Any]:
        """Items separated by commas up to the closer matching ``opener``."""
        closer = {"]": "BRACKET_CLOSE", "}": "BRACE_CLOSE", ")": "PCLOSE"}[_CLOSERS[opener.kind]]
        items: list[Any] = []
        if self.peek().kind != closer:
            items.append(item())
            while self.peek().kind == "COMMA":
                self.take()
                items.append(item())
        if self.peek().kind != closer:
            raise self.unexpected(f"',' or {_CLOSERS[opener.kind]!r}", opener)
        self.take()
        return items

    def list_(self) -> list[Any]:
        return self.sequence(self.take(), self.unnested_element)

    def dict_(self) -> dict[Any, Any]:
        def pair() -> tuple[Any, Any]:
            key = self.primitive(DICT_KEY_KINDS)
            if self.peek().kind != "COLON":
                raise self.unexpected("':' after a dict key")
            self.take()
            return key, self.unnested_element()

        return dict(self.sequence(self.take(), pair))

    def function(self) -> Any:
        name = self.take()
        args: list[Any] = []
        kwargs: dict[str, Any] = {}

        def argument() -> None:
            if self.peek().kind == "ID" and self.peek(1).kind == "EQUAL":
                keyword = self.take().text
                self.take()
                kwargs[keyword] = self.element()
            elif kwargs:
                raise self.error("positional argument follows keyword argument")
            else:
                args.append(self.element())

        self.sequence(self.take(), argument)
        try:
            return _call(name.text, args, kwargs)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self.error(f"{name.text}(): {exc}", name) from None


def _parse(text: str, start: int) -> Any:
    """Internal value of ``text[start:]`` as it would follow ``key=``."""
    while start < len(text) and text[start] in " \t":  # EQUAL: '=' WS?
        start += 1
    return _Parser(text, start).value()


def _unquoted(value: Any) -> Any:
    if isinstance(value, _Quoted):
        return value.text
    if isinstance(value, list):
        return [_unquoted(item) for item in value]
    if isinstance(value, dict):
        return {key: _unquoted(item) for key, item in value.items()}
    return value


def _public(value: Any) -> Any:
    if isinstance(value, _ChoiceSweep):
        return Choice(tuple(_unquoted(item) for item in value.items))
    if isinstance(value, _RangeSweep):
        return Choice(value.values)
    return _unquoted(value)


def parse_value(text: str) -> Any:
    """Parse the value part of an override (what follows ``key=``), as Hydra 1.3 would.

    Returns a Python value (str, int, float, bool, None, list, dict), a
    :class:`Choice` or a :class:`Distribution`.
    """
    return _public(_parse(text, 0))


# --------------------------------------------------------------------------- #
# Keys (DEFAULT_MODE of the lexer) and whole overrides.
# --------------------------------------------------------------------------- #

_KEY_SPECIAL = r"[a-zA-Z_$][a-zA-Z0-9_\-$]*"
_SEGMENT = rf"(?:{_KEY_SPECIAL}|{INT_U})"
_PACKAGE = rf"(?:{_SEGMENT}(?:\.{_SEGMENT})+|{_KEY_SPECIAL})?"
_KEY = re.compile(rf"(?:{ID_PATTERN}(?:/{ID_PATTERN})+|{_PACKAGE})(?:@{_PACKAGE})?")


def parse_override(text: str) -> Override:
    """Parse ``key=value``, ``+key=value``, ``++key=value``, ``~key`` or ``~key=value``.

    Keys are dotted paths or config groups (``db/mysql``), optionally with
    ``@package``; the package stays part of ``key``.
    """
    prefix = "++" if text.startswith("++") else text[:1] if text[:1] in ("+", "~") else ""
    equal = text.find("=", len(prefix))
    key_end = len(text) if equal < 0 else equal
    key = text[len(prefix) : key_end]
    if not _KEY.fullmatch(key):
        partial = _KEY.match(key)  # never None: every part of the pattern is optional
        column = len(prefix) + (partial.end() if partial else 0)
        raise OverrideError(f"unexpected {text[column]!r} in key", text, column)
    if not key or key.startswith("@"):
        raise OverrideError("empty key", text, len(prefix))
    if equal < 0:
        if prefix != "~":
            raise OverrideError("missing '=' after the key", text, len(text))
        return Override(key, None, prefix)
    return Override(key, _public(_parse(text, equal + 1)), prefix)
