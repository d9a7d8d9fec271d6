"""slurmkit.overrides against Hydra 1.3's own override parser and BasicSweeper."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest
from conftest import typed

from slurmkit.overrides import (
    Choice,
    Distribution,
    Override,
    OverrideError,
    format_value,
    parse_override,
    parse_value,
)


@pytest.fixture(scope="module")
def hydra_parser() -> Any:
    pytest.importorskip("hydra")
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


_SWEEP_LIMIT = 10_000  # Hydra expands range(0, inf) forever


def hydra_override(parser: Any, text: str) -> Override:
    """Hydra's parse of ``text`` in our terms; raises on anything our parser must reject too."""
    from hydra.core.override_parser.types import Override as HydraOverride
    from hydra.core.override_parser.types import OverrideType
    from hydra.core.override_parser.types import Sweep as HydraSweep

    parsed = parser.parse_override(text)
    prefix = {
        OverrideType.CHANGE: "",
        OverrideType.ADD: "+",
        OverrideType.FORCE_ADD: "++",
        OverrideType.DEL: "~",
    }[parsed.type]
    key = parsed.get_key_element()[len(prefix) :]

    def no_sweep(value: Any) -> Any:
        if isinstance(value, HydraSweep):
            raise ValueError("nested sweep")
        if isinstance(value, list):
            return [no_sweep(v) for v in value]
        if isinstance(value, dict):
            return {k: no_sweep(v) for k, v in value.items()}
        return value

    if parsed.is_sweep_override():
        if not parsed.is_discrete_sweep():
            raise ValueError("interval sweep")
        values = list(itertools.islice(parsed.sweep_iterator(), _SWEEP_LIMIT + 1))
        if len(values) > _SWEEP_LIMIT:
            raise ValueError("infinite sweep")
        value: Any = Choice(tuple(no_sweep(HydraOverride._convert_value(v)) for v in values))
    else:
        value = no_sweep(parsed.value())
    return Override(key, value, prefix)


# --------------------------------------------------------------------------- #
# Valid overrides: ours must equal Hydra's, types included.
# --------------------------------------------------------------------------- #

PRIMITIVES = {
    # ints
    "x=1": 1,
    "x=-1": -1,
    "x=+5": 5,
    "x=0": 0,
    "x=-0": 0,
    "x=1_000_000": 1_000_000,
    "x=123456789012345678901234567890": 123456789012345678901234567890,
    # floats
    "x=1.5": 1.5,
    "x=-20.0": -20.0,
    "x=1e-3": 1e-3,
    "x=1E5": 1e5,
    "x=-10e3": -10e3,
    "x=.5": 0.5,
    "x=5.": 5.0,
    "x=1.e5": 1e5,
    "x=1_000.5": 1000.5,
    "x=1e1_0": 1e10,
    "x=inf": math.inf,
    "x=-inf": -math.inf,
    "x=+Inf": math.inf,
    "x=nan": math.nan,
    "x=NaN": math.nan,
    # bools and null
    "x=true": True,
    "x=FALSE": False,
    "x=TrUe": True,
    "x=null": None,
    "x=NULL": None,
    # unquoted strings
    "x=abc": "abc",
    "x=a-b_c": "a-b_c",
    "x=/path/to/file.txt": "/path/to/file.txt",
    "x=a.b": "a.b",
    "x=1abc": "1abc",
    "x=01": "01",
    "x=1_": "1_",
    "x=_1": "_1",
    "x=1.5.3": "1.5.3",
    "x=2020-01-01": "2020-01-01",
    "x=-infinity": "-infinity",
    "x=info": "info",
    "x=truex": "truex",
    "x=nullable": "nullable",
    "x=$HOME": "$HOME",
    "x=50%": "50%",
    "x=a|b*c?d@e+f": "a|b*c?d@e+f",
    "x=-": "-",
    "x=a:b": "a:b",
    "x=:": ":",
    "x=${a.b}": "${a.b}",
    "x=${oc.env:HOME,/tmp}": "${oc.env:HOME,/tmp}",
    # whitespace: stripped around the value, kept inside
    "x=a b": "a b",
    "x=a  b   c  ": "a  b   c",
    "x=   a": "a",
    "x=\ta\t": "a",
    "x= 5 ": 5,
    "x=a :b": "a :b",
    "x=a: ": "a: ",
    "x= : ": ": ",
    # escapes
    "x=a\\,b": "a,b",
    "x=a\\ ": "a ",
    "x=\\ a": " a",
    "x=\\(\\)\\[\\]\\{\\}": "()[]{}",
    "x=\\\\": "\\",
    "x=a\\b": "a\\b",
    "x=a\\=b\\:c": "a=b:c",
    "x=\\\t": "\t",
    # quoted strings: always str, only backslashes before a quote are escapes
    "x='a,b'": "a,b",
    'x="a b, c"': "a b, c",
    'x="it\'s"': "it's",
    "x='say \"hi\"'": 'say "hi"',
    "x='a\\'b'": "a'b",
    'x="a\\"b"': 'a"b',
    "x='a\\\"b'": 'a\\"b',
    "x='a\\\\'": "a\\",
    "x='\\\\'": "\\",
    'x="a\\\\\\"b"': 'a\\"b',
    "x='a\\nb'": "a\\nb",
    "x=''": "",
    'x=""': "",
    "x='1'": "1",
    "x='true'": "true",
    "x='null'": "null",
    "x=' padded '": " padded ",
    "x='[1, 2]'": "[1, 2]",
    "x='${a.b}'": "${a.b}",
    "x='a=b'": "a=b",
    # unicode needs quotes
    "x='héllo wörld'": "héllo wörld",
    'x="日本語"': "日本語",
    "x='emoji 🚀'": "emoji 🚀",
    # empty values
    "x=": "",
    "x=  ": "",
}

