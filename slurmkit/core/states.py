"""Trial states and how Slurm's job states map onto them (stdlib only).

Every trial state name and every set of them is defined here; other modules use these names.
"""

from __future__ import annotations

PENDING = "PENDING"  # submitted, not started
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"  # the command exited 0
PRUNED = "PRUNED"  # stopped early by the sweep's search (core/search.py): ended well, exit 0
FAILED = "FAILED"  # the command exited non-zero
TERMINATED = "TERMINATED"  # stopped by a signal (cancel, time limit, preemption, node loss)
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
PREEMPTED = "PREEMPTED"
NODE_FAIL = "NODE_FAIL"
REQUEUED = "REQUEUED"
UNKNOWN = "UNKNOWN"  # submitted, but the scheduler no longer knows it and it left no status
NOT_SUBMITTED = "NOT_SUBMITTED"
DAMAGED = "DAMAGED"  # its status file (or manifest line) cannot be read: not completed

ORDER = (
    COMPLETED,
    PRUNED,
    RUNNING,
    PENDING,
    REQUEUED,
    FAILED,
    TIMEOUT,
    CANCELLED,
    PREEMPTED,
    NODE_FAIL,
    TERMINATED,
    UNKNOWN,
    DAMAGED,
    NOT_SUBMITTED,
)
FINAL = {
    COMPLETED,
    PRUNED,
    FAILED,
    TERMINATED,
    CANCELLED,
    TIMEOUT,
    PREEMPTED,
    NODE_FAIL,
    UNKNOWN,
    DAMAGED,
}
SUCCESS = {COMPLETED, PRUNED}  # ended as asked: not to be run again, not a failure
UNSUCCESSFUL = FINAL - SUCCESS  # `slurmkit status` exits 1 when a trial is in one of these
ACTIVE = {PENDING, RUNNING, REQUEUED}  # still queued or running: not to be submitted again
# a record that needs a live process (or its requeue) behind it: without one, it vanished
IN_FLIGHT = {RUNNING, TERMINATED, REQUEUED}

# Slurm job states (squeue %T, sacct State, scontrol's JobState). TIMEOUT, PREEMPTED, NODE_FAIL,
# CANCELLED, COMPLETED, FAILED and PENDING are Slurm's words for the trial states of those names.
SLURM_PENDING = PENDING
# ... that mean "still in the scheduler's hands"
SLURM_ACTIVE = {
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
}
# ... of which these are waiting to start (again)
SLURM_WAITING = (SLURM_PENDING, "REQUEUE")
_SLURM_RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING"}
_SLURM_FINAL = {
    "COMPLETED": COMPLETED,
    "FAILED": FAILED,
    "CANCELLED": CANCELLED,
    "TIMEOUT": TIMEOUT,
    "PREEMPTED": PREEMPTED,
    "NODE_FAIL": NODE_FAIL,
    "OUT_OF_MEMORY": FAILED,
    "BOOT_FAIL": FAILED,
    "DEADLINE": CANCELLED,
    "REVOKED": CANCELLED,
    "SPECIAL_EXIT": FAILED,
}


def from_slurm(state: str) -> str:
    """A Slurm job state as a trial state (``CANCELLED by 0`` -> ``CANCELLED``)."""
    word = state.split()[0].rstrip("+") if state else ""
    if word in _SLURM_RUNNING:
        return RUNNING
    if word in SLURM_ACTIVE:
        return REQUEUED if word.startswith("REQUEUE") else PENDING
    return _SLURM_FINAL.get(word, UNKNOWN)


def slurm_waiting(state: str) -> bool:
    """A Slurm state of a task waiting to start (again): PENDING, REQUEUED, REQUEUE_HOLD..."""
    return state.startswith(SLURM_WAITING)
