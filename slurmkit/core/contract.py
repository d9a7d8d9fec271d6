"""Numbers and names shared by the batch script, the runtime and training code (stdlib only)."""

from __future__ import annotations

from collections.abc import Mapping

# A trial (or the runtime) exits with this to say "I checkpointed: requeue me" (EX_TEMPFAIL).
REQUEUE_EXIT = 75
# What the runtime exits with for a cancelled trial that checkpointed and asked for a requeue
# (exit 75): a user's cancel sticks, so never REQUEUE_EXIT (128 + SIGTERM, as if killed).
CANCELLED_EXIT = 143
# What the runtime exits with when Slurm has requeued the job itself (an external `scontrol
# requeue`, a node failure): the trial will run again, and the batch shell has nothing to do.
ALREADY_REQUEUED = 76

# The signal that asks a trial to checkpoint and stop, as a name without "SIG" (e.g. USR2).
ENV_SIGNAL = "SLURMKIT_REQUEUE_SIGNAL"
# The requeue signal when nobody named one (the spec's default, and the environment's).
DEFAULT_SIGNAL = "USR2"
# requeue.enabled's third value: render neither --requeue nor --no-requeue, no signal, no trap
# (the cluster's JobRequeue decides; the runtime asks for no requeue of its own)
LEFT_TO_CLUSTER = "cluster"
# The requeue signals a spec may name (Slurm's --signal, without "SIG").
SIGNALS = ("USR2", "USR1", "URG", "HUP", "INT", "ALRM", "PWR", "XCPU")
# What a named container's name ends with in this attempt (the runtime sets it: job id, attempt
# and a random part); without it, the job id (runtime/containers.py says why).
ENV_CONTAINER = "SLURMKIT_CONTAINER_INSTANCE"
# The path of the spec's dataset NAME in a trial: SLURMKIT_DATA_<NAME> (and SLURMKIT_DATA alone
# when the spec has one dataset).
ENV_DATA = "SLURMKIT_DATA"


def requeue_mark(trial_dir: str, attempt: int | str) -> str:
    """The file ``preemption.exit_for_requeue`` leaves for this attempt: its request reaches the
    runtime even where a launcher in between (torchrun) turns exit 75 into exit 1."""
    return f"{trial_dir}/.requeue-asked-{attempt}"


def requeue_signal(env: Mapping[str, str]) -> str:
    """The requeue signal a process of the job was told (:data:`ENV_SIGNAL` in ``env``), as a
    name without "SIG"; :data:`DEFAULT_SIGNAL` when none was."""
    return (env.get(ENV_SIGNAL) or DEFAULT_SIGNAL).upper().removeprefix("SIG")
