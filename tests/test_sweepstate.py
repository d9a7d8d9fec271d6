"""How `status` decides a trial's state: one test per row of status.CASES, and the merge of a
trial's status file with its live task."""

from __future__ import annotations

import pytest

from slurmkit import sweepstate
from slurmkit.backends.base import LiveTask, TaskState
from slurmkit.core import states
from slurmkit.sweepstate import CASES, Seen, decide


def seen(file=None, slurm=None, same_job=False, owned=False, here=False) -> Seen:
    return Seen(file=file, slurm=slurm, same_job=same_job, owned=owned, here=here)


# (the row that must decide, what it sees, the state it decides); one example per row, in order
ROWS = [
    ("damaged", seen(file="DAMAGED", slurm="COMPLETED", same_job=True, owned=True), "DAMAGED"),
    ("completed", seen(file="COMPLETED", slurm="RUNNING", same_job=True, owned=True), "COMPLETED"),
    (
        "requeued by its own task",
        seen(file="REQUEUED", slurm="PENDING", same_job=True, owned=True),
        "REQUEUED",
    ),
    (
        "running in its own task",
        seen(file="RUNNING", slurm="COMPLETING", same_job=True, owned=True),
        "RUNNING",
    ),
    (
        "ended in its own task",
        seen(file="FAILED", slurm="COMPLETING", same_job=True, owned=True),
        "FAILED",
    ),
    (
        "queued or running",
        seen(file="FAILED", slurm="PENDING", same_job=False, owned=True),
        "PENDING",
    ),
    (
        "vanished, and the scheduler says",
        seen(file="RUNNING", slurm="NODE_FAIL", owned=True),
        "NODE_FAIL",
    ),
    ("vanished, with no scheduler task", seen(file="RUNNING"), "TERMINATED"),
    ("vanished, and the scheduler forgot", seen(file="REQUEUED", owned=True), "UNKNOWN"),
    ("ended: its record says how", seen(file="FAILED", slurm="FAILED", owned=True), "FAILED"),
    (
        "never started, and the scheduler says",
        seen(slurm="CANCELLED by 0", owned=True),
        "CANCELLED",
    ),
    ("never started, and the scheduler forgot", seen(owned=True), "UNKNOWN"),
    ("about to start here", seen(here=True), "PENDING"),
    ("never submitted", seen(), "NOT_SUBMITTED"),
]


def test_every_row_has_an_example_in_order():
    assert len(ROWS) == len(CASES)
    for (prefix, _, _), case in zip(ROWS, CASES):
        assert case.name.startswith(prefix), (prefix, case.name)


@pytest.mark.parametrize("prefix, what, expected", ROWS, ids=[r[0] for r in ROWS])
def test_row(prefix, what, expected):
    state, case = decide(what)
    assert case.name.startswith(prefix)
    assert state == expected


def test_requeued_and_running_again_follows_the_scheduler():
    state, case = decide(seen(file="REQUEUED", slurm="RUNNING", same_job=True, owned=True))
    assert state == "RUNNING" and case is CASES[2]


def test_ended_record_waits_for_a_requeued_task():
    """A FAILED record whose task Slurm requeued (PENDING again) is no longer the answer."""
    state, case = decide(seen(file="FAILED", slurm="REQUEUE_HOLD", same_job=True, owned=True))
    assert state == "REQUEUED" and case is CASES[5]


def test_terminated_record_in_a_live_task_is_the_tasks_state():
    state, _ = decide(seen(file="TERMINATED", slurm="RUNNING", same_job=True, owned=True))
    assert state == "RUNNING"


def test_a_live_local_run_keeps_a_running_record():
    state, case = decide(seen(file="RUNNING", here=True))
    assert state == "RUNNING" and case.name.startswith("ended: its record")


def test_every_state_a_case_gives_is_a_known_state():
    for _, what, _ in ROWS:
        assert decide(what)[0] in states.ORDER


ROW = {"index": 3, "id": "abc123", "params": {"x": 1}}


def test_merge_reads_attempts_and_the_live_task():
    st = {
        "state": "RUNNING",
        "exit_code": None,
        "cause": None,
        "attempts": [{"n": 1, "host": "n2", "array_job_id": "41", "array_task_id": "3"}],
    }
    t = sweepstate._merge(ROW, st, LiveTask("41_3", TaskState("RUNNING", "None"), False))
    assert (t.state, t.attempts, t.host, t.job, t.reason) == ("RUNNING", 1, "n2", "41_3", "")


def test_merge_takes_the_exit_code_from_accounting_when_the_trial_never_started():
    t = sweepstate._merge(ROW, None, LiveTask("41_3", TaskState("FAILED", "", 9), False))
    assert (t.state, t.exit_code) == ("FAILED", 9)


def test_merge_prefers_the_runtime_s_reason_for_how_a_trial_ended():
    """Slurm says NonZeroExitCode; the runtime knew better (papercut 23.19)."""
    st = {
        "state": "FAILED",
        "exit_code": 1,
        "cause": "container",
        "reason": "its container did not start (see its output.log)",
        "attempts": [{"n": 1, "host": "n2", "array_job_id": "41", "array_task_id": "3"}],
    }
    ended = LiveTask("41_3", TaskState("FAILED", "NonZeroExitCode", 1), False)
    t = sweepstate._merge(ROW, st, ended)
    assert (t.state, t.reason) == ("FAILED", "its container did not start (see its output.log)")
    assert sweepstate._merge(ROW, st, None).reason == st["reason"]  # the task is forgotten
    waiting = LiveTask("52_3", TaskState("PENDING", "Priority"), False)  # resubmitted: Slurm's
    assert sweepstate._merge(ROW, st, waiting).reason == "Priority"


def test_merge_shows_a_pending_reason():
    t = sweepstate._merge(ROW, None, LiveTask("41_3", TaskState("PENDING", "Priority"), False))
    assert (t.state, t.reason) == ("PENDING", "Priority")


def test_a_damaged_record_of_a_live_task_follows_the_task():
    """A damaged status file of a trial that still runs is not DAMAGED (resume would run it a
    second time): the scheduler, or the live process here, says what it is."""
    assert decide(seen(file="DAMAGED", slurm="RUNNING", same_job=True, owned=True))[0] == "RUNNING"
    assert decide(seen(file="DAMAGED", slurm="PENDING", owned=True))[0] == "PENDING"
    assert decide(seen(file="DAMAGED", here=True))[0] == "PENDING"
