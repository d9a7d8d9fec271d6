"""slurmkit.executor on the real test cluster: submitit's API over slurmkit's batch scripts
(submit, map_array, a multi-node step, requeue from the host and resume, a cancel that sticks)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, attempts, counted_queries
from submitit.core.utils import FailedJobError, UncompletedJobError

import slurmkit

pytestmark = pytest.mark.cluster
PAYLOADS = ROOT / "tests" / "payloads"
sys.path.insert(0, str(PAYLOADS))
import fnjobs  # noqa: E402  (the jobs import it by this name, from PYTHONPATH)

ENV = {"PYTHONPATH": str(PAYLOADS), "OMP_NUM_THREADS": "1"}


@pytest.fixture
def submitted(slurm_cluster) -> Iterator[list[str]]:
    """Job ids a test submits: whatever of them still runs afterwards is cancelled (by id)."""
    ids: list[str] = []
    yield ids
    for job_id in ids:
        slurm_cluster.run("scancel", job_id, check=False)


def make(tmp_path: Path, spec: dict[str, Any] | None = None, **kwargs: Any):
    body = {"resources": {"time": "0:05:00"}, "env": dict(ENV), **(spec or {})}
    return slurmkit.executor(body, [f"output_root={tmp_path}"], backend="slurm", **kwargs)


def finished(job, timeout: float = 50) -> Any:
    """``job.done()`` within ``timeout`` s (submitit's own wait has no limit)."""
    deadline = time.monotonic() + timeout
    while not job.done():
        assert time.monotonic() < deadline, f"job {job.job_id} not done after {timeout} s"
        time.sleep(0.5)
    return job


def progress(path: Path, at_least: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if int(path.read_text().split()[0]) >= at_least:
                return
        except (OSError, ValueError, IndexError):
            pass
        assert time.monotonic() < deadline, f"{path} did not reach {at_least}"
        time.sleep(0.1)


def test_submit_and_result(slurm_cluster, tmp_path, submitted):
    ex = make(tmp_path)
    job = ex.submit(fnjobs.square, 7)
    submitted.append(job.job_id)
    assert finished(job).result() == 49
    script = job.paths.submission_file.read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=B:USR2@120" in script
    assert "--cpus-per-task" not in script and "--wckey" not in script
    assert "#SBATCH --time=5" in script
    assert job.paths.folder == tmp_path / "submitit" / "submitit"
    record = attempts(job)
    assert record["state"] == "COMPLETED" and len(record["attempts"]) == 1


def test_map_array_of_50_with_max_parallelism(slurm_cluster, tmp_path, submitted):
    ex = make(tmp_path)
    ex.update_parameters(slurm_array_parallelism=10)
    jobs = ex.map_array(fnjobs.timed, range(50), [str(tmp_path)] * 50)
    submitted.append(jobs[0].job_id.split("_")[0])
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1  # one array
    results = [finished(j, timeout=55).result() for j in jobs]
    assert [r["i"] for r in results] == list(range(50))
    script = jobs[0].paths.submission_file.read_text()
    assert "#SBATCH --array=0-49%10" in script
    events = sorted([(r["start"], 1) for r in results] + [(r["end"], -1) for r in results])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert 1 < peak <= 10


def test_two_nodes_two_tasks_all_reduce(slurm_cluster, tmp_path, submitted):
    ex = make(
        tmp_path,
        {"env": {**ENV, "GLOO_SOCKET_IFNAME": "lo"}},
        nodes=2,
        tasks_per_node=2,
    )
    job = ex.submit(fnjobs.allreduce)
    submitted.append(job.job_id)
    ranks = finished(job).results()
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 for r in ranks)
    assert sorted(r["local_rank"] for r in ranks) == [0, 0, 1, 1]
    hosts = [r["host"] for r in ranks]
    assert len(set(hosts)) == 2 and hosts[0] == hosts[1] and hosts[2] == hosts[3]
    assert len({r["master"] for r in ranks}) == 1
    script = job.paths.submission_file.read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script


def test_checkpointable_requeued_by_scontrol_resumes(slurm_cluster, tmp_path, submitted):
    """An external `scontrol requeue` (an admin, a drain): the step checkpoints on SIGTERM,
    Slurm runs the job again, and it goes on from its checkpoint."""
    ex = make(tmp_path)
    where = tmp_path / "progress"
    job = ex.submit(fnjobs.SumOfSquares(str(where)), 200)
    submitted.append(job.job_id)
    progress(where, 40)
    slurm_cluster.run("scontrol", "requeue", job.job_id)
    slurm_cluster.release_requeued(job.job_id)
    result = finished(job).result()
    assert result["sum"] == sum(i * i for i in range(200))  # as an uninterrupted run
    assert len(result["starts"]) == 2 and result["starts"][0] == 0 and result["starts"][1] >= 40
    record = attempts(job)
    assert [a["state"] for a in record["attempts"]] == ["REQUEUED", "COMPLETED"]
    assert record["attempts"][0]["cause"] == "preemption"


def test_requeue_signal_requeues_from_the_host_without_scontrol_in_the_step(
    slurm_cluster, tmp_path, submitted
):
    """The requeue signal (here `scancel --batch --signal=USR2`, as preemption with
    preempt_send_user_signal sends it): the step, whose PATH has no scontrol, checkpoints and
    exits 75; the batch shell requeues the job on the host; the job resumes."""
    ex = make(tmp_path, python=f"env PATH=/nonexistent {sys.executable}")
    where = tmp_path / "progress"
    job = ex.submit(fnjobs.SumOfSquares(str(where)), 200)
    submitted.append(job.job_id)
    progress(where, 30)
    slurm_cluster.run("scancel", "--batch", "--signal=USR2", job.job_id)
    slurm_cluster.release_requeued(job.job_id)
    result = finished(job).result()
    assert result["sum"] == sum(i * i for i in range(200))
    assert result["scontrol"] is None  # the function's step had no scontrol
    assert len(result["starts"]) == 2 and result["starts"][1] >= 30
    first = attempts(job)["attempts"][0]
    assert (first["state"], first["cause"], first["signals"]) == (
        "REQUEUED",
        "preemption",
        ["USR2"],
    )
    assert slurm_cluster.jobs(job.job_id)[0]["Restarts"] == "1"


def test_a_users_cancel_stays_cancelled(slurm_cluster, tmp_path, submitted):
    """scancel of a Checkpointable: it checkpoints and asks for a requeue, which is not
    granted; job.result() raises at once (no sacct needed) and Slurm keeps it CANCELLED."""
    ex = make(tmp_path)
    where = tmp_path / "progress"
    job = ex.submit(fnjobs.SumOfSquares(str(where)), 400)
    submitted.append(job.job_id)
    progress(where, 20)
    slurm_cluster.run("scancel", job.job_id)
    with pytest.raises(Exception, match="cancelled"):
        finished(job, timeout=20).result()
    assert slurm_cluster.wait_for_jobs([job.job_id], timeout=30) == {job.job_id: "CANCELLED"}
    assert slurm_cluster.jobs(job.job_id)[0]["Restarts"] == "0"
    first = attempts(job)["attempts"][0]
    assert (first["state"], first["exit_code"]) == ("CANCELLED", 75)


def test_unknown_partition_is_refused_and_leaves_no_pickle(slurm_cluster, tmp_path):
    ex = make(tmp_path, partition="nosuchpartition")
    with pytest.raises(FailedJobError, match="partition"):  # submitit's own: sbatch's words
        ex.submit(fnjobs.square, 1)
    assert not list((tmp_path / "submitit" / "submitit").glob("*.pkl"))


def test_state_and_done_without_accounting(slurm_cluster, tmp_path, submitted):
    """The test cluster keeps no accounting (no sacct): the jobs' watcher asks squeue, so a
    job cancelled before it ran is done, and its state is Slurm's."""
    ex = make(tmp_path)
    ex.update_parameters(additional_parameters={"hold": True})
    job = ex.submit(fnjobs.square, 2)
    submitted.append(job.job_id)
    assert job.watcher.get_state(job.job_id, mode="force") == "PENDING"
    assert not job.done()
    job.cancel()
    with pytest.raises(UncompletedJobError, match="state: CANCELLED"):
        finished(job, timeout=20).result()


WAITER = """
import sys, time
from slurmkit.executors import SpecJob
job = SpecJob(sys.argv[1], sys.argv[2])
while not job.done():
    time.sleep(0.2)
print(job.result())
"""


def test_ten_waiters_in_ten_processes_ask_no_more_than_one(submitted, tmp_path):
    """Ten processes wait on one executor job (`job.done()` every 0.2 s), with PATH shims that
    log every squeue and sacct call: the shared poll cache answers them all, so they cost what
    one waiter costs, one squeue per interval."""
    import subprocess

    job = make(tmp_path).submit(fnjobs.sleeper, 6)
    submitted.append(job.job_id)
    log, env = counted_queries(tmp_path, 2)
    argv = [sys.executable, "-c", WAITER, str(job.paths.folder), job.job_id]
    start = time.monotonic()
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) for _ in range(10)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    took = time.monotonic() - start
    assert [o.strip() for o in outs] == ["slept"] * 10
    squeues = [c for c in log.read_text().splitlines() if c.startswith("squeue")]
    # one per 2 s interval, plus the first ask (the job is new to the cache): what one waiter
    # would cost; ten independent waiters at 0.2 s would have asked hundreds of times
    assert len(squeues) <= took / 2 + 2, squeues
    assert all("--user=" in c for c in squeues)
