"""Requeue decisions (pure logic). The real sequences run in test_cluster_requeue.py; these
cover the branches a cluster cannot produce on demand (e.g. scontrol answering nothing)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from slurmkit.core.contract import REQUEUE_EXIT
from slurmkit.runtime import requeue

BUDGETS = {"preemption": None, "timeout": 3, "node_failure": 3, "error": 0}
NOW = datetime(2026, 11, 30, 12, 0, 0)


def info(**kw: str) -> dict[str, str]:
    base = {
        "JobState": "RUNNING",
        "Restarts": "0",
        "PreemptTime": "None",
        "EndTime": (NOW + timedelta(hours=1)).isoformat(),
        "TimeLimit": "01:00:00",
        "RunTime": "00:10:00",
    }
    return {**base, **kw}


@pytest.mark.parametrize(
    "signals,job,cause",
    [
        (["USR2"], info(EndTime=(NOW + timedelta(seconds=100)).isoformat()), "timeout"),
        (["USR2"], info(PreemptTime=NOW.isoformat()), "preemption"),
        (["USR2"], info(), "preemption"),  # scancel --batch --signal=USR2
        (["TERM"], info(JobState="COMPLETING", Restarts="1", EndTime="Unknown"), "preemption"),
        (["TERM"], info(JobState="COMPLETING", EndTime=NOW.isoformat()), None),  # scancel
        (["TERM"], info(JobState="COMPLETING", RunTime="01:00:00"), "timeout"),
        (["TERM"], info(JobState="NODE_FAIL"), "node_failure"),
        (["TERM"], info(JobState="IDLE", NodeState="DOWN+DRAIN"), "node_failure"),
        (["TERM"], info(JobState="PENDING", Restarts="1", NodeState="IDLE"), "node_failure"),
        (["TERM"], {}, "preemption"),  # scontrol unavailable
    ],
)
def test_classify(signals, job, cause):
    assert requeue.classify(signals, "USR2", job, 120, 0, now=NOW.timestamp()) == cause


def test_restart_count_at_start_is_the_baseline():
    job = info(JobState="COMPLETING", Restarts="2", EndTime=NOW.isoformat())
    assert requeue.classify(["TERM"], "USR2", job, 120, 2, now=NOW.timestamp()) is None


def test_decide_budgets_per_cause():
    assert requeue.decide(0, None, False, [], BUDGETS).state == "COMPLETED"
    out = requeue.decide(REQUEUE_EXIT, "timeout", True, [{"cause": "timeout"}] * 2, BUDGETS)
    assert (out.state, out.code, out.cause) == ("REQUEUED", REQUEUE_EXIT, "timeout")
    out = requeue.decide(REQUEUE_EXIT, "timeout", True, [{"cause": "timeout"}] * 3, BUDGETS)
    assert (out.state, out.cause) == ("FAILED", "timeout") and "budget exhausted (3" in out.reason
    assert out.code != REQUEUE_EXIT
    out = requeue.decide(REQUEUE_EXIT, "preemption", True, [{"cause": "preemption"}] * 50, BUDGETS)
    assert out.state == "REQUEUED"
    out = requeue.decide(3, None, False, [], BUDGETS)
    assert (out.state, out.code, out.cause, out.reason) == ("FAILED", 3, "error", "")
    out = requeue.decide(3, None, False, [], {**BUDGETS, "error": 1})
    assert (out.state, out.cause) == ("REQUEUED", "error")
    out = requeue.decide(143, None, True, [], BUDGETS)
    assert out.state == "CANCELLED" and out.code == 143


def test_a_cancelled_trial_that_checkpointed_is_not_requeued():
    """The trial handled SIGTERM, checkpointed and exited 75: the user cancelled, so the
    runtime must not pass 75 on (the batch shell would run `scontrol requeue`)."""
    out = requeue.decide(REQUEUE_EXIT, None, True, [], BUDGETS)
    assert out.state == "CANCELLED" and out.code != REQUEUE_EXIT and out.code == 143


def _sweep_with_vanished_attempt(tmp_path, spec_file, budget: int):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod
    from slurmkit.core.fsutil import atomic_write_json

    s = spec_mod.load(
        str(
            spec_file(
                f"command: [/bin/true]\nargs: none\nparams: {{a: [1]}}\n"
                f"requeue: {{budgets: {{node_failure: {budget}}}}}\n"
            )
        )
    )
    trials = plan.expand(s)
    import os

    sweep = store.create(plan.make(s, trials, os.getcwd()), str(tmp_path / "sweep"))
    os.makedirs(sweep.trial(trials[0].id))
    atomic_write_json(
        sweep.status(trials[0].id),
        {
            "id": trials[0].id,
            "index": 0,
            "state": "RUNNING",
            "attempts": [{"n": 1, "state": "RUNNING", "host": "n9", "start": 0}],
        },
    )
    return sweep, trials[0].id


def test_vanished_attempt_counts_as_node_failure(tmp_path, spec_file, monkeypatch):
    from slurmkit.core.fsutil import read_json
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    sweep, tid = _sweep_with_vanished_attempt(tmp_path, spec_file, budget=1)
    run = TrialRun(sweep, 0, under_slurm=True)
    run.start()
    assert run.wait() == 0
    status = read_json(sweep.status(tid))
    assert [(a["state"], a.get("cause")) for a in status["attempts"]] == [
        ("NODE_FAIL", "node_failure"),
        ("COMPLETED", None),
    ]


def test_node_failure_budget_spent_fails_without_running(tmp_path, spec_file, monkeypatch):
    from slurmkit.core.fsutil import read_json
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    sweep, tid = _sweep_with_vanished_attempt(tmp_path, spec_file, budget=0)
    run = TrialRun(sweep, 0, under_slurm=True)
    run.start()
    assert run.proc is None and run.wait() == 1
    status = read_json(sweep.status(tid))
    assert status["state"] == "FAILED" and status["cause"] == "node_failure"
    assert len(status["attempts"]) == 1


def test_preemption_flag_and_late_signals_are_ignored_at_exit():
    import subprocess
    import sys

    code = """