CONTAINERS = {
    "x=[]": [],
    "x=[ ]": [],
    "x=[1,2,3]": [1, 2, 3],
    "x=[1, 'a', null, true, 1.5, b c]": [1, "a", None, True, 1.5, "b c"],
    "x=[a, [b, [c, []]]]": ["a", ["b", ["c", []]]],
    "x=[ a b , c ]": ["a b", "c"],
    "x=['a,b', \"c]\"]": ["a,b", "c]"],
    "x={}": {},
    "x={ }": {},
    "x={a: 1, b: [2]}": {"a": 1, "b": [2]},
    "x={a:{b:{c:1}}}": {"a": {"b": {"c": 1}}},
    "x={1: a, 1.5: b, null: c, false: d}": {1: "a", 1.5: "b", None: "c", False: "d"},
    "x={1: a, true: b}": {1: "b"},
    "x={a b: c d}": {"a b": "c d"},
    "x={ a : b:c }": {"a": "b:c"},
    "x={a: 1, a: 2}": {"a": 2},
    "x={a\\:b: 'q'}": {"a:b": "q"},
    "x=[{a: [1, {b: 2}]}]": [{"a": [1, {"b": 2}]}],
    "x=int([1.5, '2'])": [1, 2],
    "x=str({a: 1, b: [true]})": {"a": "1", "b": ["true"]},
}

SWEEPS = {
    "x=1,2,3": (1, 2, 3),
    "x=a , b": ("a", "b"),
    "x=a,1,1.5,true,null,'q,r',[1,2],{a:1},${x}": (
        "a",
        1,
        1.5,
        True,
        None,
        "q,r",
        [1, 2],
        {"a": 1},
        "${x}",
    ),
    "x=b,a,b": ("b", "a", "b"),
    "x=choice(1,2,3)": (1, 2, 3),
    "x=choice(c, a, b)": ("c", "a", "b"),
    "x=choice(a)": ("a",),
    "x=choice([1,2],[3])": ([1, 2], [3]),
    "x=choice (a, 'b c')": ("a", "b c"),
    "x=choice( 1 , 2 )": (1, 2),
    "x=range(5)": (0, 1, 2, 3, 4),
    "x=range(1,5)": (1, 2, 3, 4),
    "x=range(1,10,3)": (1, 4, 7),
    "x=range(5,0,-2)": (5, 3, 1),
    "x=range(0,-5,-1)": (0, -1, -2, -3, -4),
    "x=range(5,1)": (),
    "x=range(1,5,-1)": (),
    "x=range(0,1,0.1)": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7000000000000001, 0.8, 0.9),
    "x=range(1.5,3)": (1.5, 2.5),
    "x=range(1,2,0.25)": (1.0, 1.25, 1.5, 1.75),
    "x=range(3,0,-0.5)": (3.0, 2.5, 2.0, 1.5, 1.0, 0.5),
    "x=range(0.1,0.5,0.1)": (0.1, 0.2, 0.30000000000000004, 0.4),
    "x=range(2.5)": (0.0, 1.0, 2.0),
    "x=range(0, 1, 1e-1)": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7000000000000001, 0.8, 0.9),
    "x=range(start=1,stop=4)": (1, 2, 3),
    "x=range(1,stop=6,step=2)": (1, 3, 5),
    "x=range(3, null)": (0, 1, 2),
    "x=int(1.5,2.5)": (1, 2),
    "x=str(1,true)": ("1", "true"),
    "x=float(range(1,3))": (1.0, 2.0),
    "x=int(range(1.5,4.5))": (1, 2, 3),
    "x=str(choice(1,2))": ("1", "2"),
    "x=choice(int(1,2))": (1, 2),
    "x=sort(3,1,2)": (1, 2, 3),
    "x=sort(c,a,b,reverse=true)": ("c", "b", "a"),
    "x=sort(choice(3,1,2))": (1, 2, 3),
    "x=sort(sweep=choice(b,a))": ("a", "b"),
    "x=sort(range(5,0,-1))": (1, 2, 3, 4, 5),
    "x=sort(range(6,0,-2))": (2, 4, 6),
    "x=sort(range(1,5), reverse=true)": (4, 3, 2, 1),
    "x=sort(range(1,4))": (1, 2, 3),
}

