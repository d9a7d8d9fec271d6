"""Run one trial: look up its row, run its command with the environment contract, record status.

The environment a trial sees (besides Slurm's own variables):

=====================  ==========================================================
SLURMKIT_SWEEP_DIR     the sweep directory
SLURMKIT_TRIAL_ID      the trial's stable id (a hash of its parameters)
SLURMKIT_TRIAL_INDEX   its index in trials.jsonl
SLURMKIT_TRIAL_DIR     SWEEP_DIR/trials/ID: status.json, metrics.json, output.log
SLURMKIT_PARAMS        the parameters as a JSON object (dotted keys)
SLURMKIT_ATTEMPT       1 on the first run, 2 after one requeue or resume, ...
SLURMKIT_SEARCH        the sweep's ``search`` block as JSON (only when it has one):
                       ``slurmkit.report()`` judges the trial at its rungs (runtime/pruning.py)
=====================  ==========================================================
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from ..core import pids, search, states
from ..core.contract import (
    ALREADY_REQUEUED,
    ENV_SIGNAL,
    REQUEUE_EXIT,
    requeue_mark,
)
from ..core.fsutil import atomic_write_json, read_json
from ..core.jobcontract import JobContract
from ..core.layout import SweepDir
from ..core.lock import HEARTBEAT, STALE_AFTER, Lock, LockBusy
from ..core.rendezvous import fill, rendezvous
from ..core.values import format_value
from . import containers, datacache, hang, nodefault, pruning, releaser, requeue, sweeprelease
from .attempt import Attempt, node, runtime_env

# How long a task waits for the claim of its trial: a holder that died (its node with it) stops
# its heartbeat, and its claim is stale after STALE_AFTER.
CLAIM_WAIT = STALE_AFTER + 2 * HEARTBEAT
PRUNED_WHY = "pruned by the search (see its search.json)"


def param_args(params: dict[str, Any], style: str) -> list[str]:
    """Parameters as command-line arguments: ``key=value`` (Hydra), ``--key value``, or none."""
    if style == "hydra":
        return [f"{k}={format_value(v)}" for k, v in params.items()]
    if style == "argparse":
        out: list[str] = []
        for k, v in params.items():
            out += [f"--{k}", v if isinstance(v, str) else json.dumps(v)]
        return out
    return []


def _path_with_python() -> str:
    """PATH with this interpreter's directory first: ``python`` in a command means this one."""
    here = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    return (
        path if path.split(os.pathsep)[0] == here else os.pathsep.join(filter(None, [here, path]))
    )


def step(
    cfg: JobContract,
    row: Mapping[str, Any],
    base: Mapping[str, str],
    *,
    sweep_root: str,
    trial_dir: str,
    attempt: int,
    signal: str,
) -> tuple[list[str], dict[str, str]]:
    """What the runtime runs for trial ``row``: its argv (the launcher's prefix, srun's with
    the rendezvous filled in, then the command and its parameters) and its environment (``base``,
    the batch shell's, with the spec's ``env``, ``env_runtime`` and the contract's variables)."""
    argv = list(cfg.command) + param_args(dict(row["params"]), cfg.args)
    local = f"local-{os.getpid()}-{row['index']}"
    # a hung rank prints its stacks as the watchdog aborts it (runtime.hang)
    watched = {"PYTHONFAULTHANDLER": "1"} if cfg.requeue.hang_timeout != 0 else {}
    env = {
        **{k: v for k, v in {**watched, **cfg.env_default}.items() if k not in base},  # job's wins
        **base,
        **cfg.env,
        **runtime_env(cfg.env_runtime, trial_dir, local, str(row["index"]), base),
        "PATH": cfg.env.get("PATH") or _path_with_python(),  # the spec's is exact
        "SLURMKIT_SWEEP_DIR": sweep_root,
        "SLURMKIT_TRIAL_ID": row["id"],
        "SLURMKIT_TRIAL_INDEX": str(row["index"]),
        "SLURMKIT_TRIAL_DIR": trial_dir,
        "SLURMKIT_PARAMS": json.dumps(row["params"], ensure_ascii=False),
        "SLURMKIT_ATTEMPT": str(attempt),
        ENV_SIGNAL: signal,
    }
    if cfg.search is not None:
        env[pruning.ENV] = json.dumps(cfg.search.to_dict())
    launch = cfg.launch
    if launch.get("step"):  # srun: several tasks or nodes, a container, a launcher
        env.update(rendezvous(env))
        argv = fill(launch, env) + argv
    elif launch.get("env"):  # env_prepend/env_append on a plain command
        argv = [*launch["env"], *argv]
    return argv, env


def _holder(held: dict[str, Any]) -> str:
    """Who holds a trial's claim, in words: ``job J (pid P on NODE)``."""
    where = f"pid {held.get('pid', '?')} on {held.get('host', '?')}"
    return f"job {held['job_id']} ({where})" if held.get("job_id") else where


