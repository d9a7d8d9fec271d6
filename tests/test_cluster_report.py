"""`slurmkit report` on the real test cluster (accounting in slurmdbd, four fake GPUs a node).

One sweep of four trials, one GPU each, a two-minute time limit: trial 0 is preempted by a job
of the `high` partition on its node, trial 1 trains past its time limit (it checkpoints when
the signal comes, is requeued and then finishes), trial 2 fails, trial 3 is cancelled. The
report's attempts, causes and GPU-hours must match what the test did and what Slurm itself says
(`scontrol`: restarts, start and end times; the runtime's records; the checkpoint journal the
Checkpointer wrote), and where the GPU-hours went (the requeue hold and the restart of each
requeued trial, as Slurm and the trial saw them)."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import run_cli, slurm_submit
from slurm_fixtures import epoch

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NODE = "n3"  # the preempted trial's node (the requeue tests preempt on n4)
PRICE = 2.0  # per GPU-hour of the default partition `low`
GRACE = 5  # `low`'s GraceTime (tests/cluster/slurm.conf.in)
# A trial without torch (it starts in a second, even on a loaded machine): it checkpoints
# with the Checkpointer when asked to stop (and at its end), and resumes from its checkpoint.
PAYLOAD = """
import os, sys, time
import slurmkit
from slurmkit.runtime import preemption
from slurmkit.runtime.checkpoint import Checkpointer

case = slurmkit.params()["case"]
if case == "fail":
    sys.exit(4)
if case == "cancel":
    print("sleeping", flush=True)
    time.sleep(600)
preemption.install()
steps = {"preempt": 150, "timeout": 1000}[case]  # 0.1 s each
ckpt = Checkpointer(os.path.join(os.environ["SLURMKIT_TRIAL_DIR"], "checkpoints"), keep=2)
latest = ckpt.load_latest()
step = latest[1]["step"] if latest else 0
slurmkit.report(step=step)  # progress: the report's first step of the attempt
print(f"training from step {step} at {time.time():.3f}", flush=True)
while step < steps:
    time.sleep(0.1)
    step += 1
    if preemption.should_stop():
        ckpt.save({"step": step}, step)
        print(f"stopping at step {step}", flush=True)
        preemption.exit_for_requeue()
ckpt.save({"step": step}, step)
print("done", flush=True)
"""


def _wait(what: str, ready, timeout: float = 120) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if ready():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _output(root: Path, index: int) -> str:
    row = json.loads((root / "trials.jsonl").read_text().splitlines()[index])
    path = root / "trials" / row["id"] / "output.log"
    return path.read_text() if path.exists() else ""


def _report(root: Path, env: dict[str, str], *args: str) -> dict:
    proc = run_cli("report", str(root), "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def sweep(slurm_cluster, tmp_path_factory) -> dict:
    """The sweep, run to its end: its directory, array job id, the price config, and when the
    test began (for --since)."""
    tmp = tmp_path_factory.mktemp("report")
    began = time.time()
    payload = tmp / "payload.py"
    payload.write_text(PAYLOAD)
    config = tmp / "config.yaml"
    config.write_text(f"report: {{prices: {{low: {PRICE}}}}}\n")
    result = slurm_submit(
        tmp,
        f"""
