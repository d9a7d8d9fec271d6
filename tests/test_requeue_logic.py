"""Requeue decisions (pure logic). The real sequences run in test_cluster_requeue.py; these
cover the branches a cluster cannot produce on demand (e.g. scontrol answering nothing)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from slurmkit.runtime import requeue
from slurmkit.runtime.contract import REQUEUE_EXIT

BUDGETS = {"preemption": None, "timeout": 3, "node_failure": 3, "error": 0}
NOW = datetime(2026, 11, 30, 12, 0, 0)


def info(**kw: str) -> dict[str, str]:
    base = {"JobState": "RUNNING", "Restarts": "0", "PreemptTime": "None",
            "EndTime": (NOW + timedelta(hours=1)).isoformat(), "TimeLimit": "01:00:00",
            "RunTime": "00:10:00"}
    return {**base, **kw}


@pytest.mark.parametrize("signals,job,cause", [
    (["USR2"], info(EndTime=(NOW + timedelta(seconds=100)).isoformat()), "timeout"),
    (["USR2"], info(PreemptTime=NOW.isoformat()), "preemption"),
    (["USR2"], info(), "preemption"),                              # scancel --batch --signal=USR2
    (["TERM"], info(JobState="COMPLETING", Restarts="1", EndTime="Unknown"), "preemption"),
    (["TERM"], info(JobState="COMPLETING", EndTime=NOW.isoformat()), None),  # scancel
    (["TERM"], info(JobState="COMPLETING", RunTime="01:00:00"), "timeout"),
    (["TERM"], info(JobState="NODE_FAIL"), "node_failure"),
    (["TERM"], {}, "preemption"),                                  # scontrol unavailable
])
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
