"""store.manifest: trials.jsonl read with one decode when every line is whole, line by line
otherwise; both ways give the same rows, the same damaged lines and the same refusals."""

from __future__ import annotations

import json

import pytest

from slurmkit import store
from slurmkit.core.layout import SweepDir
from slurmkit.errors import UserError


def row(index: int) -> bytes:
    return json.dumps({"index": index, "id": f"t{index:03d}abc", "params": {"x": index}}).encode()


def read(tmp_path, body: bytes) -> tuple[list, list[str]]:
    (tmp_path / "trials.jsonl").write_bytes(body)
    warnings: list[str] = []
    return store.manifest(SweepDir(str(tmp_path)), warnings), warnings


def test_a_whole_file_reads_in_one_decode(tmp_path, monkeypatch):
    calls = []
    real = json.loads
    monkeypatch.setattr(store.json, "loads", lambda s: calls.append(1) or real(s))
    rows, warnings = read(tmp_path, b"\n".join(row(i) for i in range(50)) + b"\n")
    assert [r["index"] for r in rows] == list(range(50)) and not warnings
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("line", "damaged"),
    [
        (b"", False),  # a blank line is skipped
        (b"   \t", False),
        (b'{"index": 1, "id": "t001abc", "params": {}}, 7', True),  # two values on one line
        (b"\xff\xfe not utf-8", True),
        (b'{"index": 1, "id": "t001abc"', True),  # truncated
        (b"[1, 2]", True),  # JSON, but no row
    ],
)
def test_one_bad_line_costs_only_itself(tmp_path, line, damaged):
    rows, warnings = read(tmp_path, b"\n".join([row(0), line, row(1 if not damaged else 2)]))
    if damaged:
        assert [r and r["index"] for r in rows] == [0, None, 2]
        assert len(warnings) == 1 and "trials.jsonl:2: damaged" in warnings[0]
    else:
        assert [r["index"] for r in rows] == [0, 1] and not warnings


@pytest.mark.parametrize("bad_id", ["../x", "a/b", 7])
def test_ids_that_could_leave_the_sweep_are_refused_on_both_paths(tmp_path, bad_id):
    bad = json.dumps({"index": 1, "id": bad_id, "params": {}}).encode()
    for body in (b"\n".join([row(0), bad]), b"\n".join([row(0), bad, b"{damaged"])):
        with pytest.raises(UserError, match="is not a trial id"):
            read(tmp_path, body)
