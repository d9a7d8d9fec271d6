"""PRUNED where people look (issue 25, item 5): `status` counts it apart and exits 0, `results`
shows the rungs reached sorted by the search's metric, `sweep --resume` leaves pruned trials
alone and `--resume --unprune` runs them again, exempt; the Python API the same."""

from __future__ import annotations

import json
import re

import pytest
from asha_fixtures import run_search
from conftest import ROOT, run_cli

import slurmkit
from slurmkit import steer, sweep, sweepstate
from slurmkit.core import search


def test_status_counts_pruned_apart_and_is_no_failure(tmp_path):
    root, final = run_search(tmp_path)
    current = sweepstate.collect(str(root))
    assert current.counts == {"COMPLETED": 3, "PRUNED": 6}
    assert current.ok and not current.failed and current.finished
    assert {t.index: t.state for t in current.trials} == final
    shown = run_cli("status", str(root))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"COMPLETED 3\s+PRUNED 6", shown.stdout), shown.stdout


def test_status_of_a_search_sweep_with_a_failed_trial_exits_1(tmp_path):
    root, _ = run_search(tmp_path, end={3: "FAILED"})
    shown = run_cli("status", str(root), "--json")
    assert shown.returncode == 1
    assert json.loads(shown.stdout)["counts"] == {"COMPLETED": 3, "PRUNED": 5, "FAILED": 1}


def test_status_json_has_the_search_and_each_trials_rungs(tmp_path):
    root, _final = run_search(tmp_path)
    data = json.loads(run_cli("status", str(root), "--json").stdout)
    assert data["search"]["metric"] == "val_loss" and data["search"]["max_resource"] == 9
    by_index = {t["index"]: t for t in data["trials"]}
    assert [r["resource"] for r in by_index[0]["rungs"]] == [1, 3]  # completed: both rungs
    assert [r["resource"] for r in by_index[6]["rungs"]] == [1]  # pruned at the first
    assert by_index[6]["rungs"][0]["value"] == pytest.approx(0.6 + 1)
    assert by_index[2]["rungs"][1] == {"rung": 1, "resource": 3, "value": 0.2 + 1 / 3}
    for record in (root / "search" / "rung-0").glob(f"*~{by_index[6]['id']}"):
        record.unlink()  # as if it had not reached its first rung yet
    again = sweepstate.collect(str(root)).as_dict()["trials"]
    assert next(t for t in again if t["index"] == 6)["rungs"] == []


def test_a_sweep_without_a_search_shows_no_rungs(tmp_path):
    from test_papercuts import _sweep

    data = sweepstate.collect(str(_sweep(tmp_path, 2))).as_dict()
    assert "search" not in data and all("rungs" not in t for t in data["trials"])


def test_results_show_the_rungs_sorted_by_the_metric(tmp_path):
    root, _final = run_search(tmp_path)
    rows, columns, warnings = steer.results_table(str(root))
    assert not warnings
    assert columns[-3:] == ["rung", "val_loss@1", "val_loss@3"]
    losses = [r["val_loss"] for r in rows]
    assert losses == sorted(losses)
    assert rows[0]["q"] == 0 and rows[0]["state"] == "COMPLETED" and rows[0]["rung"] == 1
    pruned = next(r for r in rows if r["q"] == 6)
    assert pruned["state"] == "PRUNED" and pruned["rung"] == 0
    assert pruned["val_loss@1"] == pytest.approx(1.6) and "val_loss@3" not in pruned
    assert next(r for r in rows if r["q"] == 2)["val_loss@3"] == pytest.approx(0.2 + 1 / 3)


def test_results_of_a_max_search_put_the_largest_first(tmp_path):
    root, _ = run_search(tmp_path, mode="max")
    rows, _, _ = steer.results_table(str(root))
    values = [r["val_loss"] for r in rows]
    assert values == sorted(values, reverse=True) and rows[0]["q"] == 0


