"""One attempt of a job under the requeue contract: what the trial runtime
(:class:`~slurmkit.runtime.trial.TrialRun`, a sweep's trial) and the function supervisor
(:class:`~slurmkit.runtime.fnjob.Supervisor`, a job of :func:`slurmkit.executor`) share.

- **The attempt record**: each attempt is ``{n, state: RUNNING, start, host}`` plus Slurm's ids
  (:data:`SLURM_KEYS`) when it starts; at its end ``state``, ``exit_code``, ``end``, ``cause``,
  the stop ``signals`` it got and the ``slurm`` evidence its cause was read from.
- **The node-failure decision**: a last attempt still RUNNING vanished with its node (or job):
  it is a ``node_failure``, and with that budget spent this attempt does not run.
- **Signals**: a stop signal that comes before the step has started ends the attempt unstarted
  (no work to lose); one that comes while it starts is passed on once it has started. Under the
  requeue policy the requeue signal is held until the step catches, ignores or blocks it
  (:func:`handles`): sent before, it would kill a step still starting (importing torch) and
  lose its requeue.
- **The wait loop** runs :attr:`Attempt.checks` every :data:`POLL` s while the step runs under
  the policy or a hang watchdog: Slurm's view is read once a stop signal came, while it is fresh
  (the cause is classified from it), and a held signal is passed on.
- **The hang watchdog** (:mod:`.hang`, where the subclass sets :attr:`Attempt.watchdog`): the
  step's progress stopped: its ranks' stacks go to the hang file, the step is ended, and the
  attempt's cause is ``hang`` (requeued under its budget; FAILED outside the policy). Each
  attempt record gets ``first_progress``, ``last_progress``, ``last_checkpoint`` and ``hang``.
- **The decision**: :func:`~slurmkit.runtime.requeue.classify` and ``decide``, per-cause budgets
  over the earlier attempts; outside the policy an exit is COMPLETED, FAILED or TERMINATED.
  An exit of its own that :meth:`Attempt.attribute` pins on the job's nodes
  (:mod:`~slurmkit.runtime.nodefault`) is cause ``node``; the record keeps ``nodes`` (from
  ``open``), ``blamed`` and ``evidence``.
- **The environment contract**: ``env_runtime`` with its placeholders filled
  (:func:`runtime_env`) and ``SLURMKIT_REQUEUE_SIGNAL``.

Deliberately different between the two (see docs/architecture.md, "The attempt supervisor"):
the trial's step gets a process group of its own outside Slurm (``terminate`` stops its tree),
the function job's step is always signalled as one process (srun passes signals on); the
function job writes a cancelled job's result as soon as Slurm's view says cancel (its caller
waits on that file), the trial records its end when its command exits; the trial reads its
output for a container that did not start only when its spec names a container, the function
job always (its error log is srun's and submitit's, not the user's).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core import placeholders, states
from ..core.contract import REQUEUE_EXIT
from ..core.jobcontract import Policy
from . import hang, nodefault, requeue

# Slurm's ids of the job, kept in each attempt's record.
SLURM_KEYS = {
    "job_id": "SLURM_JOB_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    "restart_count": "SLURM_RESTART_COUNT",
}
# Seconds between the wait loop's checks (under the requeue policy or a hang watchdog).
POLL = 0.2
_MASKS = ("SigBlk:", "SigIgn:", "SigCgt:")


def handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` catches, ignores or blocks ``signum`` (``/proc/PID/status``): it
    would not die of it. Blocked means handled elsewhere: srun waits for its signals in a thread
    (sigwait) with them blocked in its main thread. True where the masks cannot be read: the
    signal is then sent as it comes."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            masks = [int(line.split()[1], 16) for line in fh if line.startswith(_MASKS)]
    except (OSError, ValueError, IndexError):
        return True
    return len(masks) != len(_MASKS) or any(mask >> (signum - 1) & 1 for mask in masks)


def exited(proc: subprocess.Popen[bytes], timeout: float | None) -> int:
    """``proc.wait(timeout)`` (TimeoutExpired likewise), woken by the exit itself where Linux
    gives a pidfd: Popen's own timed wait polls, up to 50 ms late, which a local trial of a
    few milliseconds would feel at every poll of the wait loop."""
    if timeout is None:
        return proc.wait()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux >= 5.3, or Python < 3.9 there
        return proc.wait(timeout=timeout)
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return proc.wait(timeout=0)


def node(env: Mapping[str, str] = os.environ) -> str:
    """The Slurm node this runs on (the host's name outside Slurm)."""
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def runtime_env(
    env_runtime: Mapping[str, str],
    trial_dir: str,
    job_id: str,
    task_id: str,
    env: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The spec's ``env_runtime`` with its placeholders filled: ``{job_id}`` and
    ``{array_task_id}`` (Slurm's in ``env``, else ``job_id``/``task_id``), ``{node}``,
    ``{trial_dir}``."""
    known = {
        "job_id": env.get("SLURM_JOB_ID") or job_id,
        "array_task_id": env.get("SLURM_ARRAY_TASK_ID") or task_id,
        "node": node(env),
        "trial_dir": trial_dir,
    }
    return placeholders.fill(env_runtime, known)


class Attempt:
    """One attempt: its stop signals, its step (``proc``), the wait loop and the decision.

    ``policy``: the job's requeue policy; ``on_slurm``: it applies (a Slurm job with requeue
    enabled). Subclasses say how the step is signalled (:meth:`_send`) and may act once Slurm's
    view is read after a stop signal (:meth:`signalled`).
    """

    def __init__(self, policy: Policy, on_slurm: bool) -> None:
        self.policy = policy
        self.on_slurm = on_slurm
        self.proc: subprocess.Popen[bytes] | None = None
        self.signals: list[str] = []  # the stop signals that came, by name (USR2, TERM)
        self.info: dict[str, str] | None = None  # Slurm's view of the job when a signal came
        self.stop_cause: str | None = None  # what classify() read from it
        self.restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        self._hold = getattr(signal, "SIG" + policy.signal) if on_slurm else None
        self._held = False  # the requeue signal came; the loop sends it once the step handles it
        self._unsent: list[int] = []  # came while the step was being started
        self.nodes = nodefault.job_nodes()  # the job's nodes (SLURM_JOB_NODELIST)
        self.blame: nodefault.Blame | None = None  # set by attribute(): a node's failure
        self.watchdog: hang.Watchdog | None = None  # set by a subclass that has progress
        self.hang_file: str | None = None  # where the watchdog writes the ranks' stacks
        self.step_job: str | None = None  # the Slurm job whose steps are the step's ranks
        self.own_group = False  # the step has a process group of its own
        # run every POLL s while the step runs under the policy or a watchdog
        self.checks: list[Callable[[], None]] = [self._look, self._pass_held, self._watch]

    # --- the attempt record ----------------------------------------------------------------

    def open(self, attempts: list[dict[str, Any]]) -> requeue.Outcome | None:
        """Append this attempt to ``attempts`` as RUNNING. A last attempt still RUNNING vanished
        with its node: it becomes a node failure, and when that budget is spent this attempt
        is not appended: the FAILED outcome is returned instead."""
        if attempts and attempts[-1].get("state") == states.RUNNING:
            attempts[-1].update(state=states.NODE_FAIL, cause="node_failure")
            if len(attempts[-1].get("nodes") or []) == 1:  # vanished with its one node
                attempts[-1].update(blamed=attempts[-1]["nodes"], evidence="vanished with its node")
            if self.on_slurm:
                out = requeue.decide(
                    REQUEUE_EXIT, "node_failure", False, attempts[:-1], self.policy.budgets
                )
                if out.state == states.FAILED:
                    return out
        attempts.append(
            {
                "n": len(attempts) + 1,
                "state": states.RUNNING,
                "start": time.time(),
                "host": socket.gethostname(),
                **{k: os.environ[v] for k, v in SLURM_KEYS.items() if v in os.environ},
                **({"nodes": list(self.nodes)} if self.nodes else {}),
            }
        )
        return None

    def close(self, attempt: dict[str, Any], outcome: requeue.Outcome, code: int) -> None:
        """Record the end of ``attempt``: exit ``code`` and ``outcome``."""
        attempt.update(state=outcome.state, exit_code=code, end=time.time())
        if outcome.cause:
            attempt["cause"] = outcome.cause
        if self.signals:
            attempt["signals"] = list(self.signals)
        if self.info is not None:
            attempt["slurm"] = {k: self.info[k] for k in requeue.EVIDENCE if k in self.info}
        if self.blame is not None:
            attempt.update(blamed=list(self.blame.nodes), evidence=self.blame.evidence)
        if self.watchdog is not None:
            if self.watchdog.declared is None:
                self.watchdog.look()  # the progress made since the last look
            name = os.path.basename(self.hang_file) if self.hang_file else None
            attempt.update(self.watchdog.record(name))

    # --- signals and the step --------------------------------------------------------------

    def terminate(self, signum: int = signal.SIGTERM) -> None:
        """A stop signal: pass it on to the step (safe to call from a signal handler)."""
        name = signal.Signals(signum).name.removeprefix("SIG")
        if name not in self.signals:  # Slurm may signal the step's group directly, too
            self.signals.append(name)
        if signum == self._hold and signum != signal.SIGTERM:
            self._held = True
            return
        if self.proc is None:
            self._unsent.append(signum)
        elif self.proc.poll() is None:
            self._send(signum)

    def _send(self, signum: int) -> None:
        """Signal the step (its main process)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signum)

    def launch(self, argv: Sequence[str], say: Callable[[str], object], **popen: Any) -> bool:
        """Start the step (``subprocess.Popen(argv, **popen)``), unless a stop signal came
        first: then ``say`` why, and False. Signals that come while it starts follow it."""
        if self.signals:  # stopped already: no work to lose, so none to start
            say(f"slurmkit: {', '.join(self.signals)} came before the command started")
            return False
        self._unsent.clear()
        if self.watchdog is not None:  # SIGABRT ends a hung step: no core files of it
            hang.no_cores()
        self.proc = subprocess.Popen(argv, **popen)
        for signum in self._unsent:
            self._send(signum)
        return True

    def wait_step(self) -> int:
        """Wait for the step, running :attr:`checks` every POLL s under the policy or a
        watchdog; its exit code (128+N when it died of signal N)."""
        assert self.proc is not None
        polls = self.on_slurm or self.watchdog is not None
        while True:
            try:
                rc = exited(self.proc, POLL if polls else None)
                break
            except subprocess.TimeoutExpired:
                for check in self.checks:
                    check()
        return 128 - rc if rc < 0 else rc

    def _look(self) -> None:
        """Once a stop signal came: read Slurm's view now, while it is fresh, and its cause."""
        if self.on_slurm and self.signals and self.info is None:
            self.slurm_cause()
            self.signalled()

    def _pass_held(self) -> None:
        """Send the held requeue signal once the step handles it."""
        if self._held and self._hold and self.proc and handles(self.proc.pid, self._hold):
            self._held = False
            self._send(self._hold)

    def _watch(self) -> None:
        """The hang watchdog: once the step's progress stopped, write its ranks' stacks to the
        hang file and end it (the outcome's cause is then ``hang``)."""
        if self.watchdog is None or self.proc is None or not self.watchdog.check():
            return
        proc, group, job, where = self.proc, self.own_group, self.step_job, self.watchdog.dir

        def send(signum: int) -> None:
            hang.signal_step(signum, proc.pid, job, group)

        def armed(signum: int) -> None:  # the processes that dumped, by pid
            hang.signal_armed(signum, found, node(), job, where, dumped=True)

        def kill() -> None:
            hang.signal_step(signal.SIGKILL, proc.pid, None, group)

        dump = hang.progress.dump_signal(self.policy.signal)
        send(dump)
        found = hang.collect(self.watchdog)
        if any(not d.text.strip() for d in found):  # the step's signal did not reach them
            hang.signal_armed(dump, found, node(), job, where)
            found = hang.collect(self.watchdog)
        mark = self.output_mark()
        hang.end(proc, send, armed, kill)
        if self.hang_file:
            with contextlib.suppress(OSError):  # a full disk must not lose the attempt's end
                hang.write(self.hang_file, self.watchdog, found, self.output_since(mark))

    def output_mark(self) -> int:
        """Where the step's output ends now (:meth:`output_since` reads from there)."""
        return 0

    def output_since(self, mark: int) -> str:
        """What the step printed since ``mark`` ('' where the subclass cannot tell)."""
        return ""

    def signalled(self) -> None:
        """Called once Slurm's view has been read after a stop signal (:attr:`stop_cause`)."""

    # --- the decision ------------------------------------------------------------------------

    def _job_info(self) -> dict[str, str]:
        return requeue.job_info(os.environ.get("SLURM_JOB_ID", "0"), node())

    def slurm_cause(self) -> str | None:
        """Why the stop signals came, read from Slurm's view (once; None: a user's cancel)."""
        if self.info is None:
            self.info = self._job_info()
            self.stop_cause = requeue.classify(
                self.signals, self.policy.signal, self.info, self.policy.lead, self.restarts
            )
        return self.stop_cause

    def attribute(self, code: int, output: str) -> nodefault.Blame | None:
        """Whose failure this attempt's exit ``code`` was, from its ``output`` (under the policy,
        for an exit of its own): :attr:`blame` when the evidence points at its nodes."""
        hung = self.watchdog is not None and self.watchdog.declared is not None
        if self.on_slurm and not self.signals and not hung and code not in (0, REQUEUE_EXIT):
            fault = self.policy.node_fault
            self.blame = nodefault.attribute(
                code,
                output,
                self.nodes,
                tasks_per_node=os.environ.get("SLURM_TASKS_PER_NODE", ""),
                patterns=fault.get("patterns", ()),
                exit_codes=fault.get("exit_codes", ()),
            )
        return self.blame

    def outcome(
        self, code: int, no_start: bool, earlier: Sequence[dict[str, Any]]
    ) -> tuple[requeue.Outcome, bool]:
        """The outcome of this attempt, which exited ``code`` (``no_start``: its container did
        not start), given the ``earlier`` attempts; and whether Slurm requeued the job itself
        (the batch shell must not again)."""
        watchdog = self.watchdog
        if watchdog is not None and watchdog.declared is not None:  # it hung: ended by _watch
            if self.on_slurm:
                return requeue.decide(code, "hang", True, earlier, self.policy.budgets), False
            why = f"hung: no progress for {watchdog.timeout or 0:.0f} s"
            return requeue.Outcome(states.FAILED, code, "hang", why), False
        if self.on_slurm:
            # a node's failure (attribute()) is requeued under the `node` budget
            cause = "node" if self.blame else "container" if no_start else None
            by_slurm = False
            if self.signals:
                cause = self.slurm_cause()
                by_slurm = requeue.requeued_by_slurm(self.info or {}, self.restarts)
            signalled = bool(self.signals)
            return requeue.decide(code, cause, signalled, earlier, self.policy.budgets), by_slurm
        if code == 0:
            return requeue.Outcome(states.COMPLETED, 0), False
        if no_start:
            return requeue.decide(code, "container", False, [], {"container": 0}), False
        return requeue.Outcome(states.TERMINATED if self.signals else states.FAILED, code), False
