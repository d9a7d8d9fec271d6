"""The shared poll cache: any number of callers of one user cost one scheduler query per
interval; a job missing from the answer is asked once more, then from accounting, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, counted_queries

from slurmkit.backends.base import TaskState
from slurmkit.backends.pollcache import PollCache

RUNNING = TaskState("RUNNING", "None")


class Scheduler:
    """Answers like squeue -u and sacct, and counts the questions."""

    def __init__(self) -> None:
        self.live: dict[tuple[str, int], TaskState] = {("10", 0): RUNNING, ("10", 1): RUNNING}
        self.ended: dict[tuple[str, int], TaskState] = {("7", 0): TaskState("COMPLETED", "", 0)}
        self.user_calls = 0
        self.gone_calls: list[list[str]] = []
        self.delay = 0.0

    def ask_user(self):
        self.user_calls += 1
        time.sleep(self.delay)
        return dict(self.live)

    def ask_gone(self, jobs):
        self.gone_calls.append(jobs)
        return {k: v for k, v in self.ended.items() if k[0] in jobs}


def test_callers_within_the_interval_share_one_query(tmp_path):
    sched = Scheduler()
    cache = PollCache("alice", 60, str(tmp_path))
    for _ in range(5):
        got = cache.tasks({"10"}, sched.ask_user, sched.ask_gone)
        assert got == {("10", 0): RUNNING, ("10", 1): RUNNING}
    assert sched.user_calls == 1 and sched.gone_calls == []


def test_an_old_answer_is_asked_again(tmp_path):
    sched = Scheduler()
    cache = PollCache("alice", 0.2, str(tmp_path))
    cache.tasks({"10"}, sched.ask_user, sched.ask_gone)
    time.sleep(0.3)
    sched.live[("10", 0)] = TaskState("COMPLETED", "None")
    assert cache.tasks({"10"}, sched.ask_user, sched.ask_gone)[("10", 0)].state == "COMPLETED"
    assert sched.user_calls == 2


def test_a_job_newer_than_the_answer_is_asked_at_once(tmp_path):
    """A sweep submitted a moment ago: the cached answer cannot hold it, so it is asked again
    now (not after the interval), once."""
    sched = Scheduler()
    cache = PollCache("alice", 60, str(tmp_path))
    cache.tasks({"10"}, sched.ask_user, sched.ask_gone)
    sched.live[("11", 0)] = RUNNING
    assert cache.tasks({"11"}, sched.ask_user, sched.ask_gone) == {("11", 0): RUNNING}
    assert cache.tasks({"10", "11"}, sched.ask_user, sched.ask_gone)[("10", 1)] == RUNNING
    assert sched.user_calls == 2 and sched.gone_calls == []


def test_an_ended_job_is_asked_from_accounting_once_and_kept(tmp_path):
    sched = Scheduler()
    cache = PollCache("alice", 0.1, str(tmp_path))
    for _ in range(3):
        got = cache.tasks({"7", "8"}, sched.ask_user, sched.ask_gone)
        assert got == {("7", 0): TaskState("COMPLETED", "", 0)}  # 8: accounting knows nothing
        time.sleep(0.15)
    assert sched.gone_calls == [["7", "8"]]  # once, whatever the answers' age
    assert sched.user_calls == 3  # the live answer is asked once per interval


@pytest.mark.slow
def test_concurrent_callers_wait_for_one_answer(tmp_path):
    sched = Scheduler()
    sched.delay = 0.3  # a slow squeue: everyone arrives while it runs
    got: list[dict] = []

    def call() -> None:
        got.append(
            PollCache("alice", 60, str(tmp_path)).tasks({"10"}, sched.ask_user, sched.ask_gone)
        )

    threads = [threading.Thread(target=call) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sched.user_calls == 1 and len(got) == 10 and all(g == got[0] for g in got)


def test_a_damaged_cache_is_asked_again(tmp_path):
    sched = Scheduler()
    cache = PollCache("alice", 60, str(tmp_path))
    os.makedirs(tmp_path, exist_ok=True)
    Path(cache.path).write_text("{garbage")
    assert cache.tasks({"10"}, sched.ask_user, sched.ask_gone)[("10", 0)] == RUNNING
    assert json.loads(Path(cache.path).read_text())["time"] > 0


@pytest.mark.cluster
def test_ten_concurrent_status_calls_ask_the_scheduler_once(slurm_cluster, tmp_path):
    """Ten `slurmkit status` processes at once on a running sweep, with PATH shims that log
    each squeue and sacct call: one squeue, as for one caller."""
    from conftest import slurm_submit

    result = slurm_submit(tmp_path, "command: [sleep, '20']\nargs: none\nparams: {i: [1, 2]}\n")
    root = result["sweep_dir"]
    log, env = counted_queries(tmp_path, 30)
    argv = [sys.executable, "-m", "slurmkit.cli", "status", root, "--json"]
    procs = [
        subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(10)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(json.loads(o)["counts"] for o in outs)
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("squeue") and "--user=" in calls[0], calls
    subprocess.run([*argv[:3], "cancel", root], env=env, check=True, capture_output=True)