import atexit, os, signal
from slurmkit.runtime import preemption
preemption.install()
os.kill(os.getpid(), signal.SIGUSR2)
assert preemption.should_stop() and preemption.received() == ["SIGUSR2"]
atexit._run_exitfuncs()
# Python restores SIG_DFL for its own handlers while it finalizes; a late USR2 must not kill
# a run that has finished, so the exit hook leaves it ignored
assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_second_stop_signal_inside_the_first_handler_does_not_deadlock():
    """Slurm signals the process group and the runtime forwards the same signal: a handler can
    run inside another. A trace hook sends a new SIGTERM at every line the handler runs."""
    import subprocess
    import sys

    code = """
import os, signal, sys
from slurmkit.runtime import preemption
preemption.install()
sent = 0
def lines(frame, event, arg):
    global sent
    if event == "line" and sent < 40:
        sent += 1
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next check, in this one
    return lines
def calls(frame, event, arg):
    return lines if event == "call" else None
sys.settrace(calls)
os.kill(os.getpid(), signal.SIGTERM)
for _ in range(1000):
    pass
sys.settrace(None)
assert preemption.should_stop()
assert set(preemption.received()) == {"SIGTERM"} and len(preemption.received()) > 1, sent
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_requeued_by_slurm_reads_restarts():
    assert requeue.requeued_by_slurm({"Restarts": "2"}, 1)
    assert not requeue.requeued_by_slurm({"Restarts": "1"}, 1)
    assert not requeue.requeued_by_slurm({}, 0) and not requeue.requeued_by_slurm(
        {"Restarts": "x"}, 0
    )


def test_a_time_limit_requeues_only_a_trial_that_asked_for_it():
    """A command that ignores the stop signal (killed at the limit, 143) is not rerun from
    scratch three times; one that checkpointed and exited 75 is requeued."""
    out = requeue.decide(143, "timeout", True, [], BUDGETS)
    assert (out.state, out.code, out.cause) == ("TIMEOUT", 143, "timeout")
    assert "not requeued" in out.reason
    out = requeue.decide(REQUEUE_EXIT, "timeout", True, [], BUDGETS)
    assert out.state == "REQUEUED"
    out = requeue.decide(143, "preemption", True, [], BUDGETS)  # not the trial's doing
    assert out.state == "REQUEUED"
