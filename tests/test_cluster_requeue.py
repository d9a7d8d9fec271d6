"""Requeue and resume on the real test cluster: time limit, preemption, node failure, external
requeue, scancel --signal, and budgets. A resumed trial's final metrics must equal an
uninterrupted run's exactly (examples/resumable_train.py trains deterministically on the CPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PAYLOAD, ROOT, run_cli, slurm_submit

from slurmkit.sweepstate import collect

pytestmark = pytest.mark.cluster
TRAIN = ROOT / "examples" / "resumable_train.py"
RESULT_KEYS = ("loss", "mean_loss", "params_sha256", "steps")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> callable:
    """Metrics of an uninterrupted run with the given parameters (cached)."""
    cache: dict[str, dict] = {}

    def run(params: dict) -> dict:
        key = json.dumps(params, sort_keys=True)
        if key not in cache:
            tdir = tmp_path_factory.mktemp("reference")
            env = {
                **os.environ,
                "SLURMKIT_TRIAL_DIR": str(tdir),
                "SLURMKIT_PARAMS": json.dumps({**params, "step_time": 0}),
            }
            subprocess.run([sys.executable, str(TRAIN)], env=env, check=True, capture_output=True)
            cache[key] = json.loads((tdir / "metrics.json").read_text())
        return cache[key]

    return run


def submit(tmp_path: Path, body: str) -> dict:
    return slurm_submit(tmp_path, body)


def trial_status(root: str, index: int = 0) -> dict:
    row = json.loads((Path(root) / "trials.jsonl").read_text().splitlines()[index])
    path = Path(root) / "trials" / row["id"] / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def wait_for(what: str, ready, timeout: float = 90) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if ready():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def training(root: str) -> bool:
    """The trial's loop runs (torch is imported, the stop-signal handler is installed)."""
    return any(
        "training from step" in p.read_text() for p in (Path(root) / "trials").glob("*/output.log")
    )


def resumable(name: str, steps: int, step_time: float, extra: str = "") -> str:
    return f"""
name: {name}
command: [python, {TRAIN}]
params: {{steps: [{steps}], step_time: [{step_time}], ckpt_every: [1000]}}
{extra}
"""


def assert_resumed_exactly(root: str, reference, steps: int, causes: set[str]) -> dict:
    status = trial_status(root)
    assert status["state"] == "COMPLETED", status
    seen = {a.get("cause") for a in status["attempts"][:-1]}
    assert causes <= seen, status["attempts"]
    assert len(status["attempts"]) >= 2
    metrics = json.loads((Path(root) / "trials" / status["id"] / "metrics.json").read_text())
    expected = reference({"steps": steps, "ckpt_every": 1000})
    assert {k: metrics[k] for k in RESULT_KEYS} == {k: expected[k] for k in RESULT_KEYS}
    assert metrics["resumed_at"] > 0  # the last attempt started from a checkpoint, not from 0
    return status


def test_time_limit_signal_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path, reference):
    # --time=1 with the signal 20 s ahead: Slurm signals 20-50 s before the limit (it checks
    # every 30 s), so 10-40 s into an attempt (never at its start, where a signal could come
    # before the batch shell has set its trap), and the runtime holds it until the trial has
    # installed its handler; each attempt trains up to 40 s, and 45 s of training needs two or
    # more attempts.
    result = submit(
        tmp_path,
        resumable(
            "timelimit",
            450,
            0.1,
            """
resources: {time: 1}
requeue: {lead: 20, budgets: {timeout: 20}}
""",
        ),
    )
    root = result["sweep_dir"]
    final = slurm_cluster.finish(root, timeout=420)
    assert final["counts"] == {"COMPLETED": 1}
    status = assert_resumed_exactly(root, reference, 450, {"timeout"})
    assert all(a.get("signals") == ["USR2"] for a in status["attempts"][:-1]), status["attempts"]
    # no work lost: each attempt resumes at the very step where the previous one stopped
    log = (Path(root) / "trials" / status["id"] / "output.log").read_text()
    stopped = re.findall(r"stopping at step (\d+)", log)
    resumed = re.findall(r"resumed from step (\d+)", log)
    assert stopped and stopped == resumed[: len(stopped)]
    assert status["attempts"][-1]["restart_count"] == str(len(status["attempts"]) - 1)


LATE_HANDLER = """
import os, sys, time
from slurmkit.runtime import preemption
if os.environ["SLURMKIT_ATTEMPT"] != "1":
    sys.exit(0)
time.sleep(45)  # still starting when the signal comes
preemption.install()
for _ in range(900):
    if preemption.should_stop():
        print("stopping on", preemption.received(), flush=True)
        preemption.exit_for_requeue()
    time.sleep(0.1)
sys.exit(9)
"""


