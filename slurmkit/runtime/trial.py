"""Run one trial: look up its row, run its command with the environment contract, record status.

The environment a trial sees (besides Slurm's own variables):

=====================  ==========================================================
SLURMKIT_SWEEP_DIR     the sweep directory
SLURMKIT_TRIAL_ID      the trial's stable id (a hash of its parameters)
SLURMKIT_TRIAL_INDEX   its index in trials.jsonl
SLURMKIT_TRIAL_DIR     SWEEP_DIR/trials/ID: status.json, metrics.json, output.log
SLURMKIT_PARAMS        the parameters as a JSON object (dotted keys)
SLURMKIT_ATTEMPT       1 on the first run, 2 after one requeue or resume, ...
=====================  ==========================================================
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from ..core import pids, placeholders, states
from ..core.contract import ALREADY_REQUEUED, ENV_SIGNAL, REQUEUE_EXIT, requeue_mark
from ..core.fsutil import atomic_write_json, read_json
from ..core.layout import SweepDir
from ..core.lock import HEARTBEAT, STALE_AFTER, Lock, LockBusy
from ..core.rendezvous import fill, rendezvous
from ..core.values import format_value
from . import datacache, requeue

_SLURM_KEYS = {
    "job_id": "SLURM_JOB_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    "restart_count": "SLURM_RESTART_COUNT",
}
# How long a task waits for the claim of its trial: a holder that died (its node with it) stops
# its heartbeat, and its claim is stale after STALE_AFTER.
CLAIM_WAIT = STALE_AFTER + 2 * HEARTBEAT


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


def _holder(held: dict[str, Any]) -> str:
    """Who holds a trial's claim, in words: ``job J (pid P on NODE)``."""
    where = f"pid {held.get('pid', '?')} on {held.get('host', '?')}"
    return f"job {held['job_id']} ({where})" if held.get("job_id") else where


