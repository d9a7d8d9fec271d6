"""Values in Hydra's override syntax: their types and how they are written (stdlib only).

The value types (:class:`Choice`, :class:`Distribution`), the lexer of Hydra 1.3's
``OverrideLexer.g4`` (value mode) and :func:`format_value`. The parser, which evaluates
sweeps and functions, is :mod:`slurmkit.overrides`; :func:`format_value` needs only the lexer,
so the in-job runtime writes parameters without loading it.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from .record import record

__all__ = ["Choice", "Distribution", "OverrideError", "format_value"]


class OverrideError(ValueError):
    """An override or value that cannot be parsed; says what and where."""

    def __init__(self, message: str, text: str, column: int) -> None:
        self.message = message
        self.text = text
        self.column = column
        super().__init__(f"{message}\n    {text}\n    {' ' * column}^")


@record
class Choice:
    """A discrete sweep (``a,b,c``, ``choice(...)``, ``range(...)``), in Hydra's order."""

    values: tuple[Any, ...]


@record
class Distribution:
    """A random-search distribution ``uniform``, ``loguniform`` or ``randint`` (low < high)."""

    name: str
    low: float | int
    high: float | int


# --------------------------------------------------------------------------- #
# Lexer (VALUE_MODE of OverrideLexer.g4): longest match, ties to the earlier rule.
# --------------------------------------------------------------------------- #

ID_PATTERN = r"[a-zA-Z_][a-zA-Z0-9_\-]*"
INT_U = r"(?:0|[1-9](?:_?[0-9])*)"
_DIGITS = r"[0-9](?:_?[0-9])*"
_POINT_FLOAT = rf"(?:{INT_U}?\.{_DIGITS}|{INT_U}\.)"
_WS = r"[ \t]"
_TOKEN_RULES = [
    (kind, re.compile(pattern))
    for kind, pattern in [
        ("POPEN", rf"{_WS}*\({_WS}*"),
        ("COMMA", rf"{_WS}*,{_WS}*"),
        ("PCLOSE", rf"{_WS}*\)"),
        ("BRACKET_OPEN", rf"\[{_WS}*"),
        ("BRACKET_CLOSE", rf"{_WS}*\]"),
        ("BRACE_OPEN", rf"\{{{_WS}*"),
        ("BRACE_CLOSE", rf"{_WS}*\}}"),
        ("COLON", rf"{_WS}*:{_WS}*"),
        ("EQUAL", rf"{_WS}*={_WS}*"),
        (
            "FLOAT",
            rf"[+-]?(?:(?:{_POINT_FLOAT}|{INT_U})[eE][+-]?{_DIGITS}|{_POINT_FLOAT}"
            r"|[Ii][Nn][Ff]|[Nn][Aa][Nn])",
        ),
        ("INT", rf"[+-]?{INT_U}"),
        ("BOOL", r"[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]"),
        ("NULL", r"[Nn][Uu][Ll][Ll]"),
        ("UNQUOTED_CHAR", r"[/\-\\+.$%*@?|]"),
        ("ID", ID_PATTERN),
        ("ESC", r"(?:\\[\\()\[\]{}:=, \t])+"),
        ("WS", rf"{_WS}+"),
        ("INTERPOLATION", r"\$\{[^}]+\}"),
    ]
]
PRIMITIVE_KINDS = frozenset(
    {"ID", "NULL", "INT", "FLOAT", "BOOL", "INTERPOLATION", "UNQUOTED_CHAR", "COLON", "ESC", "WS"}
)
"""Tokens that make up a primitive value (a run of them, trailing WS dropped)."""
DICT_KEY_KINDS = PRIMITIVE_KINDS - {"INTERPOLATION", "COLON"}
"""Tokens that make up a dict key."""
_SCALAR_KINDS = frozenset({"INT", "FLOAT", "BOOL", "NULL"})
"""Tokens that, alone in a primitive, read as a number, bool or null instead of a string."""


class Token(NamedTuple):
    kind: str
    text: str
    pos: int


def _quoted_end(text: str, pos: int) -> int:
    """End of the quoted value at ``pos``: its first quote after an even run of backslashes."""
    backslashes = 0
    for index in range(pos + 1, len(text)):
        char = text[index]
        if char == text[pos] and backslashes % 2 == 0:
            return index + 1
        backslashes = backslashes + 1 if char == "\\" else 0
    return -1