def test_the_time_limit_signal_waits_for_the_trials_handler(slurm_cluster, tmp_path):
    """--time=1 with lead 20: Slurm signals 10-40 s into the job (see above), before the trial
    below installs its handler. The runtime holds the signal until then: the trial gets
    it, checkpoints (here: exits 75) and is requeued. `sleep` never catches the signal, so it
    runs on to the time limit and ends TIMEOUT, not requeued: a rerun would start over and
    time out again. Both run at once."""
    script = tmp_path / "late.py"
    script.write_text(LATE_HANDLER)
    limits = "resources: {time: 1}\nrequeue: {lead: 20}\n"
    (tmp_path / "late").mkdir()
    (tmp_path / "plain").mkdir()
    late = submit(tmp_path / "late", f"command: [python, {script}]\nparams: {{i: [1]}}\n{limits}")
    plain = submit(
        tmp_path / "plain", f"command: [sleep, '300']\nargs: none\nparams: {{i: [1]}}\n{limits}"
    )
    final = slurm_cluster.finish(late["sweep_dir"], timeout=240)
    assert final["counts"] == {"COMPLETED": 1}, final
    status = trial_status(late["sweep_dir"])
    first = status["attempts"][0]
    assert (first["state"], first["cause"], first["exit_code"]) == ("REQUEUED", "timeout", 75)
    log = (Path(late["sweep_dir"]) / "trials" / status["id"] / "output.log").read_text()
    assert "stopping on ['SIGUSR2']" in log
    final = slurm_cluster.finish(plain["sweep_dir"], timeout=150)
    assert final["counts"] == {"TIMEOUT": 1}, final
    status = trial_status(plain["sweep_dir"])
    assert len(status["attempts"]) == 1 and status["attempts"][0]["cause"] == "timeout"
    assert "not requeued" in status["reason"]


TORCHRUN_WORKER = """
import os, sys, time
from slurmkit.runtime import preemption
preemption.install()
rank = os.environ["RANK"]
if os.environ["SLURMKIT_ATTEMPT"] != "1":
    sys.exit(0)
print(f"rank {rank} waits", flush=True)
for _ in range(1200):
    if preemption.should_stop():
        print(f"rank {rank} stopping on {preemption.received()}", flush=True)
        preemption.exit_for_requeue()
    time.sleep(0.1)
sys.exit(9)
"""


def test_under_torchrun_every_worker_gets_the_time_limit_signal_and_the_trial_is_requeued(
    slurm_cluster, tmp_path
):
    """torchrun dies of a signal it does not handle, and it turns a worker's exit 75 into its
    own exit 1: the requeue still reaches both workers, and their request reaches the runtime."""
    script = tmp_path / "worker.py"
    script.write_text(TORCHRUN_WORKER)
    result = submit(
        tmp_path,
        f"command: [python, {script}]\nargs: none\nparams: {{i: [1]}}\nlauncher: torchrun\n"
        "torchrun: {nproc_per_node: 2}\nresources: {time: 1}\nrequeue: {lead: 20}\n",
    )
    root = result["sweep_dir"]
    final = slurm_cluster.finish(root, timeout=240)
    status = trial_status(root)
    log = (Path(root) / "trials" / status["id"] / "output.log").read_text()
    assert final["counts"] == {"COMPLETED": 1}, (final, log[-3000:])
    first = status["attempts"][0]
    assert (first["state"], first["cause"]) == ("REQUEUED", "timeout"), first
    for rank in (0, 1):
        assert f"rank {rank} stopping on ['SIGUSR2']" in log


def test_preemption_by_high_partition_job(slurm_cluster, tmp_path, reference):
    result = submit(
        tmp_path,
        resumable(
            "preempt",
            200,
            0.05,
            """
resources: {partition: low, extra: {nodelist: n4, exclusive: true}}
""",
        ),
    )
    root = result["sweep_dir"]
    wait_for("training to start", lambda: training(root))
    time.sleep(2)
    high = slurm_cluster.sbatch(
        "--partition=high",
        "--nodelist=n4",
        "--exclusive",
        "--output=/dev/null",
        "--wrap",
        "sleep 3",
    )
    final = slurm_cluster.finish(root)
    assert final["counts"] == {"COMPLETED": 1}
    assert_resumed_exactly(root, reference, 200, {"preemption"})
    assert slurm_cluster.wait_for_jobs([high])[high] == "COMPLETED"


def test_node_failure_requeues_and_resumes(slurm_cluster, tmp_path, reference):
    # periodic checkpoints: when a node dies, the save on SIGTERM may not finish within KillWait
    result = submit(
        tmp_path,
        resumable("nodefail", 200, 0.05, "").replace("ckpt_every: [1000]", "ckpt_every: [20]"),
    )
    root = result["sweep_dir"]
    wait_for("training to start", lambda: training(root))
    wait_for(
        "a first checkpoint", lambda: any((Path(root) / "trials").glob("*/checkpoints/step-*"))
    )
    host = trial_status(root)["attempts"][-1]["host"]
    slurm_cluster.set_node_state(host, "down")
    try:
        final = slurm_cluster.finish(root)
    finally:  # ReturnToService=2 may have brought the node back already
        slurm_cluster.run("scontrol", "update", f"nodename={host}", "state=resume", check=False)
    assert final["counts"] == {"COMPLETED": 1}
    status = assert_resumed_exactly(root, reference, 200, {"node_failure"})
    assert status["attempts"][0]["host"] == host