ELEMENTS = {
    "x=int(1.7)": 1,
    "x=int('12')": 12,
    "x=int(' 1_0 ')": 10,
    "x=int(true)": 1,
    "x=float(1)": 1.0,
    "x=float('1e-3')": 1e-3,
    "x=str(1)": "1",
    "x=str(true)": "true",
    "x=str(1.0)": "1.0",
    "x=str(1e-5)": "1e-05",
    "x=bool(0)": False,
    "x=bool(2.5)": True,
    "x=bool('TRUE')": True,
    "x=bool(null)": False,
    "x=int(value=3.5)": 3,
    "x=sort([3,1,2])": [1, 2, 3],
    "x=sort(list=[3,1], reverse=true)": [3, 1],
    "x=sort(a)": "a",
    "x=[int(1.5), str(2)]": [1, "2"],
}

KEYS = {
    "a.b.c=1": ("a.b.c", ""),
    "+a.b=1": ("a.b", "+"),
    "++a=1": ("a", "++"),
    "~a=1": ("a", "~"),
    "~a=": ("a", "~"),
    "a.0=1": ("a.0", ""),
    "a.1_0=1": ("a.1_0", ""),
    "0.a=1": ("0.a", ""),
    "$a=1": ("$a", ""),
    "_a=1": ("_a", ""),
    "a-b.c_d=1": ("a-b.c_d", ""),
    "a.$b-c=1": ("a.$b-c", ""),
    "db/mysql=x": ("db/mysql", ""),
    "hydra/launcher/x=basic": ("hydra/launcher/x", ""),
    "db@pkg=x": ("db@pkg", ""),
    "db@pkg.sub=x": ("db@pkg.sub", ""),
    "+db@_global_=x": ("db@_global_", "+"),
    "db@=x": ("db@", ""),
    "x=  1": ("x", ""),
}

VALID = [*PRIMITIVES, *CONTAINERS, *SWEEPS, *ELEMENTS, *KEYS]


@pytest.mark.parametrize("text", VALID)
def test_matches_hydra(hydra_parser: Any, text: str) -> None:
    expected = hydra_override(hydra_parser, text)
    got = parse_override(text)
    assert (got.key, got.prefix) == (expected.key, expected.prefix)
    assert typed(got.value) == typed(expected.value)


@pytest.mark.parametrize("text", VALID)
def test_expected_values(text: str) -> None:
    """The table itself, without Hydra (also pins the exact Python types)."""
    got = parse_override(text)
    if text in PRIMITIVES:
        assert typed(got.value) == typed(PRIMITIVES[text])
    elif text in CONTAINERS:
        assert typed(got.value) == typed(CONTAINERS[text])
    elif text in SWEEPS:
        assert typed(got.value) == typed(Choice(SWEEPS[text]))
    elif text in ELEMENTS:
        assert typed(got.value) == typed(ELEMENTS[text])
    else:
        assert (got.key, got.prefix) == KEYS[text]


