"""Issue 25's proof on the real test cluster: 81 trials of a learning curve whose ranking is
known, ASHA with ``max_parallel: 8`` and no driver; some trials requeued by ``scontrol requeue``
between rungs. The best trial runs every epoch, at least half are PRUNED at rungs, the epochs
run in all are at most a third of running every trial to the end, no decision changes under
requeue, no epoch is reported twice, and every trial ends COMPLETED or PRUNED."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, slurm_submit

from slurmkit.core import search
from slurmkit.sweepstate import collect

pytestmark = pytest.mark.cluster

TRIALS, EPOCHS = 81, 27
PAYLOAD = ROOT / "tests" / "payloads" / "asha_curve.py"
SPEC = f"""
name: asha81
command: [python, {PAYLOAD}]
params: {{i: 'range(0,{TRIALS})', epochs: [{EPOCHS}], epoch_time: [0.25]}}
search: {{method: asha, metric: val_loss, mode: min, resource: step, min_resource: 1,
          max_resource: {EPOCHS}, reduction_factor: 3}}
max_parallel: 8
requeue: {{budgets: {{preemption: 5}}}}
"""
RUNGS = (1, 3, 9)


def _trials(root: Path) -> dict[str, dict]:
    return {
        row["id"]: row for row in map(json.loads, (root / "trials.jsonl").read_text().splitlines())
    }


def _epochs_run(trial: Path) -> list[int]:
    path = trial / "epochs.txt"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _mid_rung(root: Path, taken: set[str]) -> list[tuple[str, str, dict]]:
    """Running trials between two rungs (3 and 9), or past the last with a few epochs to go:
    the trial id, its array task, and its decisions so far."""
    found = []
    for trial in (root / "trials").iterdir():
        epochs = _epochs_run(trial)
        status_file = trial / "status.json"
        if trial.name in taken or not epochs or not status_file.exists():
            continue
        status = json.loads(status_file.read_text())
        last = status["attempts"][-1] if status.get("attempts") else {}
        if status.get("state") != "RUNNING" or "array_task_id" not in last:
            continue
        if RUNGS[1] < epochs[-1] < RUNGS[2] - 1 or RUNGS[2] < epochs[-1] < EPOCHS - 4:
            ref = f"{last['array_job_id']}_{last['array_task_id']}"
            found.append((trial.name, ref, search.decisions(str(trial)) or {"rungs": []}))
    return found


def test_asha_on_81_trials_with_requeues(slurm_cluster, tmp_path):
    result = slurm_submit(tmp_path, SPEC)
    root = Path(result["sweep_dir"])
    preempted: dict[str, dict] = {}  # trial id -> its decisions when it was requeued
    refs: list[str] = []
    deadline = time.monotonic() + 150
    while len(preempted) < 3 and time.monotonic() < deadline:
        for trial_id, ref, decided in _mid_rung(root, set(preempted))[: 3 - len(preempted)]:
            slurm_cluster.run("scontrol", "requeue", ref)
            preempted[trial_id], _ = decided, refs.append(ref)
        if collect(str(root), with_metrics=False).finished:
            break
        time.sleep(0.2)
    assert len(preempted) >= 2, "too few trials were caught between rungs"
    for ref in refs:
        slurm_cluster.release_requeued(ref)
    final = slurm_cluster.finish(str(root), timeout=240)

    counts = final["counts"]
    assert set(counts) <= {"COMPLETED", "PRUNED"} and sum(counts.values()) == TRIALS, counts
    assert counts["PRUNED"] >= TRIALS / 2, counts
    rows = _trials(root)
    by_q = {37 * row["params"]["i"] % 81: tid for tid, row in rows.items()}
    best = root / "trials" / by_q[0]
    assert json.loads((best / "status.json").read_text())["state"] == "COMPLETED"
    assert _epochs_run(best) == list(range(1, EPOCHS + 1))  # every epoch, once

    run = 0
    for tid in rows:
        trial = root / "trials" / tid
        epochs = _epochs_run(trial)
        run += len(epochs)
        lines = (trial / "metrics.jsonl").read_text().splitlines()
        steps = [json.loads(line)["step"] for line in lines]
        assert steps == list(range(1, len(steps) + 1)) == epochs, (tid, steps, epochs)
        known = search.decisions(str(trial))
        decided = [r["rung"] for r in known["rungs"]]
        assert decided == list(range(len(decided))), known  # each rung once, in order
        state = json.loads((trial / "status.json").read_text())["state"]
        assert known["pruned"] == (state == "PRUNED"), (tid, state, known)
        assert all(r["decision"] == "continue" for r in known["rungs"][:-1])
        assert all(r["reached"] == RUNGS[r["rung"]] for r in known["rungs"])  # judged on time
    assert run <= TRIALS * EPOCHS / 3, run

    resumed = 0
    for tid, before in preempted.items():
        trial = root / "trials" / tid
        after = search.decisions(str(trial))["rungs"]
        assert after[: len(before["rungs"])] == before["rungs"]  # no decision changed
        attempts = json.loads((trial / "status.json").read_text())["attempts"]
        resumed += len(attempts) >= 2 and attempts[0]["cause"] == "preemption"
    assert resumed >= 2, preempted  # (a requeue may come as a trial ends: it then ran once)
    print(f"asha81: {counts}, {run} epochs of {TRIALS * EPOCHS}, {resumed} trials requeued")

    shown = run_cli("status", str(root))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    report = json.loads(run_cli("report", str(root), "--json").stdout)["sweeps"][0]["search"]
    assert report["pruned"] == counts["PRUNED"] and report["run_s"]["saved"] > 0
