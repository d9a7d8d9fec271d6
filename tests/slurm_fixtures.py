"""Pytest plugin for tests against a real Slurm cluster (load with ``pytest_plugins``).

The session fixture ``slurm_cluster`` uses the cluster that ``$SLURM_CONF`` names when its
slurmctld answers; otherwise it starts the private test cluster with ``tests/cluster/up.sh``, and
skips the tests that need it where that cluster cannot run (not root, no packages, ...).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

UP_SH = Path(__file__).resolve().parent / "cluster" / "up.sh"
CANNOT_START = 3  # up.sh's exit code when the cluster cannot run on this machine
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
# One "Key=value" of `scontrol show ... -o`; a value runs up to the next " Key=".
_FIELD = re.compile(r"(?:^| )([A-Za-z][\w/:]*)=(.*?)(?= [A-Za-z][\w/:]*=|$)")


def _poll(ready: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    """Call ``ready`` every ``interval`` s until it is true; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached after {timeout} s")
        time.sleep(interval)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie does not (PID 1 may reap it late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(") ")[2][:1] not in ("Z", "X")


def epoch(text: str) -> float | None:
    """A time as scontrol prints it (``2026-12-02T05:46:05``), in seconds; None if it is none."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class SlurmCluster:
    """A running Slurm cluster.

    ``conf`` is its slurm.conf, ``dir`` the directory holding it (for the private cluster: all
    state, logs and ``jobcomp.log``), ``env`` a complete environment for subprocesses.
    """

    conf: Path
    dir: Path
    env: dict[str, str]

    def run(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command; if ``check``, raise RuntimeError (with stderr) on failure."""
        proc = subprocess.run(args, env=self.env, text=True, capture_output=True, timeout=timeout)
        if check and proc.returncode:
            raise RuntimeError(
                f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc

    def sbatch(self, *args: str) -> str:
        """Submit with ``sbatch --parsable ARGS``; return the job id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def jobs(self, job_id: str | int) -> list[dict[str, str]]:
        """``scontrol show job -o JOB_ID`` as dicts, one per array task (pending ones may share)."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return [dict(_FIELD.findall(line)) for line in out.splitlines() if line.strip()]

    def finish(self, root: str | Path, timeout: float = 300) -> dict:
        """Wait for the sweep at ``root`` to finish (its ``status --json`` form), releasing
        requeued tasks from Slurm's ~120 s BeginTime hold."""
        from slurmkit.errors import SchedulerError
        from slurmkit.sweepstate import collect

        end = time.time() + timeout
        while time.time() < end:
            try:
                current = collect(str(root))
            except SchedulerError:
                time.sleep(1)
                continue
            if current.finished:
                return current.as_dict()
            for t in current.trials:
                if t.job and t.state in ("PENDING", "REQUEUED"):
                    info = self.jobs(t.job)
                    start = epoch(info[0].get("StartTime", "")) if info else None
                    pending = info and info[0]["JobState"] == "PENDING"
                    if pending and start and start > time.time() + 5:
                        self.run(
                            "scontrol", "update", f"jobid={t.job}", "starttime=now+2", check=False
                        )
            time.sleep(1)
        raise AssertionError(f"sweep not finished after {timeout} s: {collect(str(root)).counts}")

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict (key to value, both as printed)."""
        out = self.run("scontrol", "show", "config").stdout
        pairs = (line.partition(" = ") for line in out.splitlines())
        return {k.strip(): v.strip() for k, sep, v in pairs if sep}

    def wait_for_jobs(self, job_ids: Iterable[str | int], timeout: float = 120) -> dict[str, str]:
        """Wait until the jobs (every task of an array id) have ended.

        Returns the final ``JobState`` per job, keyed ``JOBID`` or ``ARRAYJOBID_TASKID``.
        """
        left = [str(j) for j in job_ids]
        states: dict[str, str] = {}

        def ended() -> bool:
            for job_id in list(left):
                records = self.jobs(job_id)
                if all(r["JobState"] in FINAL_STATES for r in records):
                    for r in records:
                        task = r.get("ArrayTaskId")
                        states[f"{r['ArrayJobId']}_{task}" if task else r["JobId"]] = r["JobState"]
                    left.remove(job_id)
            return not left

        _poll(ended, timeout, f"jobs {left} to end", interval=0.5)
        return states

    def settle(self, timeout: float = 60) -> None:
        """Wait (at most ``timeout`` s, then go on) until no job is COMPLETING: ended or
        cancelled, its processes still being cleaned up, about to leave the queue."""

        def settled() -> bool:
            proc = self.run("squeue", "-h", "-t", "CG", "-o", "%i", check=False)
            return proc.returncode == 0 and not proc.stdout.strip()

        with contextlib.suppress(TimeoutError):
            _poll(settled, timeout, "completing jobs to leave the queue", interval=0.2)

    def release_requeued(self, job_id: str | int, timeout: float = 60) -> None:
        """Once requeued ``job_id`` is PENDING with Reason=BeginTime (~120 s wait), start it in 2 s;
        or return once slurmkit's releaser has started it again already (Restarts raised, out
        of the hold).

        Address an array task as ``ARRAYJOBID_TASKID``; ``starttime=now`` can fail the relaunch.
        """
        seen: list[bool] = []

        def held_or_released() -> bool:
            records = self.jobs(job_id)
            held = bool(records) and all(
                r["JobState"] == "PENDING" and r["Reason"] == "BeginTime" for r in records
            )
            released = bool(records) and all(  # it runs again (or ran): past the hold
                r.get("Restarts", "0") != "0"
                and r["JobState"] not in ("PENDING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD")
                for r in records
            )
            seen.append(held)
            return held or released

        _poll(held_or_released, timeout, f"job {job_id} pending with Reason=BeginTime")
        if seen[-1]:  # released meanwhile (it runs again): the update fails, harmlessly
            self.run("scontrol", "update", f"jobid={job_id}", "starttime=now+2", check=False)

    def set_node_state(self, node: str, state: str, reason: str = "slurmkit test") -> None:
        """``scontrol update nodename=NODE state=STATE`` (DOWN, DRAIN, RESUME, ...).

        Returns once slurmctld hears from the node again: after RESUME it shows ``idle*`` until
        its next ping (about 1 s).
        """
        self.run("scontrol", "update", f"nodename={node}", f"state={state}", f"reason={reason}")
        _poll(lambda: self._responding("-n", node), 30, f"node {node} to answer")

    def _responding(self, *sinfo_args: str) -> bool:
        """Whether slurmctld has heard from the nodes (state neither ``unk`` nor marked ``*``)."""
        proc = self.run("sinfo", "-h", "-N", "-o", "%t", *sinfo_args, check=False)
        states = proc.stdout.split()
        return (
            proc.returncode == 0
            and bool(states)
            and not any(s.startswith("unk") or s.endswith("*") for s in states)
        )

    def restart_slurmctld(self) -> None:
        """Restart slurmctld on its saved state (jobs survive); wait until every node answers again.

        Needs the rights that started it (root for the private cluster). The ``reconfigure``
        makes the nodes register at once (else they show ``unk`` for ~3 s) and re-read slurm.conf.
        """
        pid = int(Path(self.config()["SlurmctldPidFile"]).read_text())
        os.kill(pid, signal.SIGTERM)
        _poll(lambda: not _running(pid), 30, f"slurmctld {pid} to exit", interval=0.05)
        subprocess.run(
            ["slurmctld", "-f", str(self.conf)],
            env=self.env,
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _poll(
            lambda: self.run("scontrol", "ping", check=False).returncode == 0,
            30,
            "slurmctld to answer",
            interval=0.05,
        )
        self.run("scontrol", "reconfigure")
        _poll(self._responding, 30, "nodes to answer the restarted slurmctld")

    @contextlib.contextmanager
    def max_array_size(self, n: int) -> Iterator[None]:
        """Run the block with ``MaxArraySize=n``; restore slurm.conf and the old limit after it.

        slurmctld caches MaxArraySize at its first array submission and ``scontrol reconfigure``
        does not reset that cache (22.05), so both changes restart slurmctld: for a moment it
        does not answer, so keep other cluster work out of the way.
        """
        original = self.conf.read_text()
        old = self.config()["MaxArraySize"]
        changed, count = re.subn(r"(?m)^MaxArraySize=.*$", f"MaxArraySize={n}", original)
        self.conf.write_text(changed if count else f"{original}MaxArraySize={n}\n")
        try:
            self._apply_max_array_size(str(n))
            yield
        finally:
            self.conf.write_text(original)
            self._apply_max_array_size(old)

    def _apply_max_array_size(self, value: str) -> None:
        self.restart_slurmctld()
        got = self.config()["MaxArraySize"]
        if got != value:
            raise RuntimeError(f"slurmctld reports MaxArraySize={got}, expected {value}")


def _answers(conf: str) -> bool:
    """Whether the slurmctld of ``conf`` answers."""
    try:
        proc = subprocess.run(
            ["scontrol", "ping"],
            env={**os.environ, "SLURM_CONF": conf},
            capture_output=True,
            timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _start_private_cluster() -> str:
    """Run up.sh and return its slurm.conf; skip the test if the cluster cannot run here."""
    proc = subprocess.run([str(UP_SH)], capture_output=True, text=True, timeout=900)
    if proc.returncode == CANNOT_START:
        pytest.skip((proc.stderr.strip().splitlines() or [f"{UP_SH} exited {CANNOT_START}"])[-1])
    if proc.returncode:
        pytest.fail(f"{UP_SH} failed ({proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The Slurm cluster for the session; ``os.environ["SLURM_CONF"]`` points at it meanwhile."""
    conf = os.environ.get("SLURM_CONF", "")
    if not (conf and Path(conf).is_file() and _answers(conf)):
        conf = _start_private_cluster()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", conf)
        yield SlurmCluster(conf=Path(conf), dir=Path(conf).parent, env={**os.environ})


@pytest.fixture(autouse=True)
def _settled_queue(request: pytest.FixtureRequest) -> None:
    """A test on the cluster starts once the jobs that earlier tests ended or cancelled have left
    the queue: a test that counts the queue, or needs the nodes, does not see them go midway
    (the order of the tests on one cluster is not fixed: tests/cluster_shards.py)."""
    if "slurm_cluster" in request.fixturenames:
        request.getfixturevalue("slurm_cluster").settle()