class TrialRun:
    """One attempt of one trial. ``start()``, then ``wait()``; ``terminate()`` from elsewhere.

    ``under_slurm``: this is an array task; the requeue policy applies, and the command stays in
    the job's process group so that Slurm's signals and process tracking reach it. Otherwise
    (the local backend) it gets a group of its own, so that stopping it stops its whole tree.

    Under the requeue policy, the requeue signal reaches the command once it catches, ignores or
    blocks it (:func:`handles`): sent before, it would kill a command that is still starting
    (importing torch, say) and lose its requeue. A command that never catches it runs on to the
    time limit. A stop signal that comes before the command has started ends the attempt
    without starting it.
    """

    def __init__(
        self,
        sweep: SweepDir,
        index: int,
        config: dict[str, Any] | None = None,
        row: dict[str, Any] | None = None,
        *,
        under_slurm: bool = False,
    ) -> None:
        self.sweep = sweep
        self.config = config if config is not None else read_json(sweep.sweep_json)
        self.row = row if row is not None else sweep.manifest_row(index)
        self.id: str = self.row["id"]
        self.dir = sweep.trial(self.id)
        self.status_path = sweep.status(self.id)
        self.own_group = not under_slurm
        self.proc: subprocess.Popen[bytes] | None = None
        self.signals: list[str] = []
        self.job: dict[str, str] | None = None  # Slurm's view of the job when a signal came
        self.status: dict[str, Any] = {}
        self.policy: dict[str, Any] = self.config.get("requeue") or {"enabled": False}
        self.on_slurm = under_slurm and bool(self.policy.get("enabled"))
        self.requeue_signal: str = self.policy.get("signal", "USR2")
        self._hold = getattr(signal, "SIG" + self.requeue_signal) if self.on_slurm else None
        self._held = False  # the requeue signal came; wait() sends it once the command catches it
        self._claim = Lock(self.dir)
        self.log_start = 0  # where this attempt's output begins in output.log
        self.early_exit: int | None = None  # the exit code when it ended before its command

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
        return self._read_status().get("state") == states.COMPLETED

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
        """Record the attempt as RUNNING and start the command (no shell)."""
        os.makedirs(self.dir, exist_ok=True)
        self.status = self._read_status() or {
            "id": self.id,
            "index": self.row["index"],
            "attempts": [],
        }
        earlier = self.status["attempts"]
        if earlier and earlier[-1].get("state") == states.RUNNING:
            # the last attempt vanished without recording an end: its node (or job) died
            earlier[-1].update(state=states.NODE_FAIL, cause="node_failure")
            if self.on_slurm:
                out = requeue.decide(
                    REQUEUE_EXIT,
                    "node_failure",
                    False,
                    earlier[:-1],
                    self.policy.get("budgets", {}),
                )
                if out.state == states.FAILED:
                    self._record(out.state, out.code, cause=out.cause, reason=out.reason)
                    return
        attempt = {
            "n": len(earlier) + 1,
            "state": states.RUNNING,
            "start": time.time(),
            "host": socket.gethostname(),
            **{k: os.environ[v] for k, v in _SLURM_KEYS.items() if v in os.environ},
        }
        earlier.append(attempt)
        self._record(states.RUNNING, None)
        cfg = self.config
        argv = list(cfg["command"]) + param_args(self.row["params"], cfg.get("args", "hydra"))
        known = {
            "job_id": os.environ.get("SLURM_JOB_ID") or f"local-{os.getpid()}-{self.row['index']}",
            "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID") or str(self.row["index"]),
            "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "trial_dir": self.dir,
        }
        env = {
            **os.environ,
            **cfg.get("env", {}),
            **placeholders.fill(cfg.get("env_runtime", {}), known),
            "PATH": _path_with_python(),
            "SLURMKIT_SWEEP_DIR": self.sweep.root,
            "SLURMKIT_TRIAL_ID": self.id,
            "SLURMKIT_TRIAL_INDEX": str(self.row["index"]),
            "SLURMKIT_TRIAL_DIR": self.dir,
            "SLURMKIT_PARAMS": json.dumps(self.row["params"], ensure_ascii=False),
            "SLURMKIT_ATTEMPT": str(attempt["n"]),
            ENV_SIGNAL: self.requeue_signal,
        }
        launch = cfg.get("launch") or {}
        step = len(launch.get("step", []))  # the srun prefix of argv, filled in below
        if launch.get("step"):  # srun: several tasks or nodes, a container, a launcher
            env.update(rendezvous(env))
            argv = fill(launch, env) + argv
        elif launch.get("env"):  # env_prepend/env_append on a plain command
            argv = [*launch["env"], *argv]
        cwd = cfg.get("workdir") or cfg.get("submit_dir") or None
        header = (
            f"=== slurmkit: trial {self.id} (index {self.row['index']}) attempt "
            f"{attempt['n']} on {attempt['host']}"
            + (f" job {attempt['job_id']}" if "job_id" in attempt else "")
            + " ===\n"
        ).encode()
        with open(self.sweep.output(self.id), "ab") as log, self._stderr() as err:
            for fh in {log, err or log}:
                fh.write(header)
                fh.flush()
            self.log_start = (err or log).tell()
            if cfg.get("data"):
                try:
                    found, wrap = datacache.prepare(
                        cfg["data"],
                        env,
                        known["node"],
                        launch.get("data") or [],
                        lambda: bool(self.signals),
                        err or log,
                    )
                except datacache.DataError as exc:
                    (err or log).write(f"slurmkit.data: {exc}\n".encode())
                    self._data_failed(str(exc))
                    return
                env.update(found)
                argv = [*argv[:step], *wrap, *argv[step:]]
            if self.signals:  # stopped already: no work to lose, so none to start
                why = f"slurmkit: {', '.join(self.signals)} came before the command started\n"
                (err or log).write(why.encode())
                self.early_exit = self._finish(REQUEUE_EXIT)
                return
            try:
                self.proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=err or subprocess.STDOUT,
                    cwd=cwd,
                    env=env,
                    start_new_session=self.own_group,
                )
            except OSError as exc:
                (err or log).write(f"slurmkit: cannot start {argv[0]!r}: {exc}\n".encode())
                self.proc = None
                self._finish(127)

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

    def terminate(self, signum: int = signal.SIGTERM) -> None:
        """Forward ``signum`` to the command (safe to call from a signal handler)."""
        name = signal.Signals(signum).name.removeprefix("SIG")
        if name not in self.signals:  # Slurm may signal the command's group directly, too
            self.signals.append(name)
        if signum == self._hold and signum != signal.SIGTERM:
            self._held = True
            return
        if self.proc is not None and self.proc.poll() is None:
            try:
                if self.own_group:
                    os.killpg(self.proc.pid, signum)
                else:
                    os.kill(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        """Wait for the command; record the outcome; return the exit code for the batch shell
        (REQUEUE_EXIT asks it to requeue this trial)."""
        if self.proc is None:
            if self.early_exit is not None:
                return self.early_exit
            return int(self.status.get("exit_code") or 1)
        while True:
            try:
                rc = self.proc.wait(timeout=0.2 if self.on_slurm else None)
                break
            except subprocess.TimeoutExpired:
                if self.signals and self.job is None and self.on_slurm:
                    self.job = self._job_info()  # now, while Slurm's view is fresh
                if self._held and self._hold and handles(self.proc.pid, self._hold):
                    self._held = False
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.proc.pid, self._hold)
        return self._finish(128 - rc if rc < 0 else rc)

    def _job_info(self) -> dict[str, str]:
        return requeue.job_info(
            os.environ["SLURM_JOB_ID"], os.environ.get("SLURMD_NODENAME", socket.gethostname())
        )

    def _finish(self, code: int) -> int:
        attempt = self.status["attempts"][-1]
        mark = requeue_mark(self.dir, attempt["n"])
        if os.path.exists(mark):  # it asked for a requeue: under torchrun, exit 1 may say so
            code = REQUEUE_EXIT if code != 0 else code
            with contextlib.suppress(OSError):
                os.remove(mark)
        by_slurm = False  # Slurm requeued the job itself: the batch shell must not again
        no_start = bool(
            code
            and not self.signals
            and self.config.get("container")
            and requeue.container_failed(self._output_tail())
        )
        if self.on_slurm:
            cause = "container" if no_start else None
            if self.signals:
                info = self.job if self.job is not None else self._job_info()
                attempt["slurm"] = {k: info[k] for k in requeue.EVIDENCE if k in info}
                restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
                cause = requeue.classify(
                    self.signals,
                    self.requeue_signal,
                    info,
                    int(self.policy.get("lead", 120)),
                    restarts,
                )
                by_slurm = requeue.requeued_by_slurm(info, restarts)
            outcome = requeue.decide(
                code,
                cause,
                bool(self.signals),
                self.status["attempts"][:-1],
                self.policy.get("budgets", {}),
            )
        elif code == 0:
            outcome = requeue.Outcome(states.COMPLETED, 0)
        elif no_start:
            outcome = requeue.decide(code, "container", False, [], {"container": 0})
        else:
            outcome = requeue.Outcome(states.TERMINATED if self.signals else states.FAILED, code)
        attempt.update(state=outcome.state, exit_code=code, end=time.time())
        if outcome.cause:
            attempt["cause"] = outcome.cause
        if self.signals:
            attempt["signals"] = list(self.signals)
        self._record(outcome.state, code, cause=outcome.cause, reason=outcome.reason)
        if by_slurm and outcome.code == REQUEUE_EXIT:
            return ALREADY_REQUEUED
        return outcome.code

    def _separate(self) -> bool:
        return (self.config.get("logs") or {}).get("stderr") == "separate"

    def _stderr(self) -> Any:
        """The trial's stderr file (logs.stderr: separate), or a context holding None."""
        if self._separate():
            return open(self.sweep.errors(self.id), "ab")
        return contextlib.nullcontext(None)

    def _output_tail(self, size: int = 64 * 1024) -> str:
        """The end of this attempt's stderr (what srun and pyxis printed last)."""
        path = self.sweep.errors(self.id) if self._separate() else self.sweep.output(self.id)
        try:
            with open(path, "rb") as log:
                end = log.seek(0, os.SEEK_END)
                log.seek(max(self.log_start, end - size))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _record(self, state: str, code: int | None, **extra: Any) -> None:
        self.status.update(state=state, exit_code=code, updated=time.time(), **extra)
        atomic_write_json(self.status_path, self.status)