def test_deletion_and_parse_value() -> None:
    assert parse_override("~a.b") == Override("a.b", None, "~")
    assert parse_override("~a.b=null") == Override("a.b", None, "~")
    assert parse_value(" 1,a ") == Choice((1, "a"))
    assert parse_value("") == ""
    assert parse_value("[1,2]") == [1, 2]


def test_float_range_is_exactly_hydras_decimal_walk() -> None:
    # Hydra walks in Decimal from the exact binary value of each float: 0.7000000000000001
    values = parse_value("range(0,1,0.1)").values
    assert values[7] == 0.7000000000000001 and values[3] == 0.3
    assert all(type(v) is float for v in parse_value("range(1,3,1.0)").values)
    assert all(type(v) is int for v in parse_value("range(1,3)").values)


# --------------------------------------------------------------------------- #
# Distributions (a slurmkit extension).
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("uniform(0, 1)", Distribution("uniform", 0, 1)),
        ("uniform(low=-1.5, high=2)", Distribution("uniform", -1.5, 2)),
        ("loguniform(1e-5, 1e-1)", Distribution("loguniform", 1e-5, 1e-1)),
        ("randint(1, 10)", Distribution("randint", 1, 10)),
        ("randint(int(1.0), 4)", Distribution("randint", 1, 4)),
    ],
)
def test_distributions(text: str, expected: Distribution) -> None:
    got = parse_value(text)
    assert got == expected and typed(got.low) == typed(expected.low)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("uniform(1, 0)", "low must be less than high"),
        ("uniform(1, 1)", "low must be less than high"),
        ("loguniform(0, 1)", "low must be positive"),
        ("loguniform(-1, 1)", "low must be positive"),
        ("randint(1.5, 3)", "integers"),
        ("randint(1, 2.0)", "integers"),
        ("uniform(a, 1)", "must be numbers"),
        ("uniform('0', 1)", "must be numbers"),
        ("uniform(true, 2)", "must be numbers"),
        ("uniform([0], 2)", "must be numbers"),
        ("uniform(0, inf)", "finite"),
        ("uniform(nan, 1)", "finite"),
        ("uniform(0)", "missing a required argument"),
        ("uniform(0, 1, 2)", "too many"),
        ("uniform(0, 1, size=2)", "unexpected keyword"),
        ("[uniform(0,1)]", "cannot be nested"),
        ("uniform(0,1),2", "cannot be nested"),
        ("1,uniform(0,1)", "cannot be nested"),
        ("{a: randint(0, 3)}", "cannot be nested"),
        ("choice(uniform(0,1))", r"cannot be a uniform\(\) distribution"),
        ("int(uniform(0,1))", "cannot cast"),
    ],
)
def test_bad_distributions(text: str, message: str) -> None:
    with pytest.raises(OverrideError, match=message):
        parse_value(text)


# --------------------------------------------------------------------------- #
# Errors.
# --------------------------------------------------------------------------- #

