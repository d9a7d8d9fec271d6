"""A trial's progress, as its ranks leave it on the shared filesystem for the hang watchdog.

Trial side (every rank, any node): :func:`heartbeat` (``slurmkit.heartbeat()``, also called by
``report()``) touches ``TRIAL_DIR/progress/RANK`` at most once a second per process: the file's
mtime is the rank's last progress. A committed checkpoint touches ``progress/checkpoint``
(:func:`checkpointed`). :func:`arm` (the first heartbeat, or ``import slurmkit`` in a trial)
registers a stack dump (``faulthandler`` on :func:`dump_signal`, ignored by default: a
process that never registered ignores it too) into ``progress/RANK-PID.stacks``, whose first
line names the process's node: the watchdog's way to read every rank's Python stacks, labelled
by rank, on every node and under any launcher (torchrun's workers too).

Host side: :func:`read` and :func:`dumps` gather it for the supervisor (:mod:`.hang`).

Outside a trial (no ``SLURMKIT_TRIAL_DIR``) it all does nothing. Stdlib only.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO

from ..core.contract import ENV_SIGNAL

DIRNAME = "progress"
CHECKPOINT = "checkpoint"
STACKS = ".stacks"
HEADER = "# slurmkit stacks:"  # the first line of a dump file: node, pid, world size
# The stack dump's signal: ignored by default (harmless where nothing registered it); WINCH
# where the trial's requeue signal is URG (its handler would take URG over).
DUMP_SIGNAL = signal.SIGURG
DUMP_SIGNAL_ELSE = signal.SIGWINCH


def dump_signal(requeue_signal: str | None) -> signal.Signals:
    """The stack dump's signal for a trial whose requeue signal is ``requeue_signal`` (a name
    without SIG, as ``SLURMKIT_REQUEUE_SIGNAL`` has it)."""
    return DUMP_SIGNAL_ELSE if requeue_signal == DUMP_SIGNAL.name[3:] else DUMP_SIGNAL


EVERY = 1.0  # seconds between two touches of one process's rank file

_next = 0.0  # when this process touches its rank file next
_path: str | None = None  # this process's rank file ('': outside a trial)
_stacks: IO[str] | None = None  # kept open: faulthandler writes to its descriptor


def trial_dir() -> str | None:
    """This trial's directory on the shared filesystem (``SLURMKIT_TRIAL_DIR``), or ``None``
    outside a trial."""
    return os.environ.get("SLURMKIT_TRIAL_DIR") or None


def rank(env: Mapping[str, str] = os.environ) -> str:
    """This process's rank: torchrun's ``RANK``, else Slurm's ``SLURM_PROCID``, else 0."""
    return env.get("RANK") or env.get("SLURM_PROCID") or "0"


def arm() -> None:
    """Register this process's stack dump (once): :func:`dump_signal` writes every thread's
    Python stack to ``progress/RANK-PID.stacks``, whose first line names the rank's node, pid and
    world size. Outside a trial, or where the file cannot be made, nothing."""
    global _stacks
    directory = trial_dir()
    if _stacks is not None or directory is None:
        return
    try:
        where = os.path.join(directory, DIRNAME)
        os.makedirs(where, exist_ok=True)
        name = f"{rank()}-{os.getpid()}{STACKS}"  # a process of its own: a spawned one too
        fh = open(os.path.join(where, name), "w", encoding="utf-8")  # noqa: SIM115
    except OSError:
        return
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    world = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or "1"
    fh.write(f"{HEADER} {node} {os.getpid()} {world}\n")
    fh.flush()
    signum = dump_signal(os.environ.get(ENV_SIGNAL))
    faulthandler.register(signum, file=fh, all_threads=True, chain=False)
    _stacks = fh  # kept open: faulthandler writes to its descriptor


def heartbeat() -> None:
    """Progress: this rank is alive and working. Cheap enough for every step (one clock read
    between the touches, which come at most once a second); a no-op outside a trial."""
    global _next, _path
    now = time.time()
    if now < _next:
        return
    _next = now + EVERY
    try:
        if _path is None:
            _path = _start()
        if _path:
            os.utime(_path, (now, now))
    except OSError:  # a full or vanished filesystem must not stop training
        pass


def _start() -> str:
    """This process's rank file, created (with its stack dump armed); '' outside a trial."""
    directory = trial_dir()
    if directory is None:
        return ""
    arm()
    path = os.path.join(directory, DIRNAME, rank())
    with open(path, "a", encoding="utf-8"):
        pass
    return path


def checkpointed() -> None:
    """A checkpoint was committed: progress, and the time of the last checkpoint."""
    heartbeat()
    directory = trial_dir()
    if directory is None:
        return
    path = os.path.join(directory, DIRNAME, CHECKPOINT)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
        now = time.time()
        os.utime(path, (now, now))
    except OSError:
        pass


@dataclass
class Progress:
    """What the ranks left since ``since``: each rank's last progress, and the last
    checkpoint commit."""

    ranks: dict[str, float] = field(default_factory=dict)
    checkpoint: float | None = None

    @property
    def last(self) -> float | None:
        """The trial's last progress: its latest rank's (or checkpoint's)."""
        times = [*self.ranks.values(), *([self.checkpoint] if self.checkpoint else [])]
        return max(times) if times else None


def read(directory: str, since: float) -> Progress:
    """The progress under ``directory`` (a trial's ``progress/``) newer than ``since`` (this
    attempt's start: what earlier attempts left is older)."""
    out = Progress()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return out
    for entry in entries:
        if entry.name != CHECKPOINT and not entry.name.isdigit():
            continue
        try:
            mtime = entry.stat().st_mtime
        except OSError:
            continue
        if mtime < since:
            continue
        if entry.name == CHECKPOINT:
            out.checkpoint = mtime
        else:
            out.ranks[entry.name] = mtime
    return out


@dataclass(frozen=True)
class Dump:
    """One rank's stack dump: where it ran (from its header) and what it wrote."""

    rank: str
    node: str
    pid: int
    world: int
    text: str


def dumps(directory: str, since: float) -> list[Dump]:
    """The stack dumps under ``directory`` armed since ``since``, by rank."""
    out = []
    try:
        entries = [e for e in os.scandir(directory) if e.name.endswith(STACKS)]
    except OSError:
        return []
    for entry in entries:
        try:
            if entry.stat().st_mtime < since:
                continue
            with open(entry.path, encoding="utf-8", errors="replace") as fh:
                head, _, text = fh.read().partition("\n")
            if not head.startswith(HEADER):
                continue
            node, pid, world = head.split()[-3:]
            rank_name = entry.name.partition("-")[0]
            out.append(Dump(rank_name, node, int(pid), int(world), text))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda d: (int(d.rank) if d.rank.isdigit() else -1, d.pid))


def forget(directory: str, before: float) -> None:
    """Remove the stack dump files of processes armed before ``before`` (earlier attempts':
    what a hang of theirs showed is in its hang file)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if entry.name.endswith(STACKS):
                with contextlib.suppress(OSError):
                    if entry.stat().st_mtime < before:
                        os.remove(entry.path)
