"""The trial's side of the search: report() records and judges at rungs, raises Pruned, keeps
its decisions under requeue, and every rank follows rank 0; the runtime ends a pruned trial
PRUNED with exit 0, on every backend's path (TrialRun) and in function sweeps."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from pathlib import Path

import pytest

import slurmkit
from slurmkit.core import search, states
from slurmkit.core.jobcontract import JobContract
from slurmkit.core.layout import SweepDir
from slurmkit.runtime import pruning
from slurmkit.runtime.report import report
from slurmkit.runtime.trial import TrialRun

SEARCH = {"metric": "val_loss", "max_resource": 27, "min_resource": 1, "reduction_factor": 3}
CURVE = str(Path(__file__).parent / "payloads" / "curve.py")


class Process:
    """One trial's process: its environment, and a fresh pruning state (as a new process has)."""

    def __init__(self, monkeypatch, root: Path, trial: str, rank: int = 0, **search_kw) -> None:
        self.dir = root / "trials" / trial
        self.dir.mkdir(parents=True, exist_ok=True)
        self.monkeypatch = monkeypatch
        self.env = {
            "SLURMKIT_TRIAL_DIR": str(self.dir),
            pruning.ENV: json.dumps({**SEARCH, **search_kw}),
            "RANK": str(rank),
        }

    def __enter__(self) -> Process:
        pruning.forget()
        for k, v in self.env.items():
            self.monkeypatch.setenv(k, v)
        return self

    def __exit__(self, *exc: object) -> None:
        pruning.forget()

    def decisions(self) -> dict:
        return search.decisions(str(self.dir)) or {}

    def epochs(self) -> list[int]:
        lines = (self.dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["step"] for line in lines]


def run_curve(monkeypatch, root: Path, trial: str, q: float, epochs: int = 27, start: int = 1):
    """Report ``q + 1/epoch`` from ``start``; the epoch at which Pruned came, or None."""
    with Process(monkeypatch, root, trial):
        for epoch in range(start, epochs + 1):
            try:
                report(step=epoch, val_loss=q + 1 / epoch)
            except slurmkit.Pruned:
                return epoch
    return None


def test_report_records_judges_and_raises_pruned(monkeypatch, tmp_path):
    assert run_curve(monkeypatch, tmp_path, "best", 0.0) is None  # alone: always the best
    # second at rung 0 (two values: only the best continues)
    assert run_curve(monkeypatch, tmp_path, "worse", 1.0) == 1
    assert search.rung_values(str(tmp_path), 0) == {"best": 1.0, "worse": 2.0}
    assert search.rung_values(str(tmp_path), 2) == {"best": 1 / 9}
    assert search.rung_values(str(tmp_path), 3) == {}  # no rung at max_resource
    with Process(monkeypatch, tmp_path, "worse") as p:
        d = p.decisions()
        assert d["pruned"] is True and len(d["rungs"]) == 1
        assert d["rungs"][0] | {"at": 0} == {
            "rung": 0,
            "resource": 1,
            "reached": 1,
            "value": 2.0,
            "seen": 2,
            "kept": 1,
            "threshold": 1.0,
            "decision": "pruned",
            "at": 0,
        }
        assert p.epochs() == [1]  # the report that was judged is kept in the metrics
    with Process(monkeypatch, tmp_path, "best") as p:
        assert [r["decision"] for r in p.decisions()["rungs"]] == ["continue"] * 3
        assert p.epochs() == list(range(1, 28))


def test_between_rungs_nothing_is_read_or_written(monkeypatch, tmp_path):
    with Process(monkeypatch, tmp_path, "t"):
        report(step=1, val_loss=1.0)
        rung0 = sorted(os.listdir(search.rung_dir(str(tmp_path), 0)))
        report(step=2, val_loss=0.5)  # below rung 1 (3)
        assert not os.path.exists(search.rung_dir(str(tmp_path), 1))
        assert sorted(os.listdir(search.rung_dir(str(tmp_path), 0))) == rung0


def test_a_report_past_several_rungs_is_judged_at_each(monkeypatch, tmp_path):
    run_curve(monkeypatch, tmp_path, "a", 0.0)
    run_curve(monkeypatch, tmp_path, "b", 0.5)  # pruned at rung 0
    with Process(monkeypatch, tmp_path, "late") as p:
        report(step=10, val_loss=0.05)  # its first report: past rungs 0, 1 and 2
        assert [r["rung"] for r in p.decisions()["rungs"]] == [0, 1, 2]
        assert {r["reached"] for r in p.decisions()["rungs"]} == {10}


def test_the_metric_missing_waits_for_a_report_that_has_it(monkeypatch, tmp_path):
    with Process(monkeypatch, tmp_path, "t") as p:
        report(step=1, train_loss=3.0)
        assert p.decisions() == {}
        report(step=2, val_loss=1.0)
        assert p.decisions()["rungs"][0]["reached"] == 2