# Rejected by Hydra as well (at parse time, or when the sweep is expanded).
HYDRA_ERRORS = {
    "x='abc": ("unterminated quoted string", 2),
    'x="abc': ("unterminated quoted string", 2),
    "x='a\\'": ("unterminated quoted string", 2),
    "x=[1,2": ("expected ',' or ']' but found end of input (unbalanced '['", 6),
    "x=[1,2]]": ("expected ',' or end of value but found ']'", 7),
    "x=[[1,2]": ("expected ',' or ']'", 8),
    "x={a: 1": ("expected ',' or '}'", 7),
    "x={a: 1]": ("expected ',' or '}' but found ']'", 7),
    "x=choice(1,2": ("expected ',' or ')'", 12),
    "x=1,2)": ("expected ',' or end of value but found ')'", 5),
    "x=]": ("expected a value but found ']'", 2),
    "x=,a": ("expected a value", 2),
    "x=a,": ("expected a value but found end of input", 4),
    "x=[1,]": ("expected a value but found ']'", 5),
    "x": ("missing '='", 1),
    "+x": ("missing '='", 2),
    "++a.b": ("missing '='", 5),
    "a b=1": ("unexpected ' ' in key", 1),
    "a =1": ("unexpected ' ' in key", 1),
    "a..b=1": ("unexpected '.' in key", 1),
    "0=1": ("unexpected '0' in key", 0),
    "a.01=1": ("unexpected '1' in key", 3),
    "a/b.c=1": ("unexpected '.' in key", 3),
    "'a'=1": ('unexpected "\'" in key', 0),
    "+++a=1": ("unexpected '+' in key", 2),
    "~+a=1": ("unexpected '+' in key", 1),
    "x=a=b": ("expected ',' or end of value but found '='", 3),
    "x=[1] ": ("expected ',' or end of value but found ' '", 5),
    "x='a' ": ("expected ',' or end of value", 5),
    "x='a'b": ("expected ',' or end of value but found 'b'", 5),
    "x=a'b'": ("expected ',' or end of value but found \"'b'\"", 3),
    "x=héllo": ("unexpected character 'é'", 3),
    "x=a\nb": ("unexpected character '\\n'", 3),
    "x=a#b": ("unexpected character '#'", 3),
    "x={'a': 1}": ("expected a dict key but found \"'a'\"", 3),
    "x={: 1}": ("expected a dict key but found ':'", 3),
    "x={a}": ("expected ':' after a dict key", 4),
    "x={${a}: 1}": ("expected a dict key but found '${a}'", 3),
    "x=true(1)": ("expected ',' or end of value but found '('", 6),
    "x=1(2)": ("expected ',' or end of value", 3),
    "x=foo(1)": ("unknown function 'foo'", 2),
    "x=choice()": ("empty choice", 2),
    "x=choice(null, 1)": ("argument 'args' cannot be NoneType", 2),
    "x=choice(range(3))": ("cannot be a range sweep", 2),
    "x=choice(choice(1,2))": ("nesting choices is not supported", 2),
    "x=choice(a, b=1)": ("unexpected keyword argument 'b'", 2),
    "x=range(1,5,0)": ("step must not be zero", 2),
    "x=range(1,5,0.0)": ("step must not be zero", 2),
    "x=range(a, 3)": ("argument 'start' cannot be str", 2),
    "x=range('1', 3)": ("argument 'start' cannot be str", 2),
    "x=range(1, 2, 3, 4)": ("too many positional arguments", 2),
    "x=range(stop=3,1)": ("positional argument follows keyword argument", 15),
    "x=int(a)": ("invalid literal for int", 2),
    "x=int(inf)": ("cannot convert float infinity", 2),
    "x=str(null)": ("cannot cast NoneType", 2),
    "x=bool(maybe)": ("Cannot cast 'maybe' to bool", 2),
    "x=str(range(1,3))": ("Range can only be cast to int or float", 2),
    "x=int(1, value=2)": ("cannot use both", 2),
    "x=int()": ("No positional args", 2),
    "x=sort(1, [2])": ("must all be numbers", 2),
    "x=sort(1, a)": ("not supported between", 2),
    "x=sort([b, 'a'])": ("not supported between", 2),
    "x=sort()": ("empty sort input", 2),
    "x=sort(3, 1, reverse=1)": ("argument 'reverse' cannot be int", 2),
    "x=int(1, choice(2,3))": ("sweeps cannot be nested", 2),
}

# Accepted by Hydra, rejected here on purpose (Hydra cannot sweep them either,
# or gets them wrong).
OUR_ERRORS = {
    "=1": ("empty key", 0),
    "+=1": ("empty key", 1),
    "~": ("empty key", 1),
    "@pkg=1": ("empty key", 0),
    "x=[choice(1,2)]": ("cannot be nested", 3),
    "x=choice(1,2),3": ("cannot be nested", 2),
    "x=3,range(2)": ("cannot be nested", 4),
    "x={a: range(3)}": ("cannot be nested", 6),
    "x=choice(1, choice(2,3))": ("sweeps cannot be nested", 2),
    "x=range(0, inf)": ("must be finite", 2),
    "x=range(0, 1, nan)": ("must be finite", 2),
    "x=range(10_000_000)": ("more than 1000000 values", 2),
    "x=range(0.0, 1e7)": ("more than 1000000 values", 2),
    "x=sort(range(5,0,-2))": ("sorts this range wrongly (to [2, 4, 6])", 2),
    "x=sort(range(1,6,2), reverse=true)": ("sorts this range wrongly", 2),
    "x=interval(0,1)": ("interval() is not supported", 2),
    "x=shuffle(1,2)": ("shuffle() is not supported", 2),
    "x=glob(*)": ("glob() is not supported", 2),
    "x=tag(a, choice(1,2))": ("tag() is not supported", 2),
}


