"""`slurmkit report` of a search sweep (issue 25, item 5): PRUNED trials used their hours
(useful, no failure), and the report estimates what the search saved against running every
trial to max_resource."""

from __future__ import annotations

import json

import pytest
from asha_fixtures import run_search
from conftest import run_cli

from slurmkit import usage
from slurmkit.usage import TrialReport, saved
from slurmkit.usagejoin import Attempt


def test_report_of_a_local_search_sweep_estimates_the_run_time_saved(tmp_path):
    root, _ = run_search(tmp_path)  # a trial pruned at epoch E ran 10 * E s (asha_fixtures)
    found = usage.collect([str(root)])
    figs = found.sweeps[0].figures
    assert figs["states"] == {"COMPLETED": 3, "PRUNED": 6}
    assert (figs["successful"], figs["failed"], figs["failure_rate"]) == (3, 0, 0.0)
    assert figs["outcomes"] == {"completed": 3, "pruned": 6}
    search = figs["search"]
    assert (search["pruned"], search["unestimated"]) == (6, 0)
    # 4 pruned at epoch 1 (10 s, 8 more units each), 2 at epoch 3 (30 s, 2x more each)
    assert search["run_s"]["saved"] == pytest.approx(4 * 10 * 8 + 2 * 30 * 2, abs=0.5)
    assert search["run_s"]["spent"] == pytest.approx(3 * 90 + 4 * 10 + 2 * 30, abs=0.5)
    assert search["run_s"]["share"] == pytest.approx(440 / 810, abs=0.01)  # 9 trials x 90 s
    assert search["gpu_hours"] is None and search["cpu_hours"] is None  # no accounting
    assert found.totals["search"]["run_s"]["saved"] == search["run_s"]["saved"]
    trial = found.sweeps[0].trials[6].as_dict()
    assert trial["state"] == "PRUNED" and trial["unrun"] == 8.0


def test_report_cli_says_what_the_search_saved(tmp_path):
    root, _ = run_search(tmp_path)
    shown = run_cli("report", str(root), env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    text = " ".join((shown.stdout + shown.stderr).split())
    assert "the search pruned 6 trial(s) and saved about 7m20s of run time (54% of" in text
    data = json.loads(run_cli("report", str(root), "--json").stdout)
    assert data["sweeps"][0]["search"]["pruned"] == 6


def test_a_sweep_without_a_search_reports_no_search(tmp_path):
    from test_papercuts import _sweep

    figs = usage.collect([str(_sweep(tmp_path, 2))]).sweeps[0].figures
    assert "search" not in figs


def _attempt(state: str, outcome: str, hours: float) -> Attempt:
    a = Attempt(1, "1_0", state, None, outcome, unit="gpu", units=4, run_s=hours * 900)
    a.useful_hours = hours
    return a


def test_the_gpu_hours_saved_by_pruning():
    trials = [
        TrialReport(0, "a", "COMPLETED", [_attempt("COMPLETED", "completed", 27.0)], 0.0, True),
        TrialReport(1, "b", "PRUNED", [_attempt("PRUNED", "pruned", 1.0)], 26.0, True),
        TrialReport(2, "c", "PRUNED", [_attempt("PRUNED", "pruned", 3.0)], 8.0, True),
        TrialReport(3, "d", "PRUNED", [_attempt("PRUNED", "pruned", 2.0)], None, True),
    ]
    found = saved(trials)
    assert (found["pruned"], found["unestimated"]) == (3, 1)
    assert found["gpu_hours"] == {"saved": 26.0 + 24.0, "spent": 33.0, "share": 50 / 83}
    assert found["cpu_hours"] is None


def test_a_damaged_search_json_is_a_warning_and_not_counted(tmp_path):
    root, final = run_search(tmp_path)
    pruned = next(i for i, s in final.items() if s == "PRUNED")
    tid = json.loads((root / "trials.jsonl").read_text().splitlines()[pruned])["id"]
    (root / "trials" / tid / "search.json").write_text("{nope")
    found = usage.collect([str(root)])
    assert found.sweeps[0].figures["search"]["unestimated"] == 1
    assert any("search.json" in w and "not counted" in w for w in found.warnings)


def test_prometheus_has_what_the_search_saved(tmp_path):
    from slurmkit import usageout

    root, _ = run_search(tmp_path)
    text = usageout.prometheus(usage.collect([str(root)]))
    line = next(x for x in text.splitlines() if x.startswith("slurmkit_report_search_saved{"))
    assert 'unit="run_seconds"' in line and float(line.rsplit(" ", 1)[1]) == pytest.approx(
        440, abs=1
    )
    assert "# TYPE slurmkit_report_search_saved gauge" in text
    assert 'unit="gpu_hours"' not in text  # no accounting: not known
