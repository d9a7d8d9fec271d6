"""The hang watchdog: a trial whose progress stopped is found, its stacks written, its attempt
ended (cause ``hang``).

It runs in the supervising runtime (:class:`~slurmkit.runtime.attempt.Attempt`'s wait loop),
never in the trial, and reads what the trial's ranks leave on the shared filesystem
(:mod:`.progress`: ``report()``, ``heartbeat()``, a committed checkpoint).

- **The decision** (:func:`limit`, :func:`hung`; pure): ``requeue.hang_timeout`` seconds without
  progress; by default (None) once the attempt has shown :data:`AUTO_AFTER` progress events, the
  larger of :data:`AUTO_FACTOR` x their median interval and :data:`AUTO_FLOOR`; 0 is off. An
  attempt that never made progress is never hung.
- **The stacks**: every rank armed by :func:`~slurmkit.runtime.progress.arm` dumps its Python
  stacks into its own file when :func:`~slurmkit.runtime.progress.dump_signal` comes
  (``scancel --signal`` reaches every task of a job's steps on every node; a step that is no
  ``srun`` gets it through its process tree; an armed process it did not reach, by its pid:
  :func:`signal_armed`); then ``SIGABRT`` ends the step (the trial runs with
  ``PYTHONFAULTHANDLER=1``: a rank that never armed prints its stacks to the output as it
  aborts), ``SIGKILL`` what is left. ``trials/ID/hang-ATTEMPT.txt`` gets each rank's stacks,
  labelled, and the faulthandler blocks of the output when some rank left none.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import progress

AUTO_AFTER = 5  # progress events an attempt shows before the default timeout applies
AUTO_FACTOR = 10  # the default timeout: this many median intervals ...
AUTO_FLOOR = 300.0  # ... and at least this many seconds
EVERY = 1.0  # seconds between two looks at the progress files
KEEP = 101  # progress events kept for the median
DUMP_WAIT = 3.0  # seconds the ranks get to write their stacks (twice: see Attempt._watch)
STEP_WAIT = 3.0  # seconds the step gets to die of SIGABRT sent to it ...
END_WAIT = 10.0  # ... and then sent to its armed processes, before SIGKILL
FAULT = "Fatal Python error"  # how faulthandler's blocks begin in the output


def limit(setting: float | None, events: Sequence[float]) -> float | None:
    """Seconds without progress that make a hang (None: no hang can be declared yet).

    ``setting``: ``requeue.hang_timeout`` (None: auto, 0: off); ``events``: the attempt's
    progress times, oldest first."""
    if setting is not None:
        return float(setting) if setting > 0 else None
    if len(events) < AUTO_AFTER:
        return None
    gaps = [b - a for a, b in itertools.pairwise(events)]
    return max(AUTO_FACTOR * statistics.median(gaps), AUTO_FLOOR)


def hung(setting: float | None, events: Sequence[float], now: float) -> bool:
    """Whether an attempt with progress ``events`` is hung at ``now`` (never without any)."""
    if not events:
        return False
    seconds = limit(setting, events)
    return seconds is not None and now - events[-1] > seconds


class Watchdog:
    """Watches one attempt's progress (``progress/`` of ``trial_dir``, since ``start``).

    :meth:`check` (every wait-loop poll; it looks at most every :data:`EVERY` s) says when the
    attempt is hung; :meth:`record` gives the attempt record's progress keys."""

    def __init__(self, trial_dir: str, setting: float | None, start: float) -> None:
        self.dir = os.path.join(trial_dir, progress.DIRNAME)
        self.setting = setting
        self.start = start
        self.events: list[float] = []
        self.first: float | None = None
        self.seen = progress.Progress()
        self.declared: float | None = None  # when the hang was declared
        self.timeout: float | None = None
        self.nodes: dict[str, str] = {}  # each rank's node, from its stack dump
        self._next = 0.0
        progress.forget(self.dir, start)

    def look(self) -> None:
        """Read the progress files; a newer last progress is one more event."""
        self.seen = progress.read(self.dir, self.start)
        last = self.seen.last
        if last is not None and (not self.events or last > self.events[-1]):
            self.first = self.first or min([*self.seen.ranks.values(), last])
            self.events = [*self.events[-KEEP + 1 :], last]

    def check(self, now: float | None = None) -> bool:
        """Whether the attempt is hung now (looked at most every EVERY s); once True, the hang
        is declared (:attr:`declared`, :attr:`timeout`)."""
        now = time.time() if now is None else now
        if self.declared is not None or now < self._next:
            return False
        self._next = now + EVERY
        self.look()
        if hung(self.setting, self.events, now):
            self.declared, self.timeout = now, limit(self.setting, self.events)
            return True
        return False

    def record(self, hang_file: str | None = None) -> dict[str, Any]:
        """The attempt record's keys: ``first_progress``, ``last_progress``,
        ``last_checkpoint`` (where seen) and ``hang`` (when declared; ``hang_file`` its file's
        name)."""
        out: dict[str, Any] = {}
        if self.first is not None:
            out["first_progress"] = self.first
        if self.events:
            out["last_progress"] = self.events[-1]
        if self.seen.checkpoint is not None:
            out["last_checkpoint"] = self.seen.checkpoint
        if self.declared is not None:
            out["hang"] = {
                "last_progress": self.events[-1],
                "declared": self.declared,
                "timeout": self.timeout,
                "file": hang_file,
                "ranks": dict(sorted(self.seen.ranks.items(), key=lambda kv: int(kv[0]))),
                **({"nodes": self._per_node()} if self.nodes else {}),
            }
        return out

    def _per_node(self) -> dict[str, float]:
        """Each node's last progress (its ranks' latest): which node stopped first."""
        out: dict[str, float] = {}
        for rank, at in self.seen.ranks.items():
            node = self.nodes.get(rank)
            if node is not None:
                out[node] = max(out.get(node, at), at)
        return dict(sorted(out.items()))