@pytest.mark.parametrize("text", [*HYDRA_ERRORS, *OUR_ERRORS])
def test_errors(text: str) -> None:
    message, column = {**HYDRA_ERRORS, **OUR_ERRORS}[text]
    with pytest.raises(OverrideError) as info:
        parse_override(text)
    error = info.value
    assert message in error.message
    assert error.column == column
    assert isinstance(error, ValueError)
    # the rendered message shows the text with a caret under the column
    lines = str(error).splitlines()
    assert lines[-2].strip() == text.splitlines()[0].strip() or "\n" in text
    assert lines[-1].index("^") - 4 == column


@pytest.mark.parametrize("text", HYDRA_ERRORS)
def test_hydra_rejects_too(hydra_parser: Any, text: str) -> None:
    from hydra.errors import HydraException

    with pytest.raises((HydraException, ValueError)):  # ValueError: range() step 0, when expanded
        hydra_override(hydra_parser, text)


@pytest.mark.parametrize(
    "text", [t for t in OUR_ERRORS if "inf" not in t and "nan" not in t and "e7" not in t]
)
def test_hydra_accepts_our_deliberate_errors(hydra_parser: Any, text: str) -> None:
    """Documents each deliberate difference: Hydra parses these without complaint."""
    hydra_parser.parse_override(text)


# --------------------------------------------------------------------------- #
# Random inputs: ours and Hydra's accept the same strings and agree on values.
# --------------------------------------------------------------------------- #

_PIECES = [
    "a",
    "b1",
    "x-y",
    "1",
    "-2",
    "0",
    "1_0",
    "1.5",
    "1e3",
    ".5",
    "5.",
    "true",
    "NULL",
    "inf",
    " ",
    "  ",
    "\t",
    ",",
    ", ",
    ":",
    "[",
    "]",
    "{",
    "}",
    "(",
    ")",
    "'q'",
    '"w w"',
    "'",
    '"',
    "\\",
    "\\,",
    "\\ ",
    "\\\\",
    "=",
    "$",
    "${a.b}",
    "/",
    "%",
    "@",
    "+",
    ".",
    "_",
    "choice(",
    "range(",
    "int(",
    "str(",
    "float(",
    "bool(",
    "'\\''",
]


def test_random_values_agree_with_hydra(hydra_parser: Any) -> None:
    rng = random.Random(1234)
    agreed = 0
    for _ in range(1500):
        text = "x=" + "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 7)))
        try:
            expected: Any = hydra_override(hydra_parser, text)
        except Exception:
            expected = None
        try:
            got: Any = parse_override(text)
        except OverrideError:
            got = None
        if expected is None or got is None:
            assert expected is got, text
        else:
            assert typed(got.value) == typed(expected.value), text
            agreed += 1
    assert agreed > 300  # the generator must produce plenty of valid values


# --------------------------------------------------------------------------- #
# Expansion: the cartesian product matches Hydra's BasicSweeper.
# --------------------------------------------------------------------------- #

SWEEP_OVERRIDES = [
    "a=1,2",
    "b=range(0,3)",
    "+c=x",
    "~d",
    "e='p q', r, \"it's\"",
    "f=[1,2]",
    "++g=range(0,0.3,0.1)",
    "db@pkg=m1,m2",
    "h=sort(c,a,b)",
    "i={k: v},[w],null,true,2.5",
]


def _jobs(overrides: list[str]) -> list[list[tuple[str, Any]]]:
    axes = []
    for o in map(parse_override, overrides):
        values = o.value.values if isinstance(o.value, Choice) else [o.value]
        axes.append([(o.prefix + o.key, value) for value in values])
    return [list(job) for job in itertools.product(*axes)]


def test_product_matches_basic_sweeper(hydra_parser: Any) -> None:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    [batch] = BasicSweeper.split_arguments(
        hydra_parser.parse_overrides(SWEEP_OVERRIDES), max_batch_size=None
    )
    ours = _jobs(SWEEP_OVERRIDES)
    assert len(ours) == len(batch) == 2 * 3 * 3 * 3 * 2 * 3 * 5

    cache: dict[str, tuple[str, Any]] = {}

    def read_back(item: str) -> tuple[str, Any]:  # Hydra's view of one `key=value` string
        if item not in cache:
            o = hydra_override(hydra_parser, item)
            cache[item] = (o.prefix + o.key, typed(o.value))
        return cache[item]

    for our_job, hydra_job in zip(ours, batch, strict=True):
        expected = [(key, typed(value)) for key, value in our_job]
        assert [read_back(item) for item in hydra_job] == expected
        # our rendering of each job reads back identically in Hydra
        rendered = [
            key if value is None and key.startswith("~") else f"{key}={format_value(value)}"
            for key, value in our_job
        ]
        assert [read_back(item) for item in rendered] == expected