def unquote(token: str) -> str:
    """Hydra's un-escaping: only backslashes right before a quote (or the end) are halved."""
    quote = token[0]
    return re.sub(
        rf"(\\+)({quote}|\Z)",
        lambda m: "\\" * (len(m[1]) // 2) + m[2],
        token[1:-1],
    )


def tokenize(text: str, pos: int) -> list[Token]:
    """Tokens of ``text[pos:]``, ending with an EOF token."""
    tokens: list[Token] = []
    while pos < len(text):
        if text[pos] in "'\"":
            end = _quoted_end(text, pos)
            if end < 0:
                raise OverrideError("unterminated quoted string", text, pos)
            tokens.append(Token("QUOTED", text[pos:end], pos))
            pos = end
            continue
        best: Token | None = None
        for kind, pattern in _TOKEN_RULES:
            match = pattern.match(text, pos)
            if match and (best is None or len(match[0]) > len(best.text)):
                best = Token(kind, match[0], pos)
        if best is None:
            raise OverrideError(
                f"unexpected character {text[pos]!r} (quote values that contain it)", text, pos
            )
        tokens.append(best)
        pos += len(best.text)
    tokens.append(Token("EOF", "", len(text)))
    return tokens


# --------------------------------------------------------------------------- #
# Formatting.
# --------------------------------------------------------------------------- #

_ESCAPED = re.compile(r"[\\()\[\]{}:=, \t]")
_BARE_KINDS = PRIMITIVE_KINDS - {"ESC"}  # an escape would be read back unescaped


def _quote(text: str) -> str:
    quote = '"' if "'" in text and '"' not in text else "'"
    body = re.sub(
        rf"(\\*)({quote}|\Z)",
        lambda m: "\\" * (2 * len(m[1])) + ("\\" + quote if m[2] else ""),
        text,
    )
    return f"{quote}{body}{quote}"


def _reads_as_string(text: str, kinds: frozenset[str]) -> bool:
    """Whether ``text`` lexes into tokens of ``kinds`` only, not ending in WS, that a primitive
    reads as a string: several tokens, or one that is not a number, bool or null."""
    try:
        tokens = tokenize(text, 0)[:-1]
    except OverrideError:
        return False
    return (
        bool(tokens)
        and tokens[-1].kind != "WS"
        and all(token.kind in kinds for token in tokens)
        and (len(tokens) > 1 or tokens[0].kind not in _SCALAR_KINDS)
    )


def _is_bare(text: str) -> bool:
    """Whether ``text`` reads back as itself without quotes, in any position.

    Only a run of primitive tokens without escapes reads back unchanged as a string; the
    parser drops leading and trailing blanks, and a trailing '\\' would escape a following
    ',' or ']'.
    """
    if not text or text[0] in " \t" or text.endswith("\\"):
        return False
    return _reads_as_string(text, _BARE_KINDS)


def _format_key(key: Any) -> str:
    """A dict key in override syntax: special characters escaped; ValueError if impossible."""
    if not isinstance(key, str):
        return format_value(key)
    escaped = _ESCAPED.sub(lambda m: "\\" + m[0], key)  # leaves no blank, so no WS token
    if not _reads_as_string(escaped, DICT_KEY_KINDS):
        raise ValueError(f"dict key {key!r} cannot be written in override syntax")
    return escaped


def format_value(value: Any) -> str:
    """Render ``value`` in override syntax so that ``parse_value(format_value(v)) == v``.

    Accepts None, bool, int, float, str, lists and dicts of those, and
    :class:`Choice` and :class:`Distribution`. Strings are quoted only when needed.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return value if _is_bare(value) else _quote(value)
    if isinstance(value, list):
        return "[" + ", ".join(format_value(item) for item in value) + "]"
    if isinstance(value, dict):
        items = (f"{_format_key(k)}: {format_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, Distribution):
        return f"{value.name}({format_value(value.low)}, {format_value(value.high)})"
    if isinstance(value, Choice):
        if len(value.values) > 1:
            return ", ".join(format_value(item) for item in value.values)
        if not value.values:
            return "range(0)"
        if value.values[0] is None:
            raise ValueError("a sweep of the single value null cannot be written")
        return f"choice({format_value(value.values[0])})"
    raise TypeError(f"cannot format a value of type {type(value).__name__}")
