"""What ``slurmkit.report()`` writes for the values it is given (runtime/report.py): plain
Python scalars as they are, anything else as JSON gives it back (numpy/torch scalars by their
``item()``), so metrics.json and metrics.jsonl hold the same values either way."""

from __future__ import annotations

import enum
import json
import multiprocessing
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmkit.runtime.report import report


class Scalar:
    """A numpy/torch scalar's duck type: a value behind ``item()``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


class Level(enum.IntEnum):
    HIGH = 3


def written(trial) -> tuple[dict, list[dict]]:
    latest = json.loads((trial / "metrics.json").read_text())
    lines = [json.loads(x) for x in (trial / "metrics.jsonl").read_text().splitlines()]
    return latest, lines


@pytest.fixture
def trial(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMKIT_TRIAL_DIR", str(tmp_path))
    monkeypatch.delenv("SLURMKIT_SEARCH", raising=False)
    return tmp_path


def test_scalars_with_item_become_numbers(trial):
    report(step=3, loss=Scalar(0.25), acc=Scalar(1))
    latest, lines = written(trial)
    assert latest == {"loss": 0.25, "acc": 1, "step": 3}
    assert {k: lines[0][k] for k in ("step", "loss", "acc")} == {"step": 3, "loss": 0.25, "acc": 1}


def test_keys_and_subclasses_come_back_as_json_gives_them(trial):
    report({1: Level.HIGH, "flag": True, "nested": {"a": (1, 2)}})
    latest, lines = written(trial)
    assert latest == {"1": 3, "flag": True, "nested": {"a": [1, 2]}}
    assert type(latest["1"]) is int and lines[0]["1"] == 3


def test_later_reports_merge_into_metrics_json(trial):
    report(step=1, loss=1.0)
    report(step=2, acc=0.5)
    latest, lines = written(trial)
    assert latest == {"loss": 1.0, "acc": 0.5, "step": 2}
    assert [x["step"] for x in lines] == [1, 2]
    assert (trial / "metrics.json").read_text().count("\n") == 1  # one line: written every report


def test_a_value_json_cannot_hold_is_refused_by_name(trial):
    with pytest.raises(TypeError, match="not JSON-serializable"):
        report(loss=object())
    assert not (trial / "metrics.json").exists()


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
)


@settings(max_examples=60, deadline=None)
@given(values=st.dictionaries(st.text(min_size=1, max_size=5), scalars, max_size=5))
def test_plain_values_are_written_as_the_json_round_trip_gives_them(tmp_path_factory, values):
    trial = tmp_path_factory.mktemp("t")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURMKIT_TRIAL_DIR", str(trial))
        mp.delenv("SLURMKIT_SEARCH", raising=False)
        report(values)
    latest, lines = written(trial)
    want = json.loads(json.dumps(values))
    assert latest == want
    assert {k: v for k, v in lines[0].items() if k != "time"} == {
        k: v for k, v in want.items() if k != "time"
    }


def _reporter(directory: str, rank: int, count: int) -> None:
    os.environ["SLURMKIT_TRIAL_DIR"] = directory
    for step in range(count):
        report(step=step, rank=rank, pad="x" * 3000)


def test_processes_reporting_at_once_append_whole_lines(trial):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_reporter, args=(str(trial), rank, 50)) for rank in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    lines = [json.loads(x) for x in (trial / "metrics.jsonl").read_text().splitlines()]
    assert sorted((x["rank"], x["step"]) for x in lines) == [
        (r, s) for r in range(4) for s in range(50)
    ]