def test_basic_sweeper_unquotes_choice_strings(hydra_parser: Any) -> None:
    """Hydra renders choice("it's") as `e=it's`, which Hydra cannot read back; we quote it."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    [[[item]]] = BasicSweeper.split_arguments(
        hydra_parser.parse_overrides(['e=choice("it\'s")']), max_batch_size=None
    )
    assert item == "e=it's"
    from hydra.errors import HydraException

    with pytest.raises(HydraException):
        hydra_parser.parse_override(item)
    [value] = parse_value('choice("it\'s")').values
    assert hydra_override(hydra_parser, f"e={format_value(value)}").value == "it's"


def test_product_order_is_hydras() -> None:
    jobs = _jobs(["a=1,2", "b=range(5,0,-2)"])
    assert [[v for _, v in job] for job in jobs] == [
        [1, 5],
        [1, 3],
        [1, 1],
        [2, 5],
        [2, 3],
        [2, 1],
    ]
    assert _jobs(["a=1,2", "b=range(3,3)"]) == []


# --------------------------------------------------------------------------- #
# format_value round trips.
# --------------------------------------------------------------------------- #

ROUND_TRIP = [
    None,
    True,
    False,
    0,
    -7,
    10**30,
    1.5,
    -0.0,
    1e-05,
    1e16,
    0.1 + 0.2,
    math.inf,
    -math.inf,
    "",
    "a",
    "a b",
    " a ",
    "1",
    "1.5",
    "true",
    "null",
    "nan",
    "inf",
    "a,b",
    "a:b",
    "a=b",
    "[1]",
    "{a: 1}",
    "(x)",
    "it's",
    'say "hi"',
    "both ' and \"",
    "a\\",
    "\\",
    "a\\'b",
    "\\\\'",
    "tab\there",
    "new\nline",
    "héllo",
    "${a.b}",
    "${oc.env:A,b}",
    "a\\,b",
    "/path/to/x.txt",
    "choice(1,2)",
    "range(3)",
    "-",
    "$",
    "%",
    "a\\",
    "x'",
    [],
    [1, "a", None, [True, ["b c", "1"]]],
    ["a\\", "b"],
    {},
    {"a": 1, "b": [2, "c,d"]},
    {"a b": "c", "x:y": 1, "p=q": {"r": None}, 1: "one", 2.5: "f", None: "n", False: "t"},
    {"a\\": "b", "(k)": 1, "[k]": 2, "tab\tk": 3},
    Choice((1, "a", [2], None)),
    Choice(("a\\", "b")),
    Choice(("x",)),
    Choice(()),
    Distribution("uniform", -1, 1.5),
    Distribution("loguniform", 1e-5, 0.1),
    Distribution("randint", 0, 10),
]


@pytest.mark.parametrize("value", ROUND_TRIP, ids=repr)
def test_format_value_round_trips(value: Any) -> None:
    assert typed(parse_value(format_value(value))) == typed(value)


@pytest.mark.parametrize(
    "value", [v for v in ROUND_TRIP if not isinstance(v, (Choice, Distribution))], ids=repr
)
def test_format_value_reads_back_in_hydra(hydra_parser: Any, value: Any) -> None:
    parsed = hydra_override(hydra_parser, "x=" + format_value(value))
    assert typed(parsed.value) == typed(value)


def test_format_value_style() -> None:
    assert format_value("abc") == "abc"
    assert format_value("a b") == "a b"
    assert format_value("1") == "'1'"
    assert format_value("it's") == '"it\'s"'
    assert format_value([1, "x", None]) == "[1, x, null]"
    assert format_value({"a": True}) == "{a: true}"
    assert format_value(Choice((1, 2))) == "1, 2"


@pytest.mark.parametrize(
    "value",
    [{"1": 0}, {"": 0}, {"é": 0}, {"a'b": 0}, Choice((None,)), (1, 2), {1, 2}, b"x"],
    ids=repr,
)
def test_format_value_rejects_unrepresentable(value: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        format_value(value)
