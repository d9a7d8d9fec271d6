"""Where a multi-node trial meets: the first node and a port from the job id, and the launch
argv with those values filled in (on the first node, by the runtime; as placeholders in a
rendered script's comments).

``sweep.json`` stores a launch as ``{"step": [...], "launcher": [...]}``: ``step`` is the
``srun`` prefix, ``launcher`` (e.g. ``torchrun``) may hold the tokens ``{master_addr}``,
``{master_port}``, ``{nnodes}`` and ``{job_id}``; an optional ``env`` (the ``sh -c`` that
prepends/appends values, inside the container) goes between them, never filled in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .contract import ENV_CONTAINER

PORT_BASE = 10000  # below it: the ports of well-known services
PORT_FALLBACK_SPAN = 50000  # where the ephemeral range leaves no room (it covers 10000-65535)
EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range


def local_port_range(path: str = EPHEMERAL_FILE) -> tuple[int, int]:
    """This node's ephemeral port range (where the kernel picks outgoing connections' ports);
    Linux's default when it cannot be read."""
    try:
        with open(path, encoding="ascii") as fh:
            lo, hi = (int(x) for x in fh.read().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return (lo, hi) if 0 < lo <= hi <= 65535 else LINUX_EPHEMERAL


def port_span(ephemeral: tuple[int, int]) -> tuple[int, int]:
    """``(first, count)``: the widest run of ports from PORT_BASE up that the ephemeral range
    leaves free (below it, else above it). Under Linux's default: 10000-32767."""
    lo, hi = ephemeral
    below = (PORT_BASE, lo - PORT_BASE)
    above = (max(hi + 1, PORT_BASE), 65536 - max(hi + 1, PORT_BASE))
    first, count = max(below, above, key=lambda span: span[1])
    return (first, count) if count >= 1000 else (PORT_BASE, PORT_FALLBACK_SPAN)


def job_port(job_id: str, ephemeral: tuple[int, int] | None = None) -> int:
    """The rendezvous port of a Slurm job: the same on every node (whose ephemeral ranges
    agree, as on one cluster), different for other jobs, and outside the ephemeral range, so
    that no outgoing connection already holds it."""
    first, count = port_span(ephemeral or local_port_range())
    return first + int(job_id) % count


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list, as ``scontrol show hostnames`` lists it:
    ``gpu-[007-009,012],cpu1`` -> ``gpu-007``."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            end = i
            break
    return re.sub(r"\[([^\],-]+)[^\]]*\]", r"\1", nodelist[:end].strip())


def rendezvous(env: Mapping[str, str]) -> dict[str, str]:
    """MASTER_ADDR (the allocation's first node) and MASTER_PORT (from the job id), unless set."""
    job = env.get("SLURM_JOB_ID", "0")
    return {
        "MASTER_ADDR": env.get("MASTER_ADDR")
        or first_host(env.get("SLURM_JOB_NODELIST", "localhost")),
        "MASTER_PORT": env.get("MASTER_PORT") or str(job_port(job)),
    }


CONTAINER_NAME = "--container-name="  # its value ends with {job_id}: one per attempt (below)


def fill(launch: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The argv prefix with the tokens replaced: in our own launcher part, and in the
    (validated) container name the attempt's instance (``ENV_CONTAINER``, else the job id);
    never in the user's values (paths may hold braces)."""
    values = {
        "{master_addr}": env["MASTER_ADDR"],
        "{master_port}": env["MASTER_PORT"],
        "{nnodes}": env.get("SLURM_NNODES", "1"),
        "{job_id}": env.get("SLURM_JOB_ID", "0"),
    }
    launcher = []
    for arg in launch.get("launcher", []):
        for token, value in values.items():
            arg = arg.replace(token, value)
        launcher.append(arg)
    instance = env.get(ENV_CONTAINER) or values["{job_id}"]
    step = [
        arg.replace("{job_id}", instance) if arg.startswith(CONTAINER_NAME) else arg
        for arg in launch.get("step", [])
    ]
    return [*step, *launch.get("env", []), *launcher]
