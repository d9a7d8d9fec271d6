"""Damaged files never make a sweep unreadable: a damaged trial is DAMAGED (and named in a
warning), everything else keeps working, resume runs it again; hand-edited ids that could
reach outside the sweep directory are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PAYLOAD, first_fast, local_sweep, run_cli


@pytest.fixture
def sweep(tmp_path) -> Path:
    proc, result = local_sweep(
        tmp_path, f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2, 3, 4]}}\n"
    )
    assert proc.returncode == 0, proc.stderr
    return Path(result["sweep_dir"])


def _ids(root: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (root / "trials.jsonl").read_text().splitlines()]


def _status(root: Path) -> tuple[int, dict, str]:
    proc = run_cli("status", str(root), "--json")
    assert "Traceback" not in proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize(
    "damage", first_fast("truncated", "garbage", "a list", "bad attempts", "binary")
)
def test_a_damaged_status_file_is_one_damaged_trial(sweep, damage):
    path = sweep / "trials" / _ids(sweep)[1] / "status.json"
    text = path.read_text()
    path.write_bytes(
        {
            "truncated": text[: len(text) // 2].encode(),
            "garbage": b"}{ not json",
            "a list": b"[1, 2]",
            "bad attempts": b'{"state": "RUNNING", "attempts": 3}',
            "binary": b"\xff\xfe\x00",
        }[damage]
    )
    code, st, err = _status(sweep)
    assert code == 1  # a damaged trial is not a success
    assert [t["state"] for t in st["trials"]] == ["COMPLETED", "DAMAGED", "COMPLETED", "COMPLETED"]
    assert st["counts"] == {"COMPLETED": 3, "DAMAGED": 1}
    assert str(path) in err and err.count("warning:") == 1 and str(path) in st["warnings"][0]
    table = run_cli("status", str(sweep))
    assert table.returncode == 1 and "DAMAGED" in table.stdout and "Traceback" not in table.stderr
    results = run_cli("results", str(sweep), "--json", "--sort", "score")
    assert results.returncode == 0 and str(path) in results.stderr
    assert [r["state"] for r in json.loads(results.stdout)].count("DAMAGED") == 1
    assert run_cli("cancel", str(sweep)).returncode == 0
    again = run_cli("sweep", "--resume", str(sweep), "--backend", "local", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["indices"] == [1]  # damaged is not completed: it runs again
    code, st, _ = _status(sweep)
    assert code == 0 and st["counts"] == {"COMPLETED": 4} and "warnings" not in st
    assert len(list(path.parent.glob("status.json.damaged-*"))) == 1  # kept, not lost


@pytest.mark.slow
def test_damaged_metrics_and_submission_records_cost_only_themselves(sweep):
    (sweep / "trials" / _ids(sweep)[2] / "metrics.json").write_text("{'score': ")
    (sweep / "submissions" / "0007.json").write_text("not json")
    proc = run_cli("results", str(sweep), "--json")
    assert proc.returncode == 0 and proc.stderr.count("warning:") == 2, proc.stderr
    rows = json.loads(proc.stdout)
    assert [("score" in r) for r in rows] == [True, True, False, True]
    assert _status(sweep)[0] == 0


@pytest.mark.slow
def test_a_damaged_manifest_line_is_a_damaged_trial(sweep):
    lines = (sweep / "trials.jsonl").read_text().splitlines()
    lines[3] = lines[3][:20]
    (sweep / "trials.jsonl").write_text("\n".join(lines) + "\n")
    code, st, err = _status(sweep)
    assert code == 1 and [t["state"] for t in st["trials"]][3] == "DAMAGED"
    assert "trials.jsonl:4" in err
    assert run_cli("logs", str(sweep), "3").returncode == 2
    assert run_cli("logs", str(sweep), "0").returncode == 0


@pytest.mark.slow
def test_a_damaged_sweep_json_still_shows_status_but_resume_says_why(sweep):
    (sweep / "sweep.json").write_text('{"name": ')
    code, st, err = _status(sweep)
    assert code == 0 and st["name"] == sweep.name and "sweep.json" in err
    proc = run_cli("sweep", "--resume", str(sweep), "--backend", "local")
    assert proc.returncode == 2 and "sweep.json" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("bad_id", first_fast("../../escape", "a/b", "..", ""))
def test_ids_that_could_leave_the_sweep_directory_are_refused(sweep, bad_id):
    lines = (sweep / "trials.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    lines[0] = json.dumps({**row, "id": bad_id})
    (sweep / "trials.jsonl").write_text("\n".join(lines) + "\n")
    for args in (
        ["status", str(sweep)],
        ["results", str(sweep)],
        ["cancel", str(sweep)],
        ["sweep", "--resume", str(sweep), "--backend", "local"],
    ):
        proc = run_cli(*args)
        assert proc.returncode == 2 and "is not a trial id" in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_duplicate_ids_are_refused(sweep):
    lines = (sweep / "trials.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    lines[1] = json.dumps({**second, "id": json.loads(lines[0])["id"]})
    (sweep / "trials.jsonl").write_text("\n".join(lines) + "\n")
    proc = run_cli("status", str(sweep))
    assert proc.returncode == 2 and "comes twice" in proc.stderr


@pytest.mark.slow
def test_cancel_and_resume_say_what_is_damaged(sweep):
    (sweep / "submissions" / "0009.json").write_text("{")
    for args in (["cancel", str(sweep)], ["sweep", "--resume", str(sweep), "--backend", "local"]):
        proc = run_cli(*args)
        assert proc.returncode == 0 and "0009.json" in proc.stderr and "warning:" in proc.stderr
