"""How a trial's command is launched inside its allocation: directly, or through ``srun``
(several tasks or nodes, pyxis container options, the self-check, a ``torchrun`` launcher).

The result is argv (no shell, no user value in a script): ``sweep.json`` stores it and the
runtime puts it before the command, after filling in the rendezvous values it knows on the
first node (:func:`slurmkit.core.rendezvous.fill`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import SweepSpec

SELF_CHECK = ["bash", "-c", 'python3 -m slurmkit.runtime.selfcheck && exec "$@"', "slurmkit"]


def srun_options(options: dict[str, str | int | bool]) -> list[str]:
    """The spec's ``srun`` block as options (validated values: no shell ever sees them)."""
    flags = {key: key.replace("_", "-") for key in options}
    return [f"--{flags[k]}" if v is True else f"--{flags[k]}={v}" for k, v in options.items()]


def build(spec: SweepSpec, submit_dir: str) -> dict[str, list[str]]:
    """``{"step": [...srun + container options + self-check], "launcher": [...torchrun]}``;
    both empty when the command runs as it is (one task on one node, no container)."""
    r = spec.resources
    if not (spec.container or spec.launcher or spec.srun or r.nodes > 1 or r.tasks_per_node > 1):
        return {"step": [], "launcher": []}
    per_node = r.gpu_count or r.tasks_per_node
    tasks = (
        1
        if spec.launcher == "torchrun"
        else (per_node if spec.launcher == "srun" else r.tasks_per_node)
    )
    step = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={r.nodes}",
        f"--ntasks={r.nodes * tasks}",
        f"--ntasks-per-node={tasks}",
        *srun_options(spec.srun),
    ]
    if spec.container:
        from . import pyxis  # ~3 ms (its regexes, hashlib): only container jobs need it

        step += pyxis.srun_options(
            spec.container,
            submit_dir=spec.workdir or submit_dir,
            env_names=spec.env,
            source=spec.source,
        )
        if spec.self_check:
            step += SELF_CHECK
    launcher = []
    if spec.launcher == "torchrun":
        launcher = [
            "torchrun",
            "--no-python",
            "--nnodes={nnodes}",
            f"--nproc-per-node={per_node}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint={master_addr}:{master_port}",
            "--rdzv-id={job_id}",
        ]
    return {"step": step, "launcher": launcher}
