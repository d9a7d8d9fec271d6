"""submitit jobs under slurmkit's requeue contract: ``python -m slurmkit.runtime.fnjob``.

The executors of :func:`slurmkit.executor` run this module in two roles. At import it needs the
standard library and :mod:`slurmkit.core` only; submitit (and cloudpickle, which submitit needs)
loads in the functions that use it.

``run FOLDER``, in each task of the job step (inside the container when there is one):
submitit's own ``process_job`` (load the pickled call, run it, pickle its result), with one
change: the requeue signal (``$SLURMKIT_REQUEUE_SIGNAL``, USR2 by default) and SIGTERM ask the
task to stop. Task 0 checkpoints a ``submitit.helpers.Checkpointable`` (its ``checkpoint()``;
the new state replaces the submitted pickle), leaves the marker ``JOBID_requeue`` beside it and
exits 75 (REQUEUE_EXIT) where submitit would call ``scontrol requeue``, which images lack. A
call that cannot checkpoint exits 128+N at once. The other tasks carry on, as submitit's own
handler lets them, until srun stops them (``--kill-on-bad-exit``) when task 0 has exited.

``supervise --config JSON -- ARGV...``, in the batch shell on the host (render._supervise
forwards the signals to it and runs ``scontrol requeue`` when it exits 75): runs the step
(ARGV: ``srun ...``), forwards the signals it gets, and decides as a sweep's trial does
(:func:`slurmkit.runtime.requeue.classify` and ``decide``, per-cause budgets, earlier attempts
counted in ``JOBID_attempts.json`` beside the pickles). When the job will not run again and a
task left no result, it writes that task's result as an error that says why (cancelled, out of
budget, timed out without a checkpoint, ...), so that ``job.result()`` raises at once, also on
clusters without ``sacct`` for submitit to ask.

Exit codes of ``supervise``: 75 = requeue me; 76 = Slurm requeued the job itself; 143 = a user's
cancel (it stays cancelled); otherwise the step's own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..core import placeholders, states
from ..core.contract import ALREADY_REQUEUED, ENV_SIGNAL, REQUEUE_EXIT
from ..core.fsutil import Damaged, atomic_write_json, read_record
from ..core.rendezvous import fill, rendezvous
from . import requeue

_SLURM_KEYS = {
    "job_id": "SLURM_JOB_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    "restart_count": "SLURM_RESTART_COUNT",
}
_TAIL = 64 * 1024  # how much of the step's error log the container check reads


def job_id(env: Mapping[str, str]) -> str:
    """submitit's id of this job: ``ARRAYJOBID_TASKID`` for an array task, else the job id."""
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}"
    return env.get("SLURM_JOB_ID", "0")


def folder_of(folder: str, job: str) -> str:
    """The job's folder: submitit's ``%j``, ``%A`` and ``%a`` filled in (as its JobPaths)."""
    array, _, task = job.partition("_")
    return folder.replace("%j", job).replace("%a", task).replace("%A", array)


def marker(folder: str, job: str) -> str:
    """The file task 0 leaves when it has checkpointed and asks for a requeue."""
    return os.path.join(folder, f"{job}_requeue")


def requeue_signal(env: Mapping[str, str]) -> int:
    name = env.get(ENV_SIGNAL) or "USR2"
    return int(getattr(signal, "SIG" + name.upper().removeprefix("SIG"), signal.SIGUSR2))


# --- in the step: submitit's process_job, stopping the slurmkit way --------------------------


