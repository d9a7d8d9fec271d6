"""slurmkit.core.values: the lexer-only formatting against the parser-based one it replaces."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any
from unittest import mock

import pytest
from conftest import typed
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmkit import overrides
from slurmkit.core import values
from slurmkit.core.values import Choice, Distribution, OverrideError, format_value

# --------------------------------------------------------------------------- #
# The definitions being replaced: they run the whole parser.
# --------------------------------------------------------------------------- #


def bare_by_parser(text: str) -> bool:
    """Whether ``text`` reads back as itself without quotes (a trailing '\\' never does)."""
    if not text or text.endswith("\\"):
        return False
    try:
        parsed = overrides._parse(text, 0)
    except OverrideError:
        return False
    return type(parsed) is str and parsed == text


def key_by_parser(key: Any) -> str:
    """``key`` escaped if ``{key: 0}`` parses back to a dict with exactly that str key."""
    if not isinstance(key, str):
        return format_value(key)
    escaped = values._ESCAPED.sub(lambda m: "\\" + m[0], key)
    try:
        parsed = overrides._parse(f"{{{escaped}: 0}}", 0)
    except OverrideError:
        parsed = None
    if not (isinstance(parsed, dict) and type(next(iter(parsed))) is str and key in parsed):
        raise ValueError(f"dict key {key!r} cannot be written in override syntax")
    return escaped


def format_by_parser(value: Any) -> str:
    """``format_value`` as it was: with the parser-based decisions."""
    with (
        mock.patch.object(values, "_is_bare", bare_by_parser),
        mock.patch.object(values, "_format_key", key_by_parser),
    ):
        return format_value(value)


def outcome(function: Any, *args: Any) -> tuple[str, Any]:
    """What ``function(*args)`` returns, or the type and message of what it raises."""
    try:
        return ("ok", function(*args))
    except (ValueError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


# --------------------------------------------------------------------------- #
# Generated strings and values.
# --------------------------------------------------------------------------- #

FRAGMENTS = [
    "'",
    '"',
    "\\",
    "\\\\",
    ",",
    "[",
    "]",
    "{",
    "}",
    "(",
    ")",
    ":",
    "=",
    "$",
    "${",
    "${a}",
    " ",
    "  ",
    "\t",
    "0",
    "1",
    "7",
    "_",
    "a",
    "Z",
    "x-y",
    ".",
    "-",
    "+",
    "e",
    "E",
    "e5",
    "inf",
    "Inf",
    "nan",
    "true",
    "False",
    "null",
    "é",
    "日",
    "\n",
    "%",
    "*",
    "@",
    "?",
    "|",
    "/",
    "#",
    "!",
    "~",
    "str",
    "choice",
    "sort",
    "int",
    "range",
]
CHARS = "'\"\\,[]{}():=$ \t019_aZ.-+eE%*@?|/#é\n"

texts = st.one_of(
    st.lists(st.sampled_from(FRAGMENTS), max_size=10).map("".join),
    st.text(alphabet=CHARS, max_size=12),
)
# Keys of dicts that can be written: characters that are escaped or safe unquoted.
writable_keys = st.text(alphabet="019_aZe.-+$%*@?|/ \t,:=[]{}()\\", max_size=6).filter(
    lambda key: outcome(key_by_parser, key)[0] == "ok"
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts)
nested = st.recursive(  # some keys cannot be written: format_value must raise as before
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.one_of(writable_keys, texts), children, max_size=4)
    ),
    max_leaves=12,
)
writable = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(writable_keys, children, max_size=4)
    ),
    max_leaves=12,
)
tops = st.one_of(
    nested,
    st.lists(nested, max_size=3).map(lambda items: Choice(tuple(items))),
    st.tuples(
        st.sampled_from(["uniform", "loguniform", "randint"]), st.integers(), st.floats()
    ).map(lambda args: Distribution(*args)),
)


# --------------------------------------------------------------------------- #
# Properties.
# --------------------------------------------------------------------------- #


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(texts)
def test_is_bare_agrees_with_the_parser(text: str) -> None:
    assert values._is_bare(text) == bare_by_parser(text)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(st.one_of(texts, writable_keys, st.integers(), st.floats(), st.booleans(), st.none()))
def test_format_key_agrees_with_the_parser(key: Any) -> None:
    assert outcome(values._format_key, key) == outcome(key_by_parser, key)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(tops)
def test_format_value_is_unchanged(value: Any) -> None:
    assert outcome(format_value, value) == outcome(format_by_parser, value)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(writable)
def test_format_value_round_trips(value: Any) -> None:
    assert typed(overrides.parse_value(format_value(value))) == typed(value)


# --------------------------------------------------------------------------- #
# Examples.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("text", "bare"),
    [
        ("abc", True),
        ("a b", True),
        ("a : ", True),
        ("${a.b}", True),
        ("${a,'b'}", True),
        ("1 2", True),
        ("-", True),
        ("$", True),
        ("1x", True),
        ("infinity", True),
        ("a:b", True),
        ("", False),
        (" a", False),
        ("a ", False),
        ("a\t", False),
        (" :", False),
        ("1", False),
        ("-1.5e3", False),
        ("inf", False),
        ("NaN", False),
        ("True", False),
        ("null", False),
        ("a\\", False),
        ("a\\,b", False),
        ("a,b", False),
        ("a=b", False),
        ("f(x)", False),
        ("[1]", False),
        ("{a: 1}", False),
        ("'a'", False),
        ("a'b", False),
        ("é", False),
        ("a\nb", False),
        ("${a", False),
    ],
)
def test_is_bare_examples(text: str, bare: bool) -> None:
    assert values._is_bare(text) is bare
    assert bare_by_parser(text) is bare


@pytest.mark.parametrize(
    "key", ["", "1", "-2", "1e5", "inf", "true", "NULL", "é", "a'b", "'a'", "a#b", "a\nb"]
)
def test_unwritable_keys_raise_as_before(key: str) -> None:
    expected = f"dict key {key!r} cannot be written in override syntax"
    with pytest.raises(ValueError) as raised:
        format_value({key: 0})
    assert str(raised.value) == expected
    assert outcome(key_by_parser, key) == ("ValueError", expected)


def test_written_keys_examples() -> None:
    assert format_value({"a b": 1, "x:y": 2, "(k)": 3, "a\\": 4, "1 2": 5, "${a}": 6}) == (
        "{a\\ b: 1, x\\:y: 2, \\(k\\): 3, a\\\\: 4, 1\\ 2: 5, $\\{a\\}: 6}"
    )


def test_format_value_examples() -> None:
    assert format_value(["a : ", "a ", "1", "inf", "it's", "${x}"]) == (
        "[a : , 'a ', '1', 'inf', \"it's\", ${x}]"
    )
    assert format_value({"k": [math.inf, -0.0, None, True]}) == "{k: [inf, -0.0, null, true]}"


@pytest.mark.parametrize("text", ["1" * 5000, "[" * 400], ids=["digits", "brackets"])
def test_strings_the_parser_chokes_on_are_quoted(text: str) -> None:
    """The old format_value raised here (int()'s digit limit, recursion depth); now quoted."""
    assert format_value(text) == f"'{text}'"
    with pytest.raises((ValueError, RecursionError)):
        bare_by_parser(text)


def test_imports_only_core() -> None:
    code = (
        "import slurmkit.core.values, sys; "
        "print(sorted(m for m in sys.modules if m.startswith('slurmkit')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        "['slurmkit',",
        "'slurmkit.core',",
        "'slurmkit.core.record',",
        "'slurmkit.core.values']",
    ]


def test_overrides_reexports() -> None:
    assert overrides.format_value is format_value
    assert overrides.Choice is Choice and overrides.Distribution is Distribution
    assert overrides.OverrideError is OverrideError
