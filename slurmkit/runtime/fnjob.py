"""submitit jobs under slurmkit's requeue contract: ``python -m slurmkit.runtime.fnjob``.

The executors of :func:`slurmkit.executor` run this module in two roles. At import it needs the
standard library and :mod:`slurmkit.core` only; submitit (and cloudpickle, which submitit needs)
loads in the functions that use it.

``run FOLDER``, in each task of the job step (inside the container when there is one): what
submitit's ``process_job`` does (load the pickled call, run it, pickle its result), written with
submitit's public names, with one change: the requeue signal (``$SLURMKIT_REQUEUE_SIGNAL``) and
SIGTERM ask the task to stop. Task 0 checkpoints a ``submitit.helpers.Checkpointable`` (its
``checkpoint()``; the new state replaces the submitted pickle), leaves the marker
``JOBID_requeue`` beside it and exits 75 (REQUEUE_EXIT) where submitit would call
``scontrol requeue``, which images lack. A call that cannot checkpoint exits 128+N at once.
The other tasks carry on, as submitit's own handler lets them, until srun stops them
(``--kill-on-bad-exit``) when task 0 has exited.

``supervise --config JSON -- ARGV...``, in the batch shell on the host (render.supervised
forwards the signals to it and runs ``scontrol requeue`` when it exits 75): JSON is the job
contract (:class:`~slurmkit.core.jobcontract.JobContract`); it runs the step (ARGV:
``srun ...``) as a sweep's trial runs its command, on the attempt supervisor
(:class:`~slurmkit.runtime.attempt.Attempt`: signals, per-cause budgets, earlier attempts
counted in ``JOBID_attempts.json`` beside the pickles). When the job will not run again and a
task left no result, it writes that task's result as an error that says why (cancelled, out of
budget, timed out without a checkpoint, ...), so that ``job.result()`` raises at once, also on
clusters without ``sacct`` for submitit to ask.

Exit codes of ``supervise``: 75 = requeue me; 76 = Slurm requeued the job itself; 143 = a user's
cancel (it stays cancelled); 2 = a damaged ``--config``; otherwise the step's own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from ..core import states
from ..core.contract import ALREADY_REQUEUED, ENV_SIGNAL, REQUEUE_EXIT, requeue_signal
from ..core.fsutil import Damaged, atomic_write_json, read_record
from ..core.jobcontract import JobContract
from ..core.rendezvous import fill, rendezvous
from . import containers, early, releaser, requeue
from .attempt import Attempt, runtime_env

if __name__ == "__main__" and sys.argv[1:2] == ["supervise"]:
    early.hold()  # signals that come while the supervisor starts are kept for its attempt

_TAIL = 64 * 1024  # how much of the step's error log the container check reads
_WAIT_PICKLE = 60  # seconds the step waits for its pickle to appear (as submitit's process_job)


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


# --- in the step: submitit's process_job, stopping the slurmkit way --------------------------


class _Stop:
    """The handler of the requeue signal and SIGTERM in a task of the step."""

    def __init__(self, env: Any, paths: Any, delayed: Any) -> None:
        from submitit.core import logger

        self.env, self.paths, self.delayed = env, paths, delayed
        self.log = logger.get_logger()
        self.stopping = False

    def __call__(self, signum: int, frame: Any = None) -> None:
        name = signal.Signals(signum).name
        if self.env.global_rank != 0:
            self.log.info(f"{name} caught: task 0 checkpoints and stops the job")
            return
        if self.stopping or self.delayed.done():  # the result is being saved: let it be
            self.log.info(f"{name} caught: already stopping or saving the result")
            return
        self.stopping = True
        if _checkpoint_of(self.delayed.function) is not None:
            why = self.checkpoint()
            if not why:
                with open(marker(str(self.paths.folder), self.env.job_id), "w") as fh:
                    fh.write(f"{name}\n")
                self.log.info(f"{name} caught: checkpointed, asking for a requeue")
                sys.exit(REQUEUE_EXIT)
            self.log.warning(f"{name} caught: not checkpointed ({why})")
        else:
            self.log.warning(f"{name} caught: the function cannot checkpoint; stopping")
        sys.exit(128 + signum)

    def checkpoint(self) -> str:
        """Call the function's checkpoint; its call replaces the submitted pickle. Why not,
        when it returned none (else "")."""
        from submitit.core import utils

        self.log.info("Calling checkpoint method.")
        checkpoint = _checkpoint_of(self.delayed.function)
        again = checkpoint(*self.delayed.args, **self.delayed.kwargs)
        if again is None:
            return "checkpoint function returned None"
        with utils.temporary_save_path(self.paths.submitted_pickle) as tmp:
            again.dump(tmp)
        return ""


def _checkpoint_of(function: Any) -> Any:
    """A ``Checkpointable``'s checkpoint method, as submitit looks for it (else None)."""
    found = getattr(function, "__submitit_checkpoint__", None)
    return found if found is not None else getattr(function, "checkpoint", None)