class _Stop:
    """The handler of the requeue signal and SIGTERM in a task of the step."""

    def __init__(self, env: Any, paths: Any, delayed: Any) -> None:
        from submitit.core import logger

        self.env, self.paths, self.delayed = env, paths, delayed
        self.log = logger.get_logger()
        self.stopping = False

    def __call__(self, signum: int, frame: Any = None) -> None:
        from submitit.core import job_environment

        name = signal.Signals(signum).name
        if self.env.global_rank != 0:
            self.log.info(f"{name} caught: task 0 checkpoints and stops the job")
            return
        if self.stopping or self.delayed._done:  # the result is being saved: let it be
            self.log.info(f"{name} caught: already stopping or saving the result")
            return
        self.stopping = True
        if hasattr(self.delayed.function, "checkpoint"):
            why = job_environment._checkpoint(
                self.delayed, self.paths.submitted_pickle, self.delayed._timeout_countdown
            )
            if not why:
                with open(marker(str(self.paths.folder), self.env.job_id), "w") as fh:
                    fh.write(f"{name}\n")
                self.log.info(f"{name} caught: checkpointed, asking for a requeue")
                sys.exit(REQUEUE_EXIT)
            self.log.warning(f"{name} caught: not checkpointed ({why})")
        else:
            self.log.warning(f"{name} caught: the function cannot checkpoint; stopping")
        sys.exit(128 + signum)


def _handle_signals(env: Any, paths: Any, delayed: Any) -> None:
    """Replaces submitit's ``JobEnvironment._handle_signals``."""
    stop = _Stop(env, paths, delayed)
    signal.signal(signal.SIGCONT, lambda s, f: stop.log.info("SIGCONT caught"))
    for signum in {signal.SIGTERM, requeue_signal(os.environ)}:
        signal.signal(signum, stop)


def run(folder: str) -> None:
    """submitit's ``process_job`` with :func:`_handle_signals` (no ``scontrol`` needed)."""
    from submitit.core import job_environment, submission

    job_environment.JobEnvironment._handle_signals = _handle_signals  # type: ignore[method-assign,assignment]
    submission.process_job(folder)


# --- on the host: the step, its signals and the requeue decision ------------------------------


