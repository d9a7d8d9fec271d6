"""Fuzzing the override parser: any text is an override, or an OverrideError that says where;
never another exception (and through the CLI never a traceback)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmkit.errors import SpecError
from slurmkit.overrides import OverrideError, parse_override, parse_value
from slurmkit.spec.layers import parse_cli

GRAMMAR = [
    *"=,()[]{}:'\"\\ \t$@~+-./*%?|#!&^;<>",
    *("range(", "choice(", "sort(", "uniform(", "randint(", "int(", "str(", "${", "}", "true"),
    *("null", "inf", "nan", "1e5", "0x1", "1_000", "é", "日", "\n", "\x00", "key", "a.b"),
]
texts = st.lists(st.one_of(st.sampled_from(GRAMMAR), st.text(max_size=3)), max_size=14).map("".join)


@pytest.mark.slow
@settings(max_examples=4000, deadline=None)
@given(texts)
def test_parse_override_raises_only_override_errors(text: str) -> None:
    try:
        parse_override(text)
    except OverrideError as exc:
        assert 0 <= exc.column <= len(text)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(texts)
def test_parse_value_raises_only_override_errors(text: str) -> None:
    try:
        parse_value(text)
    except OverrideError:
        pass


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(texts)
def test_command_line_overrides_are_spec_errors(text: str) -> None:
    try:
        parse_cli(text)
    except SpecError as exc:
        assert exc.file == "command line" and exc.message  # where, and what is wrong
