"""Named containers (``container.name``) kept to the attempt that made them.

pyxis keeps a named container on the node after the job (its default, global scope) and reuses
whatever has that name, whole or not, whatever image it came from. So each attempt of a trial
names its own (``NAME-DIGEST-JOBID.ATTEMPT.RANDOM``, through ``ENV_CONTAINER``): a requeue while
pyxis unpacks leaves a half-made container that no later attempt uses, and a job id seen again
(a controller's state reset) never meets an old job's container. When the attempt ends the
runtime removes its container on every node of the allocation (``srun`` one task per node,
``enroot remove``); one it could not remove (the job killed first, a node lost) is in the
attempt's record, and the trial's next attempt removes it on the nodes it gets. The price: a
named container is unpacked once per attempt, not reused across requeues.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..core.contract import ENV_CONTAINER
from ..core.rendezvous import CONTAINER_NAME

# Run by `sh -c` on each node, NAME as $1: pyxis's names for it in the global scope
# (pyxis_NAME) and the job scope (pyxis_JOBID_NAME). No enroot there: nothing to remove.
REMOVE = """command -v enroot >/dev/null 2>&1 || exit 0
enroot list 2>/dev/null | while read -r c; do
  case $c in
    "pyxis_$1" | pyxis_[0-9]*_"$1")
      enroot remove --force "$c" >/dev/null 2>&1 || { echo "cannot remove $c" >&2; exit 1; } ;;
  esac
done"""
REMOVE_TIMEOUT = 120.0  # seconds for the removal on every node


def instance(job_id: str, attempt: int) -> str:
    """This attempt's part of the container name."""
    return f"{job_id}.{attempt}.{os.urandom(3).hex()}"


def named_env(
    launch_step: Sequence[str], env: Mapping[str, str], attempt: int
) -> Mapping[str, str]:
    """``env`` with this attempt's instance (:data:`ENV_CONTAINER`) when, under Slurm, the step
    names a container; else ``env`` as it is."""
    job = env.get("SLURM_JOB_ID")
    if job and any(arg.startswith(CONTAINER_NAME) for arg in launch_step):
        return {**env, ENV_CONTAINER: instance(job, attempt)}
    return env


def named(argv: Sequence[str]) -> str | None:
    """The container name an argv asks pyxis for (without its ``:flag``), or None."""
    for arg in argv:
        if arg.startswith(CONTAINER_NAME):
            return arg[len(CONTAINER_NAME) :].partition(":")[0]
    return None


def remove_argv(name: str, nodes: str) -> list[str]:
    """The ``srun`` that removes container ``name`` on each of the allocation's ``nodes``."""
    return [
        "srun",
        "--overlap",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        "--job-name=slurmkit-container-cleanup",
        "sh",
        "-c",
        REMOVE,
        "slurmkit-container-cleanup",
        name,
    ]


def adopt(argv: Sequence[str], attempts: list[dict[str, Any]], env: Mapping[str, str]) -> bool:
    """Under Slurm, with a named container in ``argv``: record it in the last of ``attempts``
    and remove the ones earlier attempts left; whether the record changed (to be saved)."""
    name = named(argv) if env.get("SLURM_JOB_ID") else None
    if name is None:
        return False
    *before, attempt = attempts
    attempt["container_name"] = name
    left = {
        a["container_name"]: a for a in before if a.get("container_name") and not a.get("removed")
    }
    for gone in remove(left, env):
        left[gone]["removed"] = True
    return True


def release(attempt: dict[str, Any], env: Mapping[str, str]) -> bool:
    """Remove the attempt's named container on every node; whether it was (to be saved)."""
    name = attempt.get("container_name")
    if not name or not remove([name], env):
        return False
    attempt["removed"] = True
    return True


def remove(names: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """Remove each container in ``names`` on the nodes of this job; the ones removed."""
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    done = []
    for name in names:
        try:
            proc = subprocess.run(
                remove_argv(name, nodes),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=dict(env),
                timeout=REMOVE_TIMEOUT,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            done.append(name)
    return done