# --- signalling the step and writing the hang file -------------------------------------------


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc``; just ``pid`` where it cannot be
    read)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    parent = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def signal_step(signum: int, pid: int, job_id: str | None, group: bool) -> None:
    """Send ``signum`` to every rank of the step whose main process is ``pid``: through
    ``scancel --signal`` to every task of the job's steps on every node (``job_id``: an srun
    step of a Slurm job; not the batch shell), else to ``pid``'s process group (``group``: it
    has its own) or its process tree."""
    if job_id:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                ["scancel", f"--signal={int(signum)}", job_id],
                capture_output=True,
                timeout=20,
            )
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, signum)
            return
    for each in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signum)


def signal_armed(
    signum: int,
    dumps: Sequence[progress.Dump],
    here: str,
    job_id: str | None,
    where: str,
    dumped: bool = False,
) -> None:
    """Send ``signum`` by pid to the armed processes of ``dumps``: those that wrote no dump yet
    (``dumped``: those that did), on this node (``here``) directly, on other nodes through one
    overlapping ``srun`` step of job ``job_id`` there (:func:`main`, reading the dumps under
    ``where``). These are the ranks the step's signals do not reach: torchrun's workers start
    sessions of their own, and a cluster that tracks a step's processes by process group
    signals only that group."""
    picked = [d for d in dumps if bool(d.text.strip()) == dumped]
    for dump in picked:
        if dump.node == here:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(dump.pid, signum)
    others = sorted({d.node for d in picked if d.node != here})
    if not (others and job_id):
        return
    count = str(len(others))
    step = ["srun", "--overlap", f"--jobid={job_id}", f"--nodelist={','.join(others)}"]
    step += [f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", "--quiet"]
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            [*step, sys.executable, "-m", __name__, str(int(signum)), where, str(int(dumped))],
            capture_output=True,
            timeout=30,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slurmkit.runtime.hang SIGNUM DIR DUMPED``, on one node of the job: send
    SIGNUM to the processes of this node whose dump under DIR is still empty (DUMPED 0) or
    written (1)."""
    signum, where, dumped = (argv if argv is not None else sys.argv[1:])[:3]
    here = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    for dump in progress.dumps(where, 0):
        if dump.node == here and bool(dump.text.strip()) == (dumped == "1"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(dump.pid, int(signum))
    return 0


def collect(watchdog: Watchdog, wait: float = DUMP_WAIT) -> list[progress.Dump]:
    """The ranks' stack dumps, once every armed rank wrote one (or ``wait`` s passed); each
    rank's node noted in ``watchdog.nodes``."""
    end = time.time() + wait
    while True:
        found = progress.dumps(watchdog.dir, watchdog.start)
        if all(d.text.strip() for d in found) or time.time() >= end:
            watchdog.nodes.update({d.rank: d.node for d in found})
            return found
        time.sleep(0.1)


def write(path: str, watchdog: Watchdog, found: Sequence[progress.Dump], output: str = "") -> None:
    """The hang file: why, then each rank's stacks labelled, then the faulthandler blocks of
    ``output`` (what the step printed after the hang) when some rank left no stacks."""
    seen = watchdog.seen
    lines = [
        f"slurmkit: hang declared at {_when(watchdog.declared)}: no progress for "
        f"{watchdog.timeout or 0:.0f} s (last at {_when(watchdog.events[-1])})",
    ]
    for rank, at in sorted(seen.ranks.items(), key=lambda kv: int(kv[0])):
        lines.append(f"  rank {rank}: last progress {_when(at)}")
    if seen.checkpoint is not None:
        lines.append(f"  last checkpoint committed {_when(seen.checkpoint)}")
    dumped = [d for d in found if d.text.strip()]
    for dump in dumped:
        lines += ["", f"=== rank {dump.rank} (node {dump.node}, pid {dump.pid}) ===", dump.text]
    world = max([d.world for d in found] or [0])
    blocks = faults(output)
    if blocks and (not dumped or len(dumped) < world):
        lines += ["", "=== ranks that left no stacks of their own (from the output) ==="]
        lines += blocks
    if not dumped and not blocks:
        lines += ["", "(no rank left Python stacks: none imported slurmkit or armed a dump)"]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines).rstrip("\n") + "\n")