@pytest.mark.parametrize("how", ["scontrol requeue", "scancel --signal"])
def test_external_interruptions_are_handled(slurm_cluster, tmp_path, reference, how):
    result = submit(tmp_path, resumable("external", 200, 0.05, ""))
    root = result["sweep_dir"]
    wait_for("training to start", lambda: training(root))
    time.sleep(2)
    job = trial_status(root)["attempts"][-1]
    ref = f"{job['array_job_id']}_{job['array_task_id']}"
    if how == "scontrol requeue":
        slurm_cluster.run("scontrol", "requeue", ref)
    else:
        slurm_cluster.run("scancel", "--batch", "--signal=USR2", ref)
    final = slurm_cluster.finish(root)
    assert final["counts"] == {"COMPLETED": 1}
    status = assert_resumed_exactly(root, reference, 200, {"preemption"})
    first = status["attempts"][0]
    assert first["signals"] == (["TERM"] if how == "scontrol requeue" else ["USR2"])
    assert first["exit_code"] == 75  # the trial checkpointed and asked to be requeued
    log = "".join(p.read_text() for p in (Path(root) / "logs").glob("*.out"))
    assert "scontrol requeue failed" not in log  # Slurm requeued it: the shell does not try


@pytest.mark.parametrize("how", ["slurmkit cancel", "scancel of the task", "scancel of the array"])
def test_a_users_cancel_sticks(slurm_cluster, tmp_path, how):
    """The trial handles SIGTERM as the README shows: it checkpoints and exits 75. A user's
    cancel must still end it CANCELLED, with no requeue (before the fix, the runtime passed 75
    on and the batch shell ran `scontrol requeue`: the task was PENDING again)."""
    result = submit(tmp_path, resumable("sticky", 3000, 0.05, ""))
    root = result["sweep_dir"]
    array = result["jobs"][0]["job_id"]
    wait_for("training to start", lambda: training(root))
    time.sleep(2)
    if how == "slurmkit cancel":
        proc = run_cli("cancel", root, "--json")
        assert proc.returncode == 0 and json.loads(proc.stdout)["jobs"] == [array]
    else:
        slurm_cluster.run("scancel", f"{array}_0" if how == "scancel of the task" else array)
    ended = slurm_cluster.wait_for_jobs([array], timeout=90)
    assert ended == {f"{array}_0": "CANCELLED"}
    time.sleep(3)  # a requeue would show now: the task PENDING again, Restarts raised
    [task] = slurm_cluster.jobs(f"{array}_0")
    assert (task["JobState"], task["Restarts"]) == ("CANCELLED", "0")
    status = trial_status(root)
    assert status["state"] == "CANCELLED" and len(status["attempts"]) == 1, status
    assert status["attempts"][0]["exit_code"] == 75  # it checkpointed and asked to be requeued
    assert status["attempts"][0]["signals"] == ["TERM"]
    assert collect(root).counts == {"CANCELLED": 1}
    log = next((Path(root) / "logs").glob("*.out")).read_text()
    assert "scontrol requeue" not in log


def test_error_budget_exhausted_fails_with_cause(slurm_cluster, tmp_path):
    result = submit(
        tmp_path,
        f"""
name: budget
command: [python, {PAYLOAD}]
params: {{exit: [4]}}
requeue: {{budgets: {{error: 2}}}}
""",
    )
    root = result["sweep_dir"]
    final = slurm_cluster.finish(root)
    status = trial_status(root)
    assert final["counts"] == {"FAILED": 1}
    assert status["state"] == "FAILED" and status["cause"] == "error"
    assert "budget exhausted (2 requeues)" in status["reason"]
    assert [a["cause"] for a in status["attempts"]] == ["error", "error", "error"]
    assert [a["exit_code"] for a in status["attempts"]] == [4, 4, 4]


def test_completed_trial_never_reruns_when_requeued(slurm_cluster, tmp_path):
    result = submit(
        tmp_path,
        f"name: done\ncommand: [python, {PAYLOAD}]\nparams: {{x: [1]}}\n"
        "requeue: {budgets: {error: 1}}\n",
    )
    root = result["sweep_dir"]
    slurm_cluster.finish(root)
    job = trial_status(root)["attempts"][-1]
    ref = f"{job['array_job_id']}_{job['array_task_id']}"
    slurm_cluster.run("scontrol", "requeue", ref)  # Slurm runs the finished task again...
    slurm_cluster.release_requeued(ref)
    wait_for(
        "the rerun to end",
        lambda: (
            slurm_cluster.jobs(ref)[0]["JobState"] == "COMPLETED"
            and slurm_cluster.jobs(ref)[0].get("Restarts") == "1"
        ),
        timeout=60,
    )
    status = trial_status(root)  # ...but the trial does not run again
    assert status["state"] == "COMPLETED" and len(status["attempts"]) == 1
    log = (Path(root) / "logs" / f"{ref}.out").read_text()
    assert "already COMPLETED; not running it again" in log
