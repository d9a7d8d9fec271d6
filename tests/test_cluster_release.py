"""The requeue hold released on the real test cluster: a trial that checkpoints and asks for a
requeue (time-limit signal, a requeue signal) starts again without waiting out Slurm's 121 s
hold, in place (same job id), from its checkpoint, once, with the right cause; a user's
``scancel`` as the new attempt starts still sticks; a user's start time is left alone."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import run_cli, sbatch_plain, slurm_submit

from slurmkit.core.release import ENV_OFF, ENV_PARTITION, epoch
from slurmkit.sweepstate import collect

pytestmark = pytest.mark.cluster

# The trial: the time of each attempt's first step (after loading its checkpoint) and of each
# stop signal go to events.jsonl; on a stop it checkpoints (its step count) and exits 75. Its first
# attempt runs until it is stopped, a later one ARGV[1] steps more.
PAYLOAD = """
import json, os, sys, time
from slurmkit.runtime import preemption
trial = os.environ["SLURMKIT_TRIAL_DIR"]
ckpt = os.path.join(trial, "ckpt.json")
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
def event(**kw):
    kw.update(t=time.time(), attempt=os.environ["SLURMKIT_ATTEMPT"])
    with open(os.path.join(trial, "events.jsonl"), "a") as fh:
        fh.write(json.dumps(kw) + "\\n")
preemption.install()
event(ev="step", step=step)
first = os.environ["SLURMKIT_ATTEMPT"] == "1"
steps = step + int(sys.argv[1])  # after a resume; the first attempt runs until it is stopped
while first or step < steps:
    if preemption.should_stop():
        event(ev="stop", step=step, signals=preemption.received())
        json.dump({"step": step}, open(ckpt, "w"))
        preemption.exit_for_requeue()
    time.sleep(0.1)
    step += 1
event(ev="done", step=step)
"""


def spec(tmp_path: Path, name: str, steps: int, extra: str = "") -> str:
    script = tmp_path / "payload.py"
    script.write_text(PAYLOAD)
    return f"name: {name}\ncommand: [python, {script}, '{steps}']\nparams: {{x: [1]}}\n{extra}"


def trial(root: str) -> Path:
    row = json.loads((Path(root) / "trials.jsonl").read_text().splitlines()[0])
    return Path(root) / "trials" / row["id"]


def status(root: str) -> dict:
    path = trial(root) / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def events(root: str) -> list[dict]:
    path = trial(root) / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def wait_for(what: str, ready, timeout: float = 90) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if ready():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def ended(root: str) -> bool:
    return status(root).get("state") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def task_ref(attempt: dict) -> str:
    """The attempt's task as Slurm names it: ``ARRAYJOB_TASK``."""
    return f"{attempt['array_job_id']}_{attempt['array_task_id']}"


def assert_released_once(root: str, cause: str, signal: str) -> None:
    """Two attempts, the first stopped for ``cause``; the second resumed from its checkpoint;
    the hold was released in place by the releaser job, before it would have ended."""
    st = status(root)
    assert st["state"] == "COMPLETED", st
    first, second = st["attempts"]
    assert (first["cause"], first["exit_code"], first["signals"]) == (cause, 75, [signal])
    assert second["job_id"] == first["job_id"] and second["restart_count"] == "1"
    evs = events(root)
    stop = next(e for e in evs if e["ev"] == "stop")
    assert [e["step"] for e in evs if e["ev"] == "step"] == [0, stop["step"]]  # resumed once
    record = json.loads((trial(root) / "release-1.json").read_text())
    assert record["by"] == "job"
    assert record["job"] == task_ref(first)
    assert record["released_at"] < record["held_until"]  # the hold was cut short
    assert second["start"] > record["released_at"]


def signalled(slurm_cluster, tmp_path: Path, name: str, steps: int) -> tuple[str, dict]:
    """A sweep of one trial submitted, sent the requeue signal (USR2) once it stepped: its
    root and its first attempt's record."""
    root = slurm_submit(tmp_path, spec(tmp_path, name, steps))["sweep_dir"]
    wait_for("the first step", lambda: events(root))
    first = status(root)["attempts"][0]
    slurm_cluster.run("scancel", "--batch", "--signal=USR2", task_ref(first))
    return root, first


def test_a_requeue_signal_is_released_in_place(slurm_cluster, tmp_path):
    root, _ = signalled(slurm_cluster, tmp_path, "relsig", 20)
    wait_for("the trial to end", lambda: ended(root), timeout=120)
    assert_released_once(root, "preemption", "USR2")


def test_the_releaser_runs_in_the_partition_the_user_names(slurm_cluster, tmp_path, monkeypatch):
    """SLURMKIT_RELEASE_PARTITION in the environment the sweep is submitted from: the trial runs
    in the default partition (low), its releaser in the one named (high), and releases it."""
    monkeypatch.setenv(ENV_PARTITION, "high")
    root, first = signalled(slurm_cluster, tmp_path, "relpart", 20)
    wait_for("the trial to end", lambda: ended(root), timeout=120)
    assert_released_once(root, "preemption", "USR2")
    (job,) = slurm_cluster.jobs(first["array_job_id"])
    every = slurm_cluster.run("scontrol", "show", "job", "-o").stdout.splitlines()
    releasers = [  # this trial's: submitted after it (the cluster may keep earlier runs')
        re.search(r" Partition=(\S+)", line)[1]  # type: ignore[index]
        for line in every
        if f" JobName={job['JobName']}-release " in line
        and int(line.split()[0].removeprefix("JobId=")) > int(first["array_job_id"])
    ]
    assert job["Partition"] == "low" and releasers == ["high"]