def test_another_resource_counts_that_key(monkeypatch, tmp_path):
    with Process(monkeypatch, tmp_path, "t", resource="epoch", max_resource=9) as p:
        report(step=100, val_loss=1.0)  # no epoch: not judged
        assert p.decisions() == {}
        report(step=200, epoch=1, val_loss=1.0)
        assert p.decisions()["rungs"][0]["reached"] == 1


def test_nan_is_pruned_at_a_rung_and_not_recorded(monkeypatch, tmp_path):
    with Process(monkeypatch, tmp_path, "t") as p:
        report(step=0, val_loss=math.nan)  # before the first rung: not judged
        with pytest.raises(slurmkit.Pruned):
            report(step=1, val_loss=math.nan)
        assert p.decisions()["rungs"][0]["value"] is None
    assert search.rung_values(str(tmp_path), 0) == {}


def test_a_pruned_trial_raises_again_on_any_report(monkeypatch, tmp_path):
    run_curve(monkeypatch, tmp_path, "a", 0.0)
    assert run_curve(monkeypatch, tmp_path, "b", 1.0) == 1
    # its process caught Pruned and reports again; a new attempt reports again
    pruned = pytest.raises(slurmkit.Pruned, match="pruned at rung 0")
    with Process(monkeypatch, tmp_path, "b"), pruned:
        report(step=2, val_loss=0.0)


def test_a_requeued_trial_keeps_its_decisions(monkeypatch, tmp_path):
    run_curve(monkeypatch, tmp_path, "a", 0.5)
    # "b" continues at rungs 0 and 1, then is preempted at epoch 5 (a new process resumes)
    with Process(monkeypatch, tmp_path, "b") as p:
        for epoch in range(1, 6):
            report(step=epoch, val_loss=0.0 + 1 / epoch)
        before = p.decisions()
    # others arrive meanwhile and would judge "b" differently now: its decisions stand
    for i in range(6):
        run_curve(monkeypatch, tmp_path, f"x{i}", -1.0, epochs=3)
    with Process(monkeypatch, tmp_path, "b") as p:
        report(step=3, val_loss=0.0 + 1 / 3)  # resumed from its checkpoint at step 2
        report(step=4, val_loss=0.25)
        assert p.decisions() == before
    assert set(search.rung_values(str(tmp_path), 1)) == {"a", "b", *(f"x{i}" for i in range(6))}


def test_a_trial_preempted_before_its_decision_decides_on_resume(monkeypatch, tmp_path):
    root = str(tmp_path)
    search.record(root, 0, "t", 1.0)  # its record was created, then the node died
    with Process(monkeypatch, tmp_path, "t") as p:
        report(step=1, val_loss=1.0)  # the same value after a bit-exact resume
        assert [r["rung"] for r in p.decisions()["rungs"]] == [0]
    assert len(os.listdir(search.rung_dir(root, 0))) == 1  # recorded once


def test_every_rank_follows_rank_0(monkeypatch, tmp_path):
    run_curve(monkeypatch, tmp_path, "a", 0.0)
    got: dict[int, object] = {}

    def rank(n: int, value: float) -> None:
        state = pruning.TrialSearch(
            search.Search.from_dict(SEARCH, "x"), str(tmp_path / "trials" / "b"), n
        )
        try:
            state.check(1, {"val_loss": value})
            got[n] = "continue"
        except slurmkit.Pruned:
            got[n] = "pruned"

    (tmp_path / "trials" / "b").mkdir()
    waiting = [threading.Thread(target=rank, args=(n, -5.0)) for n in (1, 2, 3)]
    for t in waiting:
        t.start()  # they wait for rank 0's decision (their own values would have continued)
    rank(0, 9.0)
    for t in waiting:
        t.join(10)
    assert got == {0: "pruned", 1: "pruned", 2: "pruned", 3: "pruned"}
    assert search.rung_values(str(tmp_path), 0) == {"a": 1.0, "b": 9.0}  # rank 0's alone


@pytest.mark.slow
def test_ranks_as_processes_stop_at_the_same_step(tmp_path):
    """Three processes of one trial (torchrun's RANK), rank 0 the slowest to start: they all
    stop at rank 0's pruning, at the same epoch."""
    import subprocess

    root = tmp_path
    run_best = [sys.executable, CURVE, "q=0", "epochs=9"]
    env = {**os.environ, pruning.ENV: json.dumps({**SEARCH, "max_resource": 9})}
    best = root / "trials" / "best"
    best.mkdir(parents=True)
    subprocess.run(run_best, env={**env, "SLURMKIT_TRIAL_DIR": str(best)}, check=True)
    tdir = root / "trials" / "t"
    tdir.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, CURVE, "q=1", "epochs=9"],
            env={**env, "SLURMKIT_TRIAL_DIR": str(tdir), "RANK": str(r), "WORLD_SIZE": "3"},
        )
        for r in (2, 1, 0)
    ]
    assert [p.wait(60) for p in procs] == [0, 0, 0]  # Pruned: exit 0 on every rank
    logs = ["epochs.txt", "epochs-rank1.txt", "epochs-rank2.txt"]
    assert [(tdir / name).read_text().split() for name in logs] == [["1"]] * 3
    assert search.rung_values(str(root), 0) == {"best": 1.0, "t": 2.0}  # rank 0's record only