def run(folder: str) -> None:
    """submitit's ``process_job`` (load the pickled call, run it, pickle its result), with the
    stop signals handled by :class:`_Stop` (no ``scontrol`` needed). Written with submitit's
    public names: its own ``process_job`` installs handlers that this would have to replace
    inside submitit."""
    from submitit.core import logger, utils
    from submitit.core.job_environment import JobEnvironment

    os.environ["SUBMITIT_FOLDER"] = folder
    env = JobEnvironment()
    paths, log = env.paths, logger.get_logger()
    log.info(f"Starting with {env}")
    for _ in range(_WAIT_PICKLE):
        if paths.submitted_pickle.exists():
            break
        time.sleep(1)
    else:
        raise RuntimeError(f"no submitted call in {paths.submitted_pickle} after {_WAIT_PICKLE} s")
    try:
        delayed = utils.DelayedSubmission.load(paths.submitted_pickle)
        stop = _Stop(env, paths, delayed)
        signal.signal(signal.SIGCONT, lambda s, f: stop.log.info("SIGCONT caught"))
        for signum in {signal.SIGTERM, getattr(signal, "SIG" + requeue_signal(os.environ))}:
            signal.signal(signum, stop)
        result = delayed.result()
        log.info("Job completed successfully")
        with utils.temporary_save_path(paths.result_pickle) as tmp:
            utils.cloudpickle_dump(("success", result), tmp)
    except Exception:
        with utils.temporary_save_path(paths.result_pickle) as tmp:
            utils.cloudpickle_dump(("error", traceback.format_exc()), tmp)
        log.error("Submitted job triggered an exception")
        raise


# --- on the host: the step, its signals and the requeue decision ------------------------------


