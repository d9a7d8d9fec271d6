"""slurmkit.executor on the real test cluster at its limits (issue 12): the time limit (a
Checkpointable is requeued from the host and finishes; a function that cannot checkpoint ends
TIMEOUT and its result says so), and a job that died without a result where the cluster keeps
no accounting (the waiter raises, it does not hang)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import ROOT, attempts
from slurm_fixtures import FINAL_STATES
from submitit.core.utils import FailedJobError

import slurmkit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
PAYLOADS = ROOT / "tests" / "payloads"
sys.path.insert(0, str(PAYLOADS))
import fnjobs  # noqa: E402  (the jobs import it by this name, from PYTHONPATH)

ENV = {"PYTHONPATH": str(PAYLOADS), "OMP_NUM_THREADS": "1"}
# --time=1 with the signal 30 s ahead: Slurm signals 30-60 s before the limit (it checks limits
# every 30 s), so an attempt runs 0-30 s before it is asked to stop.
ONE_MINUTE = {"resources": {"time": 1}, "requeue": {"lead": 30, "budgets": {"timeout": 10}}}


@pytest.fixture
def submitted(slurm_cluster) -> Iterator[list[str]]:
    """Job ids a test submits: whatever of them still runs afterwards is cancelled (by id)."""
    ids: list[str] = []
    yield ids
    for job_id in ids:
        slurm_cluster.run("scancel", job_id, check=False)


def make(tmp_path, spec: dict[str, Any]):
    body = {"env": dict(ENV), **spec}
    return slurmkit.executor(body, [f"output_root={tmp_path}"], backend="slurm")


def finish(cluster, job, timeout: float) -> None:
    """Until ``job.done()``, starting each requeued attempt in 2 s instead of Slurm's ~120 s
    BeginTime hold."""
    deadline = time.monotonic() + timeout
    released = "0"  # the restart whose hold was cut short
    while not job.done():
        assert time.monotonic() < deadline, f"job {job.job_id} not done after {timeout} s"
        [info] = cluster.jobs(job.job_id)
        held = info["JobState"] == "PENDING" and info.get("Reason") == "BeginTime"
        if held and info["Restarts"] != released:
            cluster.run("scontrol", "update", f"jobid={job.job_id}", "starttime=now+2")
            released = info["Restarts"]
        time.sleep(1)


def test_a_checkpointable_at_its_time_limit_is_requeued_and_finishes(
    slurm_cluster, tmp_path, submitted
):
    """45 s of work under a one-minute limit: the time-limit signal reaches the step, the
    Checkpointable checkpoints, the batch shell requeues the job on the host, and the next
    attempt goes on from the checkpoint until the sum is done."""
    job = make(tmp_path, ONE_MINUTE).submit(fnjobs.SumOfSquares(str(tmp_path / "progress")), 900)
    submitted.append(job.job_id)
    finish(slurm_cluster, job, timeout=420)
    result = job.result()
    assert result["sum"] == sum(i * i for i in range(900))  # as an uninterrupted run
    assert len(result["starts"]) >= 2 and result["starts"] == sorted(result["starts"])
    record = attempts(job)
    assert record["state"] == "COMPLETED"
    *requeued, last = record["attempts"]
    assert requeued and all(
        (a["state"], a["cause"], a["signals"]) == ("REQUEUED", "timeout", ["USR2"])
        for a in requeued
    ), requeued
    assert last["state"] == "COMPLETED"
    assert slurm_cluster.jobs(job.job_id)[0]["Restarts"] == str(len(requeued))


def test_a_function_that_cannot_checkpoint_ends_timeout_and_its_result_says_so(
    slurm_cluster, tmp_path, submitted
):
    job = make(tmp_path, ONE_MINUTE).submit(fnjobs.sleeper, 300)
    submitted.append(job.job_id)
    finish(slurm_cluster, job, timeout=150)
    with pytest.raises(FailedJobError, match="TIMEOUT: timed out without asking for a requeue"):
        job.result()
    record = attempts(job)
    assert record["state"] == "TIMEOUT" and len(record["attempts"]) == 1
    assert record["attempts"][0]["cause"] == "timeout"
    assert slurm_cluster.jobs(job.job_id)[0]["Restarts"] == "0"  # not run again


# PATH shims: sacct fails as it does where the cluster keeps no accounting; squeue (with
# "forget") drops a job's lines, as the controller does once MinJobAge has passed (600 s on the
# test cluster: too long to wait for). Both log each call.
NO_ACCOUNTING = """#!/bin/sh
echo "sacct $*" >> {log}
echo "sacct: error: Slurm accounting storage is disabled" >&2
exit 1
"""
FORGETFUL = """#!/bin/sh
echo "squeue $*" >> {log}
{real} "$@" | sed '/^ *{job}|/d'
"""
WAITER = """
import sys
from slurmkit.executors import SpecJob
try:
    print("result:", SpecJob(sys.argv[1], sys.argv[2]).result())
except Exception as exc:
    print(type(exc).__name__ + ":", exc)
"""


@pytest.mark.parametrize("gone", [False, True], ids=["squeue knows it", "squeue forgot it"])
def test_a_job_killed_without_a_result_and_no_accounting_raises_at_once(
    slurm_cluster, tmp_path, submitted, gone
):
    """SIGKILL to the batch shell and its children (the supervisor too): no result is written. With
    sacct failing as it does without accounting, a new waiter's `job.result()` raises after
    one squeue (and, for a job squeue no longer lists, one sacct), instead of waiting forever
    on a state nobody can give."""
    job = make(tmp_path, {"resources": {"time": "0:05:00"}}).submit(fnjobs.sleeper, 300)
    submitted.append(job.job_id)
    deadline = time.monotonic() + 60
    while slurm_cluster.jobs(job.job_id)[0]["JobState"] != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.3)
    # RUNNING comes before the batch shell exists: a KILL sent then finds no process, so it is
    # sent again until the job ends (more KILLs change nothing for a killed shell)
    for _ in range(30):
        slurm_cluster.run("scancel", "--batch", "--signal=KILL", job.job_id, check=False)
        if slurm_cluster.jobs(job.job_id)[0]["JobState"] in FINAL_STATES:
            break
        time.sleep(2)
    ended = slurm_cluster.wait_for_jobs([job.job_id], timeout=60)[job.job_id]
    assert not job.paths.result_pickle.exists()
    log, bin_dir = tmp_path / "calls.log", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text(NO_ACCOUNTING.format(log=log))
    if gone:
        real = shutil.which("squeue")
        (bin_dir / "squeue").write_text(FORGETFUL.format(log=log, real=real, job=job.job_id))
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURMKIT_POLL_INTERVAL": "2",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    argv = [sys.executable, "-c", WAITER, str(job.paths.folder), job.job_id]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("UncompletedJobError:"), out
    calls = log.read_text().splitlines() if log.exists() else []
    if gone:
        assert "the controller no longer knows it and the cluster keeps no accounting" in out
        assert [c.split()[0] for c in calls] == ["squeue", "sacct"], calls
    else:
        assert f"has not produced any output (state: {ended})" in out
        assert calls == []  # squeue (not shimmed) answered; sacct was never asked