def contract(sweep: SweepDir, config: JobContract | Mapping[str, Any] | None) -> JobContract:
    """The job contract of ``sweep``: ``config`` as it is, or read (from ``sweep.json`` when
    None); Damaged (a ValueError naming sweep.json and the key) when it cannot be."""
    if isinstance(config, JobContract):
        return config
    if config is None:
        return JobContract.read(sweep.sweep_json)
    return JobContract.from_dict(config, sweep.sweep_json)


class TrialRun(Attempt):
    """One attempt of one trial. ``start()``, then ``wait()``; ``terminate()`` from elsewhere.

    ``config``: the job contract (:class:`~slurmkit.core.jobcontract.JobContract`, or its
    dict), read from ``sweep.json`` when None. ``under_slurm``: this is an array task; the
    requeue policy applies, and the command stays in the job's process group so that Slurm's
    signals and process tracking reach it. Otherwise (the local backend) it gets a group of its
    own, so that stopping it stops its whole tree.

    Signals, the wait loop and the decision are the attempt supervisor's
    (:class:`~slurmkit.runtime.attempt.Attempt`): the requeue signal reaches the command once
    it handles it, and a stop signal that comes before the command has started ends the
    attempt without starting it.
    """

    def __init__(
        self,
        sweep: SweepDir,
        index: int,
        config: JobContract | Mapping[str, Any] | None = None,
        row: dict[str, Any] | None = None,
        *,
        under_slurm: bool = False,
    ) -> None:
        self.config = contract(sweep, config)
        super().__init__(self.config.requeue, under_slurm and self.config.requeue.enabled)
        self.sweep = sweep
        self.row = row if row is not None else sweep.manifest_row(index)
        self.id: str = self.row["id"]
        self.dir = sweep.trial(self.id)
        self.status_path = sweep.status(self.id)
        self.own_group = not under_slurm
        self.status: dict[str, Any] = {}
        self._claim = Lock(self.dir)
        self.log_start = 0  # where this attempt's output begins in output.log
        self.early_exit: int | None = None  # the exit code when it ended before its command
        sibling = sweeprelease.sibling(sweep.root, self.row["index"], self.on_slurm)
        if sibling is not None:  # it releases the sweep's tasks that Slurm requeued
            self.checks.append(sibling)

    def claim(self, wait: float | None = None) -> str | None:
        """Take the trial's claim: one live run per trial, whatever submitted it twice. None
        when taken; otherwise who holds it, after waiting up to ``wait`` s for it to go stale
        (default: ``SLURMKIT_CLAIM_WAIT`` or CLAIM_WAIT). A claim of this same Slurm job is an
        earlier run of it that died: broken at once."""
        if wait is None:
            wait = float(os.environ.get("SLURMKIT_CLAIM_WAIT") or CLAIM_WAIT)
        job = None if self.own_group else os.environ.get("SLURM_JOB_ID")
        os.makedirs(self.dir, exist_ok=True)
        about = {"job_id": job} if job else None

        def dead(holder: dict[str, Any]) -> bool:
            return bool(job) and holder.get("job_id") == job

        try:
            self._claim.acquire("trial", 0, about=about, dead=dead)
            return None
        except LockBusy as busy:
            if pids.running(busy.holder) is not None:  # it runs here: waiting is no use
                return _holder(busy.holder)
        try:
            self._claim.acquire("trial", wait, about=about, dead=dead)
            return None
        except LockBusy as busy:
            return _holder(busy.holder)

    def release(self) -> None:
        """Let go of the trial's claim (when it was taken)."""
        self._claim.release()

    def already_completed(self) -> bool:
        """Whether the trial has ended as asked (COMPLETED or PRUNED): not to be run again. A
        trial whose search decision says pruned but whose status does not (stopped between the
        two) is recorded PRUNED here."""
        status = self._read_status()
        if status.get("state") in states.SUCCESS:
            self.status = status
            return True
        if self._pruned():
            self.status = status or {"id": self.id, "index": self.row["index"], "attempts": []}
            attempts = self.status.setdefault("attempts", [])
            if attempts and attempts[-1].get("state") == states.RUNNING:
                attempts[-1].update(state=states.PRUNED, exit_code=0, end=time.time())
            self._record(states.PRUNED, 0, reason=PRUNED_WHY)
            return True
        return False

    def _pruned(self) -> bool:
        """The trial's search decisions say it was pruned (and it was not resumed unpruned)."""
        if self.config.search is None:
            return False
        try:
            known = search.decisions(self.dir) or {}
        except ValueError:  # damaged: judged again at its rungs
            return False
        return bool(known.get("pruned")) and not known.get("exempt")

    def _read_status(self) -> dict[str, Any]:
        """status.json, or ``{}`` when there is none. A damaged one (not a record of attempts)
        is kept beside as ``status.json.damaged-TIME`` and the trial starts a new record."""
        try:
            status = read_json(self.status_path, default={})
            attempts = status.get("attempts", []) if isinstance(status, dict) else None
            if isinstance(attempts, list) and all(isinstance(a, dict) for a in attempts):
                return status
        except ValueError:  # Damaged: not JSON
            pass
        aside = f"{self.status_path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            os.replace(self.status_path, aside)
        except OSError:
            return {}
        print(f"slurmkit.runtime: {self.status_path} was damaged: kept as {aside}", file=sys.stderr)
        return {}

    def start(self) -> None:
        """Record the attempt as RUNNING and start the command (no shell): its argv and
        environment, the log's header, the datasets, then the command itself."""
        os.makedirs(self.dir, exist_ok=True)
        self.status = self._read_status() or {
            "id": self.id,
            "index": self.row["index"],
            "attempts": [],
        }
        before = self.status["attempts"][-1] if self.status["attempts"] else None
        spent = self.open(self.status["attempts"])
        if before is not None and before.get("cause") == "node_failure":  # vanished: its node
            nodefault.note(self.sweep.root, self.id, before, self.policy.exclude_after)
        if spent is not None:  # the node_failure budget is spent: it does not run again
            self._record(spent.state, spent.code, cause=spent.cause, reason=spent.reason)
            return
        self._record(states.RUNNING, None)
        argv, env = self._command()
        self._watchdog()
        self._containers(argv)
        with open(self.sweep.output(self.id), "ab") as log, self._stderr() as err:
            out = err or log
            self._header(log, out)
            if self.config.data:
                found = self._stage(env, out)
                if found is None:
                    return
                step = len(self.config.launch.get("step", []))  # the srun prefix of argv
                argv = [*argv[:step], *found, *argv[step:]]
            self._launch(argv, env, log, err)

    def _command(self) -> tuple[list[str], dict[str, str]]:
        """The command's argv (with its launcher prefix) and its environment (the module's
        docstring)."""
        attempt = self.status["attempts"][-1]
        base = containers.named_env(self.config.launch.get("step", []), os.environ, attempt["n"])
        return step(
            self.config,
            self.row,
            base,
            sweep_root=self.sweep.root,
            trial_dir=self.dir,
            attempt=attempt["n"],
            signal=self.policy.signal,
        )

    def _watchdog(self) -> None:
        """Watch this attempt's progress unless ``requeue.hang_timeout`` is 0 (its ranks print
        their stacks when they abort: :func:`step` sets ``PYTHONFAULTHANDLER``)."""
        setting = self.policy.hang_timeout
        if setting == 0:
            return
        attempt = self.status["attempts"][-1]
        self.watchdog = hang.Watchdog(self.dir, setting, attempt["start"])
        self.hang_file = os.path.join(self.dir, f"hang-{attempt['n']}.txt")
        if self.config.launch.get("step") and not self.own_group:
            self.step_job = os.environ.get("SLURM_JOB_ID") or None

    def output_mark(self) -> int:
        try:
            return os.path.getsize(self._output_path())
        except OSError:
            return 0

    def output_since(self, mark: int) -> str:
        return self._output_tail(start=mark)

    def _containers(self, argv: Sequence[str]) -> None:
        """A named container: this attempt's, and what earlier ones left (:mod:`.containers`)."""
        if containers.adopt(argv, self.status["attempts"], os.environ):
            self._record(states.RUNNING, None)

    def _remove_container(self) -> None:
        """Remove this attempt's named container on every node (when it has one)."""
        if containers.release(self.status["attempts"][-1], os.environ):
            atomic_write_json(self.status_path, self.status)

    def _header(self, log: IO[bytes], out: IO[bytes]) -> None:
        """The attempt's first line, in output.log (and the stderr file); where it begins."""
        attempt = self.status["attempts"][-1]
        header = (
            f"=== slurmkit: trial {self.id} (index {self.row['index']}) attempt "
            f"{attempt['n']} on {attempt['host']}"
            + (f" job {attempt['job_id']}" if "job_id" in attempt else "")
            + " ===\n"
        ).encode()
        for fh in {log, out}:
            fh.write(header)
            fh.flush()
        self.log_start = out.tell()

    def _stage(self, env: dict[str, str], out: IO[bytes]) -> list[str] | None:
        """Make the datasets ready (``env`` gets their variables): the wrapper the step needs;
        None when the attempt ended here (:meth:`_data_failed`)."""
        try:
            found, wrap = datacache.prepare(
                self.config.data,
                env,
                node(),
                self.config.launch.get("data") or [],
                lambda: bool(self.signals),
                out,
            )
        except datacache.DataError as exc:
            out.write(f"slurmkit.data: {exc}\n".encode())
            self._data_failed(str(exc))
            return None
        env.update(found)
        return wrap

    def _launch(
        self, argv: list[str], env: dict[str, str], log: IO[bytes], err: IO[bytes] | None
    ) -> None:
        """Start the command; the attempt ends here when it cannot start, or a stop came."""
        out = err or log
        try:
            started = self.launch(
                argv,
                lambda why: out.write(f"{why}\n".encode()),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=err or subprocess.STDOUT,
                cwd=self.config.workdir or self.config.submit_dir or None,
                env=env,
                start_new_session=self.own_group,
            )
        except OSError as exc:
            out.write(f"slurmkit: cannot start {argv[0]!r}: {exc}\n".encode())
            self.proc = None
            self._finish(127)
            return
        if not started:
            self.early_exit = self._finish(REQUEUE_EXIT)

    def _data_failed(self, why: str) -> None:
        """End this attempt before its command: a dataset is missing (FAILED: a rerun would
        find it missing too), or a stop signal came while it was copied (as if the trial had
        checkpointed: the requeue policy decides)."""
        self.proc = None
        if self.signals:
            self.early_exit = self._finish(REQUEUE_EXIT)
            return
        attempt = self.status["attempts"][-1]
        attempt.update(state=states.FAILED, exit_code=1, end=time.time())
        self._record(states.FAILED, 1, reason=f"data: {why}")

    def _send(self, signum: int) -> None:
        """Signal the command: its own process group outside Slurm, else its main process."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            if self.own_group:
                os.killpg(self.proc.pid, signum)
            else:
                os.kill(self.proc.pid, signum)

    def wait(self) -> int:
        """Wait for the command; record the outcome; return the exit code for the batch shell
        (REQUEUE_EXIT asks it to requeue this trial)."""
        if self.proc is None:
            if self.early_exit is not None:
                return self.early_exit
            return int(self.status.get("exit_code") or 1)
        return self._finish(self.wait_step())

    def _finish(self, code: int) -> int:
        attempt = self.status["attempts"][-1]
        mark = requeue_mark(self.dir, attempt["n"])
        if os.path.exists(mark):  # it asked for a requeue: under torchrun, exit 1 may say so
            code = REQUEUE_EXIT if code != 0 else code
            with contextlib.suppress(OSError):
                os.remove(mark)
        tail = self._output_tail()
        no_start = bool(
            code and not self.signals and self.config.container and requeue.container_failed(tail)
        )
        if self.attribute(code, tail):
            self.blame = nodefault.unless_widespread(self.sweep.root, self.blame)
        outcome, by_slurm = self.outcome(code, no_start, self.status["attempts"][:-1])
        if self._pruned():  # report() raised Pruned: the trial ends well, whatever came after
            outcome, by_slurm = requeue.Outcome(states.PRUNED, 0, reason=PRUNED_WHY), False
        self.close(attempt, outcome, code)
        nodefault.note(
            self.sweep.root,
            self.id,
            attempt,
            self.policy.exclude_after,
            self.blame.kind if self.blame else None,
        )
        self._record(outcome.state, code, cause=outcome.cause, reason=outcome.reason)
        self._remove_container()
        if self.on_slurm and outcome.state == states.REQUEUED and not by_slurm:
            n = attempt["n"]  # its own requeue: started again in seconds
            releaser.submit(
                f"{self.dir}/release-{n}.json",
                f"{self.dir}/release-{n}.out",
                sweep=self.sweep.root,
                trial=self.id,
            )
        if by_slurm and outcome.code == REQUEUE_EXIT:
            return ALREADY_REQUEUED
        return outcome.code

    def _separate(self) -> bool:
        return self.config.stderr == "separate"

    def _stderr(self) -> Any:
        """The trial's stderr file (logs.stderr: separate), or a context holding None."""
        if self._separate():
            return open(self.sweep.errors(self.id), "ab")
        return contextlib.nullcontext(None)

    def _output_path(self) -> str:
        """The file of this trial's stderr (output.log, or output.err when kept apart)."""
        return self.sweep.errors(self.id) if self._separate() else self.sweep.output(self.id)

    def _output_tail(self, size: int = 64 * 1024, start: int = 0) -> str:
        """The end of this attempt's stderr (what srun and pyxis printed last), from ``start``
        on where that is later."""
        try:
            with open(self._output_path(), "rb") as log:
                end = log.seek(0, os.SEEK_END)
                log.seek(max(self.log_start, start, end - size))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _record(self, state: str, code: int | None, **extra: Any) -> None:
        self.status.update(state=state, exit_code=code, updated=time.time(), **extra)
        atomic_write_json(self.status_path, self.status)