class Supervisor(Attempt):
    """One attempt of one submitit job, run from its batch shell: the attempt supervisor
    (:class:`~slurmkit.runtime.attempt.Attempt`) with submitit's files (the attempts beside
    the pickles, an error result for each task that ends without one)."""

    def __init__(self, config: JobContract, argv: Sequence[str]) -> None:
        enabled = config.requeue.enabled and "SLURM_JOB_ID" in os.environ
        super().__init__(config.requeue, enabled)
        self.config = config
        self.argv = list(argv)
        self.job = job_id(os.environ)
        self.folder = folder_of(config.folder, self.job)
        self.tasks = config.tasks
        self.record_path = os.path.join(self.folder, f"{self.job}_attempts.json")
        self.record: dict[str, Any] = {"attempts": []}
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

    def begin(self) -> int | None:
        """Record this attempt; an exit code when the job must not run (again)."""
        os.makedirs(self.folder, exist_ok=True)
        self.load()
        if len(self.missing()) < self.tasks:
            self.say(f"job {self.job} has its result already: not running it again")
            return 0
        spent = self.open(self.record["attempts"])
        if spent is not None:  # the node_failure budget is spent: it does not run again
            self.record.update(state=spent.state, cause=spent.cause, reason=spent.reason)
            self.save()
            self.fail(f"{spent.state}: {spent.reason}")
            return 1
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

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(runtime_env(self.config.env_runtime, self.folder, "0", "0"))
        env.update(rendezvous(env))
        env[ENV_SIGNAL] = self.policy.signal
        return env

    def start(self) -> bool:
        """Start the step; False when a stop signal came first (it does not start)."""
        attempt = self.record["attempts"][-1]
        env = dict(containers.named_env(self.argv, self.environment(), attempt["n"]))
        argv = fill({"step": self.argv}, env)  # this attempt's instance in --container-name
        if containers.adopt(argv, self.record["attempts"], env):
            self.save()
        return self.launch(
            argv, self.say, stdin=subprocess.DEVNULL, env=env, cwd=self.config.workdir or None
        )

    def signalled(self) -> None:
        """A user's cancel: say so in the results before Slurm kills this supervisor."""
        if self.stop_cause is None:
            self.fail("the job was cancelled")

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
        missing = self.missing()
        by_slurm = False
        if len(missing) < self.tasks:  # the function ran to its end (or raised) in a task
            state = states.COMPLETED if code == 0 and not missing else states.FAILED
            outcome = requeue.Outcome(state, code)
            if missing:
                self.fail(f"this task ended without a result (the step exited {code})", missing)
        else:
            asked = os.path.exists(marker(self.folder, self.job)) or code == REQUEUE_EXIT
            step_code = REQUEUE_EXIT if asked else code
            if step_code == 0:
                outcome = requeue.Outcome(
                    states.FAILED, 1, None, "the step exited 0 without a result"
                )
            else:
                tail = self.tail()
                no_start = not self.signals and requeue.container_failed(tail)
                self.attribute(step_code, tail)  # its node's failure: cause `node`
                earlier = self.record["attempts"][:-1]
                outcome, by_slurm = self.outcome(step_code, no_start, earlier)
            if outcome.state != states.REQUEUED:
                self.fail(self._why(outcome, code))
        self.close(attempt, outcome, code)
        self.record.update(state=outcome.state, cause=outcome.cause, reason=outcome.reason)
        self.save()
        if containers.release(attempt, os.environ):
            self.save()
        if outcome.state == states.REQUEUED:
            self.say(f"{outcome.reason}")
            if self.on_slurm and not by_slurm:  # its own requeue: started again in seconds
                stem = os.path.join(self.folder, f"{self.job}_release-{attempt['n']}")
                releaser.submit(f"{stem}.json", f"{stem}.out")
            return ALREADY_REQUEUED if by_slurm else REQUEUE_EXIT
        return outcome.code

    def _why(self, outcome: requeue.Outcome, code: int) -> str:
        if outcome.state == states.CANCELLED:
            return "the job was cancelled"
        reason = outcome.reason or f"the step exited {code}"
        if outcome.cause == "error" and not outcome.reason:
            reason = f"the step exited {code} without a result (see the job's stderr)"
        return f"{outcome.state}: {reason}"


def supervise(config: JobContract, argv: Sequence[str]) -> int:
    sup = Supervisor(config, argv)
    early_exit = sup.begin()
    if early_exit is not None:
        return early_exit
    stop = {signal.SIGTERM, signal.SIGINT, getattr(signal, "SIG" + sup.policy.signal)}
    early.release(sup.terminate, stop)
    try:
        started = sup.start()
    except OSError as exc:
        sup.say(f"cannot start {argv[0]!r}: {exc}")
        return sup.finish(127)
    return sup.finish(sup.wait_step() if started else REQUEUE_EXIT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.runtime.fnjob")
    sub = parser.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("run", help="run the pickled call (a task of the job step)")
    one.add_argument("folder")
    watch = sub.add_parser("supervise", help="run the step, requeue the slurmkit way")
    watch.add_argument("--config", required=True, help="JSON: the job contract (folder, ...)")
    watch.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.cmd == "run":
        run(args.folder)
        return 0
    step = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not step:
        parser.error("supervise: no step to run after --")
    try:
        config = JobContract.from_dict(json.loads(args.config), "--config")
    except ValueError as exc:  # JSONDecodeError and Damaged
        print(f"slurmkit.runtime.fnjob: {exc}", file=sys.stderr)
        return 2
    return supervise(config, step)


if __name__ == "__main__":
    sys.exit(main())
