"""What the runtime will run for one trial, worked out on the login node (``render --exact``):
the srun argv and the environment it hands to srun, for an example job, so that a porter can
diff them against the script they port. The runtime's own :func:`slurmkit.runtime.trial.step`
computes them; only the job's values (its id, nodes) are this example's."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .core.jobcontract import JobContract
from .errors import UserError
from .plan import expand, make
from .runtime.trial import step
from .spec.model import SweepSpec
from .store import sweep_config

EXAMPLE_JOB = "4242"  # the example job's id: MASTER_PORT and container names follow from it
SWEEP_DIR = "SWEEP_DIR"  # where the sweep directory will be (made at submit)


def example_slurm(spec: SweepSpec, index: int) -> dict[str, str]:
    """The Slurm variables of an example array task that runs trial ``index``."""
    nodes = spec.resources.nodes or 1
    last = f"{nodes:03d}"
    nodelist = "node-001" if nodes == 1 else f"node-[001-{last}]"
    return {
        "SLURM_JOB_ID": EXAMPLE_JOB,
        "SLURM_ARRAY_JOB_ID": EXAMPLE_JOB,
        "SLURM_ARRAY_TASK_ID": str(index),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NNODES": str(nodes),
        "SLURMD_NODENAME": "node-001",
    }


def exact(spec: SweepSpec, index: int, submit_dir: str) -> tuple[list[str], dict[str, str]]:
    """Trial ``index``'s argv and the variables the runtime sets (over the batch shell's own,
    which pass through unchanged) for the example job of :func:`example_slurm`."""
    trials = expand(spec)
    if not 0 <= index < len(trials):
        raise UserError(
            f"no trial {index}: the spec has {len(trials)}",
            key="--trial",
            hint=f"an index 0..{len(trials) - 1}",
        )
    plan = make(spec, trials, submit_dir)
    contract = JobContract.from_dict(sweep_config(plan), spec.source or "the spec")
    row: Mapping[str, Any] = {
        "index": index,
        "id": trials.ids[index],
        "params": trials[index].params,
    }
    slurm = example_slurm(spec, index)
    base = {**slurm, "PATH": os.environ.get("PATH", "")}
    trial_dir = f"{SWEEP_DIR}/trials/{row['id']}"
    argv, env = step(
        contract,
        row,
        base,
        sweep_root=SWEEP_DIR,
        trial_dir=trial_dir,
        attempt=1,
        signal=contract.requeue.signal,
    )
    return argv, {k: v for k, v in env.items() if base.get(k) != v}