def test_another_rank_needs_the_metric_key_not_its_value(monkeypatch, tmp_path):
    run_curve(monkeypatch, tmp_path, "a", 0.0)
    tdir = tmp_path / "trials" / "b"
    tdir.mkdir()
    s = search.Search.from_dict(SEARCH, "x")
    other = pruning.TrialSearch(s, str(tdir), 1)
    other.check(1, {"train_loss": 1.0})  # no metric key: not this rank's judging report
    zero = pruning.TrialSearch(s, str(tdir), 0)
    with pytest.raises(slurmkit.Pruned):
        zero.check(1, {"val_loss": 5.0})
    with pytest.raises(slurmkit.Pruned):
        other.check(1, {"val_loss": None})  # only rank 0's value counts


def test_a_rank_gives_up_when_rank_0_never_decides(monkeypatch, tmp_path):
    monkeypatch.setenv(pruning.ENV_WAIT, "0.05")
    (tmp_path / "trials" / "b").mkdir(parents=True)
    state = pruning.TrialSearch(search.Search.from_dict(SEARCH, "x"), str(tmp_path / "trials/b"), 1)
    with pytest.raises(RuntimeError, match="rank 0's decision at rung 0"):
        state.check(1, {"val_loss": 1.0})


def test_under_a_search_only_rank_0_writes_metrics(monkeypatch, tmp_path):
    with Process(monkeypatch, tmp_path, "t", rank=1) as p:
        monkeypatch.setenv(pruning.ENV_WAIT, "0.01")
        report(step=0, val_loss=1.0)
        assert not (p.dir / "metrics.jsonl").exists()
    with Process(monkeypatch, tmp_path, "t", rank=0) as p:
        report(step=0, val_loss=1.0)
        assert p.epochs() == [0]


def test_rank_comes_from_torchrun_or_the_slurm_step() -> None:
    assert pruning.rank_of({}) == 0
    assert pruning.rank_of({"RANK": "3"}) == 3
    assert pruning.rank_of({"SLURM_PROCID": "2"}) == 0  # the batch script: one process
    assert pruning.rank_of({"SLURM_PROCID": "2", "SLURM_STEP_ID": "0"}) == 2


def test_median_rule_judges_the_best_so_far(monkeypatch, tmp_path):
    for i, q in enumerate([0.0, 0.1, 0.2]):
        run_curve(monkeypatch, tmp_path, f"m{i}", q, epochs=3)
    with Process(monkeypatch, tmp_path, "t", method="median") as p:
        report(step=0, val_loss=0.5)  # its best so far: 0.5
        report(step=1, val_loss=3.0)  # worse than the median (1.1), but its best is not
        assert p.decisions()["rungs"][0]["threshold"] == pytest.approx(1.1)
        assert p.decisions()["rungs"][0]["decision"] == "continue"
    with Process(monkeypatch, tmp_path, "u", method="median"), pytest.raises(slurmkit.Pruned):
        report(step=1, val_loss=2.0)


# --- the runtime: a pruned trial ends PRUNED, exit 0 ----------------------------------------