def faults(output: str) -> list[str]:
    """The faulthandler blocks in ``output`` (each from its ``Fatal Python error`` line)."""
    at = output.find(FAULT)
    return [output[at:].rstrip("\n")] if at >= 0 else []


def end(
    proc: subprocess.Popen[bytes],
    send: Callable[[int], None],
    armed: Callable[[int], None],
    kill: Callable[[], None],
) -> None:
    """End a hung step: ``send(SIGABRT)`` to it (stacks to the output, no core); when it has
    not exited within :data:`STEP_WAIT` s, ``armed(SIGABRT)`` to the processes that dumped
    (ranks the step's signal did not reach keep it from ending: its output stays open); then
    ``kill()`` when it has not exited within :data:`END_WAIT` s."""
    send(signal.SIGABRT)
    if _exited(proc, STEP_WAIT):
        return
    armed(signal.SIGABRT)
    if not _exited(proc, END_WAIT):
        kill()


def _exited(proc: subprocess.Popen[bytes], wait: float) -> bool:
    try:
        proc.wait(timeout=wait)
        return True
    except subprocess.TimeoutExpired:
        return False


def no_cores() -> None:
    """No core files from this process's children (the soft limit; srun passes it on to every
    task): a hung step ends with SIGABRT."""
    with contextlib.suppress(ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))


def _when(at: float | None) -> str:
    if at is None:
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 10)}"


if __name__ == "__main__":
    sys.exit(main())