class Supervisor:
    """One attempt of one submitit job, run from its batch shell."""

    def __init__(self, config: Mapping[str, Any], argv: Sequence[str]) -> None:
        self.config = config
        self.argv = list(argv)
        self.job = job_id(os.environ)
        self.folder = folder_of(str(config["folder"]), self.job)
        self.tasks = int(config.get("tasks", 1))
        self.policy: dict[str, Any] = dict(config.get("requeue") or {"enabled": False})
        self.signal_name = str(self.policy.get("signal", "USR2"))
        self.record_path = os.path.join(self.folder, f"{self.job}_attempts.json")
        self.signals: list[str] = []
        self.info: dict[str, str] | None = None  # Slurm's view of the job when a signal came
        self.proc: subprocess.Popen[bytes] | None = None
        self.record: dict[str, Any] = {"attempts": []}
        self.cause: str | None = None
        self.log_start = 0
        self.ours: set[int] = set()  # the tasks whose (error) result this supervisor wrote

    # the files of the job (submitit's names)
    def result(self, task: int) -> str:
        return os.path.join(self.folder, f"{self.job}_{task}_result.pkl")

    def stderr(self) -> str:
        """Where srun's and task 0's errors go (the output, with stderr_to_stdout)."""
        err = os.path.join(self.folder, f"{self.job}_0_log.err")
        return err if os.path.exists(err) else err.removesuffix(".err") + ".out"

    def missing(self) -> list[int]:
        """The tasks without a result of their own (one this supervisor wrote is none)."""
        return [
            t for t in range(self.tasks) if t in self.ours or not os.path.exists(self.result(t))
        ]

    def say(self, text: str) -> None:
        print(f"slurmkit.runtime.fnjob: {text}", file=sys.stderr, flush=True)

    def fail(self, text: str, tasks: Sequence[int] | None = None) -> None:
        """Write ``text`` as the error result of each task that has none (submitit's format)."""
        from submitit.core import utils

        for task in self.missing() if tasks is None else tasks:
            if task in self.ours:
                continue
            with utils.temporary_save_path(self.result(task)) as tmp:
                utils.cloudpickle_dump(("error", f"slurmkit: {text}"), tmp)
            self.ours.add(task)

    def save(self) -> None:
        atomic_write_json(self.record_path, self.record)

    def load(self) -> None:
        try:
            record = read_record(self.record_path, default=None)
        except Damaged as exc:
            self.say(f"{exc}: starting a new record")
            record = None
        if isinstance(record, dict) and isinstance(record.get("attempts"), list):
            self.record = record

    @property
    def on_slurm(self) -> bool:
        return bool(self.policy.get("enabled")) and "SLURM_JOB_ID" in os.environ

    def begin(self) -> int | None:
        """Record this attempt; an exit code when the job must not run (again)."""
        os.makedirs(self.folder, exist_ok=True)
        self.load()
        attempts = self.record["attempts"]
        if len(self.missing()) < self.tasks:
            self.say(f"job {self.job} has its result already: not running it again")
            return 0
        if attempts and attempts[-1].get("state") == states.RUNNING:
            # the last attempt vanished without recording its end: its node (or job) died
            attempts[-1].update(state=states.NODE_FAIL, cause="node_failure")
            if self.on_slurm:
                out = requeue.decide(
                    REQUEUE_EXIT, "node_failure", False, attempts[:-1], self.budgets
                )
                if out.state == states.FAILED:
                    self.record.update(state=out.state, cause=out.cause, reason=out.reason)
                    self.save()
                    self.fail(f"{out.state}: {out.reason}")
                    return 1
        attempts.append(
            {
                "n": len(attempts) + 1,
                "state": states.RUNNING,
                "start": time.time(),
                "host": socket.gethostname(),
                **{k: os.environ[v] for k, v in _SLURM_KEYS.items() if v in os.environ},
            }
        )
        self.record.update(state=states.RUNNING)
        self.save()
        try:
            os.unlink(marker(self.folder, self.job))
        except FileNotFoundError:
            pass
        try:
            self.log_start = os.path.getsize(self.stderr())
        except OSError:
            self.log_start = 0
        return None

    @property
    def budgets(self) -> dict[str, int | None]:
        return dict(self.policy.get("budgets") or {})

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        known = {
            "job_id": env.get("SLURM_JOB_ID", "0"),
            "array_task_id": env.get("SLURM_ARRAY_TASK_ID", "0"),
            "node": env.get("SLURMD_NODENAME") or socket.gethostname(),
            "trial_dir": self.folder,
        }
        env.update(placeholders.fill(self.config.get("env_runtime") or {}, known))
        env.update(rendezvous(env))
        env[ENV_SIGNAL] = self.signal_name
        return env

    def forward(self, signum: int, frame: Any = None) -> None:
        """Forward ``signum`` to the step (srun passes it on to the tasks)."""
        name = signal.Signals(signum).name.removeprefix("SIG")
        if name not in self.signals:
            self.signals.append(name)
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def classify(self) -> str | None:
        info = self.info if self.info is not None else self.job_info()
        self.info = info
        return requeue.classify(
            self.signals,
            self.signal_name,
            info,
            int(self.policy.get("lead", 120)),
            int(os.environ.get("SLURM_RESTART_COUNT", "0")),
        )

    def job_info(self) -> dict[str, str]:
        return requeue.job_info(
            os.environ.get("SLURM_JOB_ID", "0"),
            os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        )

    def start(self) -> None:
        env = self.environment()
        argv = fill({"step": self.argv}, env)  # the job id in --container-name
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, env=env, cwd=self.config.get("workdir") or None
        )

    def wait(self) -> int:
        assert self.proc is not None
        while True:
            try:
                rc = self.proc.wait(timeout=0.2 if self.on_slurm else None)
                break
            except subprocess.TimeoutExpired:
                if self.signals and self.info is None:
                    self.cause = self.classify()  # now, while Slurm's view is fresh
                    if self.cause is None:  # a user's cancel: say so before Slurm kills us
                        self.fail("the job was cancelled")
        return 128 - rc if rc < 0 else rc

    def tail(self) -> str:
        try:
            with open(self.stderr(), "rb") as log:
                end = log.seek(0, os.SEEK_END)
                log.seek(max(self.log_start, end - _TAIL))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def finish(self, code: int) -> int:
        """Record the attempt's end; the exit code for the batch shell."""
        attempt = self.record["attempts"][-1]
        attempt.update(exit_code=code, end=time.time())
        if self.signals:
            attempt["signals"] = list(self.signals)
        missing = self.missing()
        asked = os.path.exists(marker(self.folder, self.job)) or code == REQUEUE_EXIT
        by_slurm = False
        if len(missing) < self.tasks:  # the function ran to its end (or raised) in a task
            state = states.COMPLETED if code == 0 and not missing else states.FAILED
            outcome = requeue.Outcome(state, code)
            if missing:
                self.fail(f"this task ended without a result (the step exited {code})", missing)
        else:
            step_code = REQUEUE_EXIT if asked else code
            cause: str | None = None
            if self.on_slurm and self.signals:
                cause = self.cause if self.info is not None else self.classify()
                by_slurm = requeue.requeued_by_slurm(
                    self.info or {}, int(os.environ.get("SLURM_RESTART_COUNT", "0"))
                )
            elif step_code and requeue.container_failed(self.tail()):
                cause = "container"
            if not self.on_slurm:
                outcome = requeue.Outcome(
                    states.TERMINATED if self.signals else states.FAILED, step_code or 1
                )
            elif step_code == 0:
                outcome = requeue.Outcome(
                    states.FAILED, 1, None, "the step exited 0 without a result"
                )
            else:
                outcome = requeue.decide(
                    step_code,
                    cause,
                    bool(self.signals),
                    self.record["attempts"][:-1],
                    self.budgets,
                )
            if outcome.state != states.REQUEUED:
                self.fail(self._why(outcome, code))
        attempt["state"] = outcome.state
        if outcome.cause:
            attempt["cause"] = outcome.cause
        self.record.update(state=outcome.state, cause=outcome.cause, reason=outcome.reason)
        self.save()
        if outcome.state == states.REQUEUED:
            self.say(f"{outcome.reason}")
            return ALREADY_REQUEUED if by_slurm else REQUEUE_EXIT
        return outcome.code

    def _why(self, outcome: requeue.Outcome, code: int) -> str:
        if outcome.state == states.CANCELLED:
            return "the job was cancelled"
        reason = outcome.reason or f"the step exited {code}"
        if outcome.cause == "error" and not outcome.reason:
            reason = f"the step exited {code} without a result (see the job's stderr)"
        return f"{outcome.state}: {reason}"


def supervise(config: Mapping[str, Any], argv: Sequence[str]) -> int:
    sup = Supervisor(config, argv)
    early = sup.begin()
    if early is not None:
        return early
    for signum in {signal.SIGTERM, signal.SIGINT, requeue_signal({ENV_SIGNAL: sup.signal_name})}:
        signal.signal(signum, sup.forward)
    try:
        sup.start()
    except OSError as exc:
        sup.say(f"cannot start {argv[0]!r}: {exc}")
        return sup.finish(127)
    return sup.finish(sup.wait())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.runtime.fnjob")
    sub = parser.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("run", help="run the pickled call (a task of the job step)")
    one.add_argument("folder")
    watch = sub.add_parser("supervise", help="run the step, requeue the slurmkit way")
    watch.add_argument("--config", required=True, help="JSON: folder, tasks, requeue, ...")
    watch.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.cmd == "run":
        run(args.folder)
        return 0
    step = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not step:
        parser.error("supervise: no step to run after --")
    return supervise(json.loads(args.config), step)


if __name__ == "__main__":
    sys.exit(main())