def test_a_time_limit_requeue_is_released_in_place(slurm_cluster, tmp_path):
    # the signal comes 10-40 s into the first attempt (lead 50 of a 1-minute limit, checked
    # every 30 s); the second needs 2 s more
    extra = "resources: {time: 1}\nrequeue: {lead: 50}\n"
    result = slurm_submit(tmp_path, spec(tmp_path, "reltime", 20, extra))
    root = result["sweep_dir"]
    wait_for("the trial to end", lambda: ended(root), timeout=150)
    assert_released_once(root, "timeout", "USR2")


def test_a_cancel_as_the_released_attempt_starts_sticks(slurm_cluster, tmp_path):
    """``scancel`` the moment Slurm runs the released task again (its runtime starting, or not
    yet started): the task stays CANCELLED, never requeued nor released again."""
    root, first = signalled(slurm_cluster, tmp_path, "relcancel", 3000)
    ref = task_ref(first)

    def started_again() -> bool:
        [job] = slurm_cluster.jobs(ref)
        return job["Restarts"] == "1" and job["JobState"] == "RUNNING"

    wait_for("the released task to run", started_again, timeout=60)
    slurm_cluster.run("scancel", ref)
    slurm_cluster.wait_for_jobs([ref], timeout=60)
    time.sleep(4)  # a requeue or a release would show now: PENDING again, Restarts raised
    [task] = slurm_cluster.jobs(ref)
    assert (task["JobState"], task["Restarts"]) == ("CANCELLED", "1")
    assert collect(root).counts == {"CANCELLED": 1}
    st = status(root)
    assert len(st["attempts"]) <= 2 and st["attempts"][0]["cause"] == "preemption", st
    assert not (trial(root) / "release-2.json").exists()
    assert len([e for e in events(root) if e["ev"] == "step"]) <= 2


def test_a_users_start_time_is_left_alone(slurm_cluster, tmp_path):
    root, first = signalled(slurm_cluster, tmp_path, "relbegin", 3000)
    ref = task_ref(first)

    def held() -> bool:
        [job] = slurm_cluster.jobs(ref)
        return job["JobState"] == "PENDING" and job["Reason"] == "BeginTime"

    wait_for("the requeue hold", held, timeout=60)
    slurm_cluster.run("scontrol", "update", f"jobid={ref}", "starttime=now+600")
    time.sleep(8)  # the releaser looks again within a second and leaves it be
    [job] = slurm_cluster.jobs(ref)
    assert (job["JobState"], job["Reason"]) == ("PENDING", "BeginTime")
    assert epoch(job["StartTime"]) > time.time() + 500
    assert not (trial(root) / "release-1.json").exists()
    slurm_cluster.run("scancel", ref)


def test_a_watcher_releases_a_requeue_slurm_made(slurm_cluster, tmp_path, monkeypatch):
    """An external ``scontrol requeue`` (an admin, a drain), with the job's own releaser off:
    ``slurmkit status --watch`` releases the held task within a poll, in place."""
    monkeypatch.setenv(ENV_OFF, "1")  # the job's environment: no releaser job, no sibling
    result = slurm_submit(tmp_path, spec(tmp_path, "relwatch", 20))
    monkeypatch.delenv(ENV_OFF)
    root = result["sweep_dir"]
    wait_for("the first step", lambda: events(root))
    first = status(root)["attempts"][0]
    slurm_cluster.run("scontrol", "requeue", task_ref(first))
    watch = run_cli("status", root, "--watch", "--interval", "1", timeout=100)
    assert watch.returncode == 0, watch.stderr
    st = status(root)
    assert st["state"] == "COMPLETED" and len(st["attempts"]) == 2, st
    assert (st["attempts"][0]["cause"], st["attempts"][0]["signals"]) == ("preemption", ["TERM"])
    record = json.loads((trial(root) / "release-1.json").read_text())
    assert record["by"] == "watcher" and record["released_at"] < record["held_until"]


def test_a_plain_sbatch_script_is_released_too(slurm_cluster, tmp_path):
    """A standalone script (``sweep --dry-run --plain``) submitted with plain ``sbatch``: its
    runtime's own requeue is released in place as the CLI's is."""
    (tmp_path / "plain.yaml").write_text(
        spec(tmp_path, "relplain", 20).replace(
            "name: relplain\n", "name: relplain\noutput_root: runs\n"
        )
    )
    proc = run_cli("sweep", "plain.yaml", "--dry-run", "--plain", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "plain.sbatch"
    script.write_text(proc.stdout)
    job, root = sbatch_plain(tmp_path, script, "relplain")
    wait_for("the first step", lambda: events(str(root)))
    slurm_cluster.run("scancel", "--batch", "--signal=USR2", f"{job}_0")
    wait_for("the trial to end", lambda: ended(str(root)), timeout=120)
    assert_released_once(str(root), "preemption", "USR2")