name: report
command: [python, {payload}]
args: none
params: {{case: [preempt, timeout, fail, cancel]}}
labels: {{team: nlp}}
resources: {{gpus: 1, time: 2, extra: {{hold: true}}}}
requeue: {{lead: 30}}
""",
    )
    root = Path(result["sweep_dir"])
    array = result["jobs"][0]["job_id"]
    cluster = slurm_cluster
    # Slurm sends the time-limit signal at its first check (every 30 s) with `lead` + 30 s or
    # less left: 60-90 s into an attempt here. The timeout trial needs 100 s (one signal,
    # then it finishes); the others end long before 60 s.
    cluster.run("scontrol", "update", f"jobid={array}_0", f"nodelist={NODE}")
    for task in (1, 2, 3):  # the high job preempts what holds GPUs on NODE: only trial 0
        cluster.run("scontrol", "update", f"jobid={array}_{task}", f"excnodelist={NODE}")
    cluster.run("scontrol", "release", array)
    _wait("trial 3 to sleep", lambda: "sleeping" in _output(root, 3))
    cluster.run("scancel", f"{array}_3")
    _wait("trial 0 to train", lambda: "training from step" in _output(root, 0))
    time.sleep(2)
    high = cluster.sbatch(
        "--partition=high", f"--nodelist={NODE}", "--gres=gpu:4", "--output=/dev/null",
        "--wrap", "sleep 5",
    )  # fmt: skip
    cluster.finish(root, timeout=480)
    cluster.wait_for_jobs([high])
    env = {"SLURMKIT_CONFIG": str(config)}

    def accounted() -> bool:  # slurmdbd hears of the last ends a moment later
        attempts = [a for t in _report(root, env)["sweeps"][0]["trials"] for a in t["attempts"]]
        return all(a["end"] is not None and a["job"] for a in attempts)

    _wait("accounting to have every attempt's end", accounted, timeout=60)
    return {"root": root, "array": array, "env": env, "began": began, "tmp": tmp}


def _records(root: Path, index: int) -> dict:
    row = json.loads((root / "trials.jsonl").read_text().splitlines()[index])
    return json.loads((root / "trials" / row["id"] / "status.json").read_text())


def test_attempts_and_causes_match_what_happened(sweep, slurm_cluster):
    root, array = sweep["root"], sweep["array"]
    report = _report(root, sweep["env"])
    assert report["queries"] == 1 and report["query"][0] == "sacct"
    [s] = report["sweeps"]
    trials = s["trials"]
    assert [t["state"] for t in trials] == ["COMPLETED", "COMPLETED", "FAILED", "CANCELLED"]
    causes = [[a["cause"] for a in t["attempts"]] for t in trials]
    # every attempt Slurm ran is there: its restarts, plus the first run
    for index, t in enumerate(trials):
        [task] = slurm_cluster.jobs(f"{array}_{index}")
        assert len(t["attempts"]) == int(task["Restarts"]) + 1, (index, t["attempts"])
        assert all(a["job"] == f"{array}_{index}" for a in t["attempts"])
    # preempted once (the one high job), signalled once before its time limit, an error, a
    # cancel; completed attempts have no cause
    assert causes == [["preemption", None], ["timeout", None], ["error"], ["cancelled"]]
    assert [a["outcome"] for a in trials[2]["attempts"] + trials[3]["attempts"]] == [
        "failed",
        "cancelled",
    ]
    assert all(a["outcome"] == "interrupted" for t in trials[:2] for a in t["attempts"][:-1])
    # the runtime recorded the same causes (the report read them, and matched each attempt)
    for index in (0, 1):
        recorded = [a.get("cause") for a in _records(root, index)["attempts"]]
        assert causes[index] == recorded
    assert s["causes"] == {"preemption": 1, "timeout": 1, "error": 1, "cancelled": 1}
    assert (s["attempts"], s["outcomes"]["interrupted"]) == (6, 2)
    assert (s["successful"], s["failed"], s["failure_rate"]) == (2, 2, 0.5)


def test_gpu_hours_are_the_allocations_and_split_at_the_last_checkpoint(sweep, slurm_cluster):
    root, array = sweep["root"], sweep["array"]
    [s] = _report(root, sweep["env"])["sweeps"]
    total = 0.0
    for index, t in enumerate(s["trials"]):
        records = _records(root, index)["attempts"]
        assert len(records) == len(t["attempts"])
        for a, rec in zip(t["attempts"], records):
            assert (a["unit"], a["units"], a["partition"]) == ("gpu", 1, "low")  # gpus: 1
            # the allocation holds the runtime's own run of it (sacct has whole seconds), but
            # for the GraceTime (5 s on `low`) a preempted job has after accounting's end
            assert a["start"] <= rec["start"] + 1 and rec["end"] <= a["end"] + 1 + GRACE
            assert a["queue_s"] is not None and a["queue_s"] >= 0
            hours = a["useful_hours"] + a["lost_hours"]
            assert hours == pytest.approx((a["end"] - a["start"]) / 3600)
            total += hours
        # the last attempt's times are the controller's too
        [task] = slurm_cluster.jobs(f"{array}_{index}")
        last = t["attempts"][-1]
        assert (last["start"], last["end"]) == (
            epoch(task["StartTime"]),
            epoch(task["EndTime"]),
        )
    gpu = s["gpu_hours"]
    assert gpu["useful"] + gpu["lost"] == pytest.approx(total) and gpu["running"] == 0
    # failed and cancelled: all lost; completed attempts: all useful
    for t in s["trials"][2:]:
        assert [a["useful_hours"] for a in t["attempts"]] == [0.0]
    for t in s["trials"][:2]:
        assert t["attempts"][-1]["lost_hours"] == 0.0
    # interrupted: useful up to its last checkpoint, from the trial's journal
    for index in (0, 1):
        trial_id = s["trials"][index]["id"]
        journal = [
            json.loads(line)
            for line in (root / "trials" / trial_id / "checkpoints.jsonl").read_text().splitlines()
        ]
        stops = re.findall(r"stopping at step (\d+)", _output(root, index))
        # one commit per stop and one at the end: none lost to pruning (keep=2)
        assert [j["step"] for j in journal] == [*map(int, stops), (150, 1000)[index]]
        records = _records(root, index)["attempts"]
        for a, rec in zip(s["trials"][index]["attempts"][:-1], records):
            # sacct's times are whole seconds: the commit may come in the second of its end, or
            # in a preempted job's GraceTime after it (while the runtime still runs)
            ran = max(a["end"], rec["end"])
            commits = [j["time"] for j in journal if a["start"] <= j["time"] < ran + 1]
            assert commits, a  # each interrupted attempt checkpointed before it stopped
            assert a["checkpoint"] == max(commits)
            kept = min(max(commits), a["end"]) - a["start"]
            assert a["useful_hours"] == pytest.approx(kept / 3600)
            assert a["lost_hours"] == pytest.approx((a["end"] - a["start"] - kept) / 3600)
    assert s["cost"] == pytest.approx(total * PRICE)
    assert s["cost_per_success"] == pytest.approx(total * PRICE / 2)


def test_since_finds_the_sweep_by_its_job_comment_and_groups_by_label(sweep):
    root = sweep["root"]
    direct = _report(root, sweep["env"])
    since = datetime.fromtimestamp(sweep["began"] - 60).strftime("%Y-%m-%dT%H:%M:%S")
    proc = run_cli("report", "--since", since, "--by", "label.team", "--json", env=sweep["env"])
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["queries"] == 1 and "--starttime=" + since in found["query"]
    [mine] = [s for s in found["sweeps"] if s["sweep_dir"] == str(root)]
    keys = ("trials", "states", "attempts", "causes", "gpu_hours", "cost", "cost_per_success")
    assert {k: mine[k] for k in keys} == {k: direct["sweeps"][0][k] for k in keys}
    assert mine["labels"] == {"team": "nlp"}
    [nlp] = [g for g in found["groups"] if g["group"] == "nlp"]
    assert nlp["attempts"] >= mine["attempts"]  # other sweeps of this session may say nlp too
    grouped = _report(root, sweep["env"], "--by", "label.team")
    assert [g["group"] for g in grouped["groups"]] == ["nlp"]
    assert grouped["groups"][0]["gpu_hours"] == direct["sweeps"][0]["gpu_hours"]


def test_the_other_outputs(sweep, tmp_path):
    root, env = sweep["root"], sweep["env"]
    text = run_cli("report", str(root), "--prometheus", env=env)
    assert text.returncode == 0, text.stderr
    assert re.search(r'^slurmkit_report_attempts\{[^}]*cause="preemption"\} 1$', text.stdout, re.M)
    assert re.search(
        r'^slurmkit_report_trials\{[^}]*label_team="nlp",state="FAILED"\} 1$', text.stdout, re.M
    )
    rows = run_cli("report", str(root), "--csv", env=env)
    assert rows.returncode == 0, rows.stderr
    lines = rows.stdout.splitlines()
    assert lines[0].startswith("sweep_dir,sweep,labels,trial_index")
    assert len(lines) - 1 == sum(
        len(t["attempts"]) for t in _report(root, env)["sweeps"][0]["trials"]
    )
    table = run_cli("report", str(root), "--trials", "--plot", str(tmp_path / "r.png"), env=env)
    assert table.returncode == 0, table.stderr
    assert "report" in table.stdout and "cancelled" in table.stdout
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")
    assert not [p for p in os.listdir(tmp_path) if p != "r.png"]  # nothing half-written


def test_where_the_hours_went_matches_what_happened(sweep, slurm_cluster):
    """Per requeued trial: the hold (its first attempt's end to when Slurm let the task start
    again: the fixture released the ~121 s hold) and the restart (its start to the resumed
    trial's first step) within a second; the kinds sum to its wall time; failures are lost."""
    root, array, env = sweep["root"], sweep["array"], sweep["env"]
    [s] = _report(root, env)["sweeps"]
    for index in (0, 1):
        first, last = s["trials"][index]["attempts"]
        [task] = slurm_cluster.jobs(f"{array}_{index}")
        assert (
            last["start"] == epoch(task["StartTime"]) and first["unknown"] == last["unknown"] == []
        )
        hold = last["hold_hours"] * 3600  # one GPU
        assert hold == pytest.approx(epoch(task["EligibleTime"]) - first["end"], abs=1)
        assert 0 < hold < 121 + 5  # released, never longer than Slurm's own hold
        said = re.findall(r"training from step (\d+) at ([\d.]+)", _output(root, index))
        assert int(said[-1][0]) > 0  # resumed from its checkpoint
        restart = last["restart_hours"] * 3600
        assert restart == pytest.approx(float(said[-1][1]) - last["start"], abs=1)
        # it checkpointed when told to stop: (almost) no work lost
        assert first["lost_work_hours"] * 3600 <= 1 and first["productive_hours"] > 0
        kinds = ("productive", "queued", "hold", "restart", "lost_work", "hang", "bad_node",
                 "failed", "running")  # fmt: skip
        wall = sum(a[f"{k}_hours"] for a in (first, last) for k in kinds) * 3600
        assert wall == pytest.approx(last["end"] - first["eligible"], abs=1e-6)
    for index in (2, 3):  # failed, cancelled: their allocation lost
        [a] = s["trials"][index]["attempts"]
        assert a["failed_hours"] == pytest.approx((a["end"] - a["start"]) / 3600)
    gpu = s["gpu_goodput"]
    assert 0 < s["ettr"] == gpu["ettr"] < 1 and gpu["unknown"] == {}
    assert gpu["ettr"] == pytest.approx(gpu["productive"] / (gpu["productive"] + gpu["lost"]))
    text = run_cli("report", str(root), "--prometheus", env=env).stdout
    ettr = re.search(r'^slurmkit_report_ettr\{[^}]*unit="gpu"\} (\S+)$', text, re.M)
    assert float(ettr[1]) == pytest.approx(gpu["ettr"])