def _sweep(tmp_path: Path, params: list[dict], **search_kw) -> SweepDir:
    root = tmp_path / "sweep"
    (root / "trials").mkdir(parents=True)
    rows = [{"index": i, "id": f"t{i}", "params": p} for i, p in enumerate(params)]
    (root / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = JobContract.from_dict(
        {
            "command": [sys.executable, CURVE],
            "search": {**SEARCH, "max_resource": 9, **search_kw},
        },
        "sweep.json",
    )
    (root / "sweep.json").write_text(json.dumps(cfg.to_dict()))
    return SweepDir(str(root))


def _run(sweep: SweepDir, index: int) -> tuple[int, dict]:
    run = TrialRun(sweep, index)
    if run.already_completed():
        return 0, run.status
    run.start()
    code = run.wait()
    return code, json.loads(Path(run.status_path).read_text())


def test_the_contract_carries_the_search():
    cfg = JobContract.from_dict({"search": SEARCH}, "sweep.json")
    assert cfg.search == search.Search.from_dict(SEARCH, "x")
    assert JobContract.from_dict(cfg.to_dict(), "x") == cfg
    assert "search" not in JobContract().to_dict()


@pytest.mark.slow
def test_a_pruned_trial_ends_pruned_with_exit_0(tmp_path):
    sweep = _sweep(tmp_path, [{"q": 0.0}, {"q": 1.0, "catch": 1}, {"q": 2.0, "nan_at": 2}])
    code, status = _run(sweep, 0)
    assert (code, status["state"]) == (0, states.COMPLETED)
    code, status = _run(sweep, 1)
    assert (code, status["state"], status["attempts"][-1]["state"]) == (0, "PRUNED", "PRUNED")
    trial = Path(sweep.trial("t1"))
    assert (trial / "cleaned").exists()  # it caught Pruned, cleaned up, and ended
    assert (trial / "epochs.txt").read_text().split() == ["1"]
    assert "pruned at rung 0" in (trial / "output.log").read_text()
    assert "Traceback" not in (trial / "output.log").read_text()
    # run again (a requeue, a resume): it is not run
    assert _run(sweep, 1) == (0, json.loads((trial / "status.json").read_text()))
    assert (trial / "epochs.txt").read_text().split() == ["1"]


def test_a_trial_stopped_after_its_pruning_decision_ends_pruned(tmp_path):
    """Fast twin: the decision is in search.json, the status still says RUNNING (its node
    died): the next run records PRUNED without running it."""
    sweep = _sweep(tmp_path, [{"q": 0.0}])
    trial = sweep.trial("t0")
    os.makedirs(trial)
    s = search.Search.from_dict(SEARCH, "x")
    search.write_decision(trial, search.decide(s, 0, "t0", math.nan, 1, {}))
    Path(sweep.status("t0")).write_text(
        json.dumps({"id": "t0", "index": 0, "attempts": [{"n": 1, "state": "RUNNING"}]})
    )
    code, status = _run(sweep, 0)
    assert (code, status["state"], status["exit_code"]) == (0, "PRUNED", 0)
    assert status["attempts"][0]["state"] == "PRUNED"
    assert not os.path.exists(os.path.join(trial, "epochs.txt"))


# --- every backend's path: the local backend through the CLI, and function sweeps ----------


@pytest.mark.slow
def test_a_local_sweep_with_a_search_prunes_and_exits_0(tmp_path):
    from conftest import local_sweep, run_cli

    proc, result = local_sweep(
        tmp_path,
        f"""
command: [python, {CURVE}]
params: {{q: [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], epochs: 9}}
max_parallel: 1
search: {{metric: val_loss, max_resource: 9, reduction_factor: 2}}
""",
    )
    assert proc.returncode == 0, proc.stderr
    st = run_cli("status", result["sweep_dir"], "--json")
    assert st.returncode == 0  # PRUNED is no failure
    trials = json.loads(st.stdout)["trials"]
    # one at a time, best first: each later trial is the worst at its first rung
    assert [t["state"] for t in trials] == ["COMPLETED"] + ["PRUNED"] * 5
    assert all(t["exit_code"] == 0 for t in trials)
    root = Path(result["sweep_dir"])
    ran = [len((root / "trials" / t["id"] / "epochs.txt").read_text().split()) for t in trials]
    assert ran == [9, 1, 1, 1, 1, 1]


@pytest.mark.slow
def test_a_function_sweep_reports_and_ends_pruned(tmp_path):
    def train(q: float) -> float:
        for epoch in range(1, 10):
            slurmkit.report(step=epoch, val_loss=q + 1 / epoch)
        return q

    sw = slurmkit.sweep_fn(
        train,
        {"q": [0.0, 1.0, 2.0]},
        backend="local",
        output_root=str(tmp_path / "runs"),
        max_parallel=1,
        search={"metric": "val_loss", "max_resource": 9},
        progress=False,
    )
    current = sw.status()
    assert current.counts == {"COMPLETED": 1, "PRUNED": 2} and current.ok
    assert [t.state for t in current.trials] == ["COMPLETED", "PRUNED", "PRUNED"]
    trials = Path(sw.sweep_dir) / "trials"
    kept = sorted(p.parent.name for p in trials.glob("*/result.pkl"))
    assert kept == [current.trials[0].id]  # a pruned call keeps no result


def test_an_unpruned_trial_is_judged_no_more(monkeypatch, tmp_path):
    run_curve(monkeypatch, tmp_path, "a", 0.0)
    assert run_curve(monkeypatch, tmp_path, "b", 1.0) == 1
    tdir = str(tmp_path / "trials" / "b")
    assert search.unprune(tdir) and not search.unprune(tdir)  # once
    assert run_curve(monkeypatch, tmp_path, "b", 1.0, start=2) is None  # to the end
    d = search.decisions(tdir)
    assert (d["pruned"], d["exempt"], len(d["rungs"])) == (False, True, 1)
    assert not search.unprune(str(tmp_path / "trials" / "a"))  # never pruned
