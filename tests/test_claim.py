"""One live run per trial: a task takes its trial's claim before it runs it, so a trial that
another live job runs is never run twice (nor its record overwritten), and the claim of a run
that died is broken at once when that can be known, or once its heartbeat is stale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmkit.core.fsutil import read_json
from slurmkit.core.lock import LOCK_NAME, Lock, read
from slurmkit.core.pids import identity
from slurmkit.runtime.trial import TrialRun

# Holds the claim of the trial directory argv[1] until stdin closes.
HOLDER = """
import sys
from slurmkit.core.lock import Lock
lock = Lock(sys.argv[1])
lock.acquire("trial", 0, about={"job_id": sys.argv[2]} if sys.argv[2] else None)
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


@pytest.fixture
def sweep(tmp_path, spec_file):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod

    s = spec_mod.load(str(spec_file("command: [/bin/true]\nargs: none\nparams: {a: [1]}\n")))
    trials = plan.expand(s)
    return store.create(plan.make(s, trials, os.getcwd()), str(tmp_path / "sweep"))


def _hold(trial_dir: str, job: str = "") -> subprocess.Popen[str]:
    os.makedirs(trial_dir, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, trial_dir, job],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _task(sweep, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmkit.runtime", "task"],
        env={
            **os.environ,
            "SLURMKIT_SWEEP_DIR": sweep.root,
            "SLURM_ARRAY_TASK_ID": "0",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_trial_claimed_by_a_live_job_is_left_alone(sweep):
    run = TrialRun(sweep, 0, under_slurm=True)
    holder = _hold(run.dir, job="4242")
    try:
        proc = _task(
            sweep, {"SLURM_JOB_ID": "4243", "SLURMKIT_CLAIM_WAIT": "0.3"}
        )  # another job: this task must not run
        assert proc.returncode == 0, proc.stderr
        assert f"trial {run.id} is running in job 4242 (pid {holder.pid} on" in proc.stderr
        assert not os.path.exists(sweep.status(run.id))  # nothing recorded, nothing run
        assert not os.path.exists(sweep.output(run.id))
    finally:
        holder.communicate("")
    assert not os.path.exists(os.path.join(run.dir, LOCK_NAME))


def test_a_live_holder_on_this_host_answers_at_once(sweep):
    run = TrialRun(sweep, 0, under_slurm=True)
    holder = _hold(run.dir)
    try:
        start = time.monotonic()
        said = run.claim(wait=30)  # it runs: waiting for its claim to go stale is no use
        assert time.monotonic() - start < 30
        assert said is not None and said.startswith(f"pid {holder.pid} on ")
    finally:
        holder.communicate("")
    assert run.claim(wait=0) is None  # let go: now it is this run's
    run.release()


def test_a_holder_on_another_host_is_waited_for(sweep):
    """Its pid cannot be checked from here: only a heartbeat gone stale frees its claim."""
    run = TrialRun(sweep, 0, under_slurm=True)
    os.makedirs(run.dir)
    Path(run.dir, LOCK_NAME).write_text(json.dumps({"purpose": "trial", "pid": 9, "host": "n7"}))
    start = time.monotonic()
    assert run.claim(wait=0.3) == "pid 9 on n7"
    assert time.monotonic() - start >= 0.3


def test_the_claim_of_this_same_job_is_an_earlier_run_that_died(sweep, monkeypatch):
    """A requeued job keeps its job id, and Slurm never runs two of one job: a claim with this
    job's id (here from another host, so its pid cannot be checked) is broken at once."""
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    run = TrialRun(sweep, 0, under_slurm=True)
    os.makedirs(run.dir)
    Path(run.dir, LOCK_NAME).write_text(
        json.dumps({"purpose": "trial", "pid": 12, "host": "node-gone", "job_id": "777"})
    )
    assert run.claim(wait=0) is None
    assert read(os.path.join(run.dir, LOCK_NAME))[0]["pid"] == os.getpid()
    run.release()
    Path(run.dir, LOCK_NAME).write_text(
        json.dumps({"purpose": "trial", "pid": 12, "host": "node-gone", "job_id": "778"})
    )
    assert run.claim(wait=0) == "job 778 (pid 12 on node-gone)"  # another job: it may live


def test_a_dead_holder_on_this_host_is_broken_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    who = identity(dead.pid)
    dead.wait()
    (tmp_path / LOCK_NAME).write_text(json.dumps({**who, "purpose": "resume", "time": 0}))
    lock = Lock(str(tmp_path))  # its heartbeat is fresh: only the pid check can free it
    lock.acquire("cancel", wait=0)
    assert read(str(tmp_path / LOCK_NAME))[0]["purpose"] == "cancel"
    lock.release()


def test_a_live_holder_on_this_host_is_not_broken(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / LOCK_NAME).write_text(
            json.dumps({**identity(live.pid), "purpose": "resume", "time": 0})
        )
        with pytest.raises(Exception, match="resume by pid"):
            Lock(str(tmp_path)).acquire("cancel", wait=0.2)
    finally:
        live.kill()
        live.wait()


def test_a_run_takes_and_gives_back_its_claim(sweep, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    proc = _task(sweep, {"SLURM_JOB_ID": "55"})
    assert proc.returncode == 0, proc.stderr
    tid = TrialRun(sweep, 0).id
    status = read_json(sweep.status(tid))
    assert [a["state"] for a in status["attempts"]] == ["COMPLETED"]
    assert not os.path.exists(os.path.join(sweep.trial(tid), LOCK_NAME))


def test_the_local_backend_refuses_a_trial_running_elsewhere(tmp_path):
    from conftest import local_sweep, run_cli

    proc, result = local_sweep(tmp_path, "command: [/bin/true]\nargs: none\nparams: {a: [1, 2]}\n")
    assert proc.returncode == 0 and result is not None
    root = result["sweep_dir"]
    first = next(Path(root, "trials").iterdir())
    os.unlink(first / "status.json")  # not completed: a resume would run it
    holder = _hold(str(first))
    try:
        again = run_cli("sweep", "--resume", root, "--backend", "local")
        assert again.returncode == 1
        assert f"trial {first.name} is running elsewhere, in pid {holder.pid}" in again.stderr
        assert "Traceback" not in again.stderr
    finally:
        holder.communicate("")
