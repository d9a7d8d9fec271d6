"""How a trial's command is launched inside its allocation: directly, or through ``srun``
(several tasks or nodes, pyxis container options, the self-check, a ``torchrun`` launcher).

The result is argv (no shell, no user value in a script): ``sweep.json`` stores it and the
runtime puts it before the command, after filling in the rendezvous values it knows on the
first node (:func:`fill`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spec import SweepSpec

SELF_CHECK = ["bash", "-c", 'python3 -m slurmkit.runtime.selfcheck && exec "$@"', "slurmkit"]


def plan(spec: SweepSpec, submit_dir: str) -> dict[str, list[str]]:
    """``{"step": [...srun + container options + self-check], "launcher": [...torchrun]}``;
    both empty when the command runs as it is (one task on one node, no container)."""
    r = spec.resources
    if not (spec.container or spec.launcher or r.nodes > 1 or r.tasks_per_node > 1):
        return {"step": [], "launcher": []}
    per_node = r.gpu_count or r.tasks_per_node
    tasks = 1 if spec.launcher == "torchrun" else (per_node if spec.launcher == "srun"
                                                   else r.tasks_per_node)
    step = ["srun", "--kill-on-bad-exit=1", f"--nodes={r.nodes}", f"--ntasks={r.nodes * tasks}",
            f"--ntasks-per-node={tasks}"]
    if spec.container:
        from .pyxis import container_options

        step += container_options(spec.container, submit_dir=spec.workdir or submit_dir,
                                  env_names=spec.env, source=spec.source)
        if spec.self_check:
            step += SELF_CHECK
    launcher = []
    if spec.launcher == "torchrun":
        launcher = ["torchrun", "--no-python", "--nnodes={nnodes}", f"--nproc-per-node={per_node}",
                    "--rdzv-backend=c10d", "--rdzv-endpoint={master_addr}:{master_port}",
                    "--rdzv-id={job_id}"]
    return {"step": step, "launcher": launcher}


def rendezvous(env: dict[str, str]) -> dict[str, str]:
    """MASTER_ADDR (the allocation's first node) and MASTER_PORT (from the job id), unless set."""
    from .runtime.distributed import first_host, job_port

    job = env.get("SLURM_JOB_ID", "0")
    return {"MASTER_ADDR": env.get("MASTER_ADDR") or first_host(env.get("SLURM_JOB_NODELIST", "localhost")),
            "MASTER_PORT": env.get("MASTER_PORT") or str(job_port(job))}


def fill(launch: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The argv prefix with the launcher's tokens replaced (only in our own launcher part)."""
    values = {"{master_addr}": env["MASTER_ADDR"], "{master_port}": env["MASTER_PORT"],
              "{nnodes}": env.get("SLURM_NNODES", "1"), "{job_id}": env.get("SLURM_JOB_ID", "0")}
    launcher = []
    for arg in launch.get("launcher", []):
        for token, value in values.items():
            arg = arg.replace(token, value)
        launcher.append(arg)
    return [*launch.get("step", []), *launcher]

