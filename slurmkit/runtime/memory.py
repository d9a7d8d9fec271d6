"""How much more host memory this process may take: the kernel's MemAvailable, capped by the
memory limits of its cgroups (Slurm's ConstrainRAMSpace, a Kubernetes pod's limit), v2 or v1."""

from __future__ import annotations

import os

_UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a number near 2**63


def available(proc: str = "/proc", cgroups: str = "/sys/fs/cgroup") -> int:
    """Bytes this process may still allocate before the kernel or a cgroup says no (0 when
    nothing could be read: assume no room)."""
    room = [_meminfo(os.path.join(proc, "meminfo"))]
    for directory, limit_file, usage_file in _memory_cgroups(proc, cgroups):
        limit = _number(os.path.join(directory, limit_file))
        usage = _number(os.path.join(directory, usage_file))
        if limit is not None and usage is not None and limit < _UNLIMITED:
            # the usage counts page cache; its inactive part is reclaimed before an OOM kill
            room.append(limit - usage + _inactive_file(os.path.join(directory, "memory.stat")))
    known = [r for r in room if r is not None]
    return max(0, min(known)) if known else 0


def _memory_cgroups(proc: str, cgroups: str) -> list[tuple[str, str, str]]:
    """(directory, limit file, usage file) of this process's memory cgroup and its ancestors."""
    try:
        with open(os.path.join(proc, "self", "cgroup"), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and controllers == "":
            base, files = cgroups, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = (
                os.path.join(cgroups, "memory"),
                ("memory.limit_in_bytes", "memory.usage_in_bytes"),
            )
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            out.append((os.path.join(base, *parts[:depth]), *files))
    return out


def _inactive_file(path: str) -> int:
    """Inactive page cache in a cgroup's memory.stat (v2 ``inactive_file``, v1
    ``total_inactive_file``, which counts its descendants too), 0 when unknown."""
    try:
        with open(path, encoding="ascii") as fh:
            stats = dict(line.split() for line in fh if line.count(" ") == 1)
        return int(stats.get("total_inactive_file", stats.get("inactive_file", 0)))
    except (OSError, ValueError):
        return 0


def _meminfo(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _number(path: str) -> int | None:
    """An integer file of a cgroup; None when missing or "max" (no limit)."""
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None