def test_results_sort_given_beats_the_search_metric(tmp_path):
    root, _ = run_search(tmp_path)
    rows, _, _ = steer.results_table(str(root), "q", desc=True)
    assert [r["q"] for r in rows] == list(range(8, -1, -1))


def test_results_cli_shows_the_state_column_and_rungs(tmp_path):
    root, _ = run_search(tmp_path)
    shown = run_cli("results", str(root), "--limit", "4", env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "PRUNED" in shown.stdout and "val_loss@3" in shown.stdout and "rung" in shown.stdout
    rows = json.loads(run_cli("results", str(root), "--json").stdout)
    assert [r["q"] for r in rows][:3] == [0, 1, 4]  # q=1: pruned at epoch 3 with 0.1 + 1/3


def test_resume_never_reruns_a_pruned_trial(tmp_path):
    root, _final = run_search(tmp_path, end={5: "FAILED"})
    done = sweep.resume(str(root), backend="local", dry_run=True)
    assert done.indices == [5]


def test_resume_unprune_dry_run_names_the_pruned_trials_and_writes_nothing(tmp_path):
    root, final = run_search(tmp_path)
    before = {p: p.read_bytes() for p in root.glob("trials/*/search.json")}
    done = sweep.resume(str(root), backend="local", dry_run=True, unprune=True)
    assert done.indices == sorted(i for i, s in final.items() if s == "PRUNED")
    assert before == {p: p.read_bytes() for p in root.glob("trials/*/search.json")}


def test_resume_unprune_runs_the_pruned_trials_exempt(tmp_path):
    root, final = run_search(tmp_path, command="['true']")
    records = {k: search.rung_values(str(root), k) for k in (0, 1)}
    ran = run_cli("sweep", "--resume", str(root), "--unprune", "--backend", "local", "--json")
    assert ran.returncode == 0, ran.stderr
    pruned = sorted(i for i, s in final.items() if s == "PRUNED")
    assert json.loads(ran.stdout)["indices"] == pruned
    current = sweepstate.collect(str(root))
    for t in current.trials:
        known = search.decisions(str(root / "trials" / t.id))
        if t.index in pruned:
            assert known["exempt"] is True and known["pruned"] is False
            assert known["rungs"][-1]["decision"] == "pruned"  # what was decided stays
            assert t.state == "COMPLETED"  # ran again, to its end
        else:
            assert "exempt" not in known and t.state == "COMPLETED"
    assert records == {k: search.rung_values(str(root), k) for k in (0, 1)}  # others' ground


def test_an_unpruned_trial_runs_to_its_end(tmp_path):
    root, final = run_search(tmp_path, command="['true']")
    sweep.resume(str(root), backend="local", unprune=True)
    current = sweepstate.collect(str(root))
    assert current.counts == {"COMPLETED": 9}, current.counts
    for t in current.trials:  # the pruned attempt is kept, the new one added
        assert t.attempts == (2 if final[t.index] == "PRUNED" else 1), t
    again = sweep.resume(str(root), backend="local", dry_run=True, unprune=True)
    assert again.indices == []


def test_unprune_needs_resume_and_adds_nothing_without_a_search(tmp_path):
    from test_papercuts import _sweep

    plain = _sweep(tmp_path, 2)
    done = sweep.resume(str(plain), backend="local", dry_run=True, unprune=True)
    assert done.indices == [0, 1]  # never run: as a plain resume
    spec = tmp_path / "s.yaml"
    ran = run_cli("sweep", str(spec), "--unprune")
    assert ran.returncode == 2 and "--unprune goes with --resume" in ran.stderr


def test_the_python_api_shows_the_same(tmp_path):
    root, _ = run_search(tmp_path)
    sw = slurmkit.Sweep.open(str(root))
    assert sw.status().counts == {"COMPLETED": 3, "PRUNED": 6}
    assert slurmkit.status(str(root)).counts == {"COMPLETED": 3, "PRUNED": 6}
    rows = sw.results()
    assert rows[0]["q"] == 0 and rows[0]["val_loss@3"] == pytest.approx(1 / 3)
    assert [r["rung"] for r in rows if r["state"] == "PRUNED"].count(0) == 4
    assert next(t.rungs for t in sw.status().trials if t.index == 2)[1]["resource"] == 3


def test_the_exit_code_table_says_pruned_is_no_failure(tmp_path):
    from test_papercuts import _table_rows

    row = _table_rows()[0].replace("`", "")
    assert "whose trials all COMPLETED or were PRUNED" in row
    root, _ = run_search(tmp_path)
    assert run_cli("status", str(root)).returncode == 0
    assert ROOT.joinpath("README.md").read_text().count("--unprune") >= 2


def test_a_local_search_sweep_says_how_many_were_pruned(tmp_path):
    from slurmkit import ui
    from slurmkit.backends.base import Submission

    root, _ = run_search(tmp_path)
    ran = Submission(str(root), "local", 9, list(range(9)), ran_here=True)
    ran.exit_codes = dict.fromkeys(range(9), 0)
    with ui.out.capture() as seen:
        ui.print_submission(ran)
    assert "ran 9 trial(s) locally: 3 completed, 6 pruned" in seen.get()
    ran.exit_codes = {0: 0, 6: 0}  # a resume that ran two of them: one completed, one pruned
    with ui.out.capture() as seen:
        ui.print_submission(ran)
    assert "ran 2 trial(s) locally: 1 completed, 1 pruned" in seen.get()


def test_unprune_leaves_a_claimed_trial_alone_and_mends_a_damaged_search_json(tmp_path):
    from slurmkit import searchview
    from slurmkit.core.lock import Lock
    from slurmkit.errors import Busy

    root, final = run_search(tmp_path)
    ids = {t.index: t.id for t in sweepstate.collect(str(root)).trials}
    first, second = [root / "trials" / ids[i] for i in sorted(final) if final[i] == "PRUNED"][:2]
    claim = Lock(str(first))
    claim.acquire("trial", 0)
    try:
        with pytest.raises(Busy, match="locked by"):
            searchview.unprune(str(first))
    finally:
        claim.release()
    assert json.loads((first / "status.json").read_text())["state"] == "PRUNED"
    (second / "search.json").write_text("{nope")
    searchview.unprune(str(second))
    assert search.decisions(str(second))["exempt"] is True
    status = json.loads((second / "status.json").read_text())
    assert status["state"] == "NOT_SUBMITTED" and len(status["attempts"]) == 1
    assert sweepstate.collect(str(root)).trials[0].state == "COMPLETED"


@pytest.mark.slow
def test_a_local_search_sweep_through_the_cli_exits_0(tmp_path):
    """The exit-code table's first row, run: a sweep whose trials COMPLETED or were PRUNED."""
    curve = ROOT / "tests" / "payloads" / "curve.py"
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"command: [python, {curve}]\nparams: {{q: [0.3, 0.1, 0.2, 0.0, 0.4, 0.5]}}\n"
        f"search: {{metric: val_loss, max_resource: 9}}\nmax_parallel: 1\n"
        f"output_root: {tmp_path / 'runs'}\n"
    )
    ran = run_cli("sweep", str(spec), "--backend", "local")
    assert ran.returncode == 0, ran.stderr
    assert re.search(r"ran 6 trial\(s\) locally: \d completed, \d pruned", ran.stdout), ran.stdout
    (root,) = (tmp_path / "runs").iterdir()
    shown = run_cli("status", str(root), "--json")
    assert shown.returncode == 0 and "PRUNED" in json.loads(shown.stdout)["counts"]
    rows = json.loads(run_cli("results", str(root), "--json").stdout)
    assert rows[0]["q"] == 0.0 and rows[0]["state"] == "COMPLETED" and rows[0]["step"] == 9
