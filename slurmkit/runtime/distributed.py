"""torch.distributed set up from torchrun's or Slurm's environment (stdlib only at import).

    from slurmkit.runtime import distributed
    info = distributed.init()                  # nccl on GPUs, gloo on CPU
    model = DDP(model.to(info.device))

Where the numbers come from, first match wins:

* torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``),
  also what enroot's PyTorch hook sets inside a container;
* a Slurm step, one task per process (``srun``): ``SLURM_PROCID``, ``SLURM_LOCALID``,
  ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``, ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE``;
  the batch script's own process (no ``SLURM_STEP_ID``) is a single process;
* otherwise a single process.

``MASTER_ADDR``/``MASTER_PORT`` are used when set (and not empty); on Slurm they default to the
step's first node, read from the node list without ``scontrol`` (absent in most images), and
``10000 + SLURM_JOB_ID % 50000``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from ..core.rendezvous import first_host, job_port

DEFAULT_PORT = 29500  # torch's own default, for a master given without a port


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job. ``device`` is ``cuda:N`` or ``cpu``; ``master_port`` is
    0 for a single process (no rendezvous needed)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    device: str = "cpu"


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed task counts, ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in filter(None, spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"cannot read tasks per node {spec!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        if env.get(name):
            return int(env[name])
    if default is None:
        raise KeyError(f"none of {', '.join(names)} is set")
    return default


def rank_info(env: Mapping[str, str], gpus: int = 0) -> RankInfo:
    """The :class:`RankInfo` that ``env`` describes (pure: no torch, no subprocess).

    ``gpus``: CUDA devices this process sees; the device is then ``cuda:LOCAL_RANK % gpus``
    (one visible GPU per task gives ``cuda:0``)."""
    slurm_step = "SLURM_PROCID" in env and "SLURM_STEP_ID" in env
    per_node: list[int] = []
    if slurm_step:
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
        per_node = tasks_per_node(spec)
    node = _int(env, "SLURM_NODEID", default=0) if slurm_step else 0
    if env.get("RANK") and env.get("WORLD_SIZE"):
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK", default=0)
        local_world = _int(
            env, "LOCAL_WORLD_SIZE", default=per_node[node] if node < len(per_node) else world
        )
        node = _int(env, "GROUP_RANK", default=node)
    elif slurm_step:
        rank, local_rank = _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID")
        world = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
        local_world = per_node[node] if node < len(per_node) else world
    else:
        rank, local_rank, world, local_world = 0, 0, 1, 1
    addr = env.get("MASTER_ADDR") or ""
    port = _int(env, "MASTER_PORT", default=0)
    if not addr:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        addr = first_host(nodelist) if slurm_step and nodelist else "127.0.0.1"
    if not port and world > 1:
        job = env.get("SLURM_JOB_ID")
        port = job_port(job) if slurm_step and job else DEFAULT_PORT
    device = f"cuda:{local_rank % gpus}" if gpus else "cpu"
    return RankInfo(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=node,
        master_addr=addr,
        master_port=port,
        device=device,
    )


def init(backend: str | None = None, timeout: float = 600.0) -> RankInfo:
    """Set up ``torch.distributed`` for this process and return its :class:`RankInfo`.

    Selects the CUDA device ``local_rank`` when CUDA is there; ``backend`` defaults to nccl on
    GPUs and gloo on CPU; ``timeout`` (seconds) bounds the rendezvous and each collective.
    Exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT so
    code that reads torchrun's variables agrees. Like torchrun, it caps torch's CPU threads when
    several processes share a node and ``OMP_NUM_THREADS`` is unset: to ``SLURM_CPUS_PER_TASK``,
    else 1. A single process gets an in-memory store (no port). Calling it again once
    initialised returns the info without re-initialising.
    """
    import torch  # the runtime imports torch only when training code asks for it
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    info = rank_info(os.environ, gpus=gpus)
    if dist.is_initialized():
        return info
    if gpus:
        torch.cuda.set_device(info.device)
    if "OMP_NUM_THREADS" not in os.environ and info.local_world_size > 1:
        torch.set_num_threads(_int(os.environ, "SLURM_CPUS_PER_TASK", default=1))
    backend = backend or ("nccl" if gpus else "gloo")
    os.environ.update(
        RANK=str(info.rank),
        WORLD_SIZE=str(info.world_size),
        LOCAL_RANK=str(info.local_rank),
        LOCAL_WORLD_SIZE=str(info.local_world_size),
        MASTER_ADDR=info.master_addr,
        MASTER_PORT=str(info.master_port),
    )
    options: dict = {
        "backend": backend,
        "rank": info.rank,
        "world_size": info.world_size,
        "timeout": timedelta(seconds=timeout),
    }
    if info.world_size == 1:
        options["store"] = dist.HashStore()
    else:
        host = f"[{info.master_addr}]" if ":" in info.master_addr else info.master_addr
        options["init_method"] = f"tcp://{host}:{info.master_port}"
    if gpus and "nccl" in backend:
        options["device_id"] = torch.device(info.device)
    dist.init_process_group(**options)
    return info
