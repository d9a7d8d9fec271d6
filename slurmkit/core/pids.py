"""Which process a recorded pid was, and whether it still runs (stdlib only: used inside jobs too).

A pid alone names a process only until it is reused. A record holds the host, the host's boot
and the process's start time as well (:func:`identity`), so that a later process with the same
pid is never taken for it.
"""

from __future__ import annotations

import os
from typing import Any


def host() -> str:
    """This host's name (what ``socket.gethostname()`` says, without importing socket)."""
    return os.uname().nodename


def identity(pid: int) -> dict[str, Any]:
    """What tells this process apart from a later one with the same pid: its host, the host's
    boot, and its start time (clock ticks since boot, /proc/PID/stat field 22)."""
    return {"pid": pid, "host": host(), "boot_id": boot_id(), "pid_start": _stat(pid)[1]}


def running(record: dict[str, Any]) -> int | None:
    """The pid of a record's process when that very process still runs here: the same host,
    boot and start time, not a zombie. A record without them (older slurmkit), a pid of 1 or
    less, or a pid reused by another process gives None: never signal those."""
    pid = _pid(record)
    if pid is None or (record.get("host"), record.get("boot_id")) != (host(), boot_id()):
        return None
    state, start = _stat(pid)
    if state in (None, "Z", "X") or start is None or start != record.get("pid_start"):
        return None
    return pid


def gone(record: dict[str, Any]) -> bool:
    """The record's process surely runs no more: it was on this host, and this host has
    rebooted since or runs no such process now. False when that cannot be told (another host,
    or a record without its identity)."""
    if _pid(record) is None or record.get("host") != host():
        return False
    if record.get("boot_id") is None or record.get("pid_start") is None:
        return False
    return running(record) is None


def _pid(record: dict[str, Any]) -> int | None:
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return None
    return pid


def _stat(pid: int) -> tuple[str | None, int | None]:
    """A process's state letter and start time, from /proc/PID/stat; (None, None) if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None, None


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None
