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

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from .. import states
from ..fsutil import atomic_write_json, read_json
from ..layout import SweepDir
from ..overrides import format_value

_SLURM_KEYS = {"job_id": "SLURM_JOB_ID", "array_job_id": "SLURM_ARRAY_JOB_ID",
               "array_task_id": "SLURM_ARRAY_TASK_ID", "restart_count": "SLURM_RESTART_COUNT"}


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
    return path if path.split(os.pathsep)[0] == here else os.pathsep.join(filter(None, [here, path]))


class TrialRun:
    """One attempt of one trial. ``start()``, then ``wait()``; ``terminate()`` from elsewhere."""

    def __init__(self, sweep: SweepDir, index: int, config: dict[str, Any] | None = None,
                 row: dict[str, Any] | None = None) -> None:
        self.sweep = sweep
        self.config = config if config is not None else read_json(sweep.sweep_json)
        self.row = row if row is not None else sweep.manifest_row(index)
        self.id: str = self.row["id"]
        self.dir = sweep.trial(self.id)
        self.status_path = sweep.status(self.id)
        self.proc: subprocess.Popen[bytes] | None = None
        self.signal: int | None = None
        self.status: dict[str, Any] = {}

    def already_completed(self) -> bool:
        status = read_json(self.status_path, default={})
        return status.get("state") == states.COMPLETED

    def start(self) -> None:
        """Record the attempt as RUNNING and start the command (no shell)."""
        os.makedirs(self.dir, exist_ok=True)
        self.status = read_json(self.status_path, default=None) or {
            "id": self.id, "index": self.row["index"], "attempts": []}
        attempt = {"n": len(self.status["attempts"]) + 1, "state": states.RUNNING,
                   "start": time.time(), "host": socket.gethostname(),
                   **{k: os.environ[v] for k, v in _SLURM_KEYS.items() if v in os.environ}}
        self.status["attempts"].append(attempt)
        self._record(states.RUNNING, None)
        cfg = self.config
        argv = list(cfg["command"]) + param_args(self.row["params"], cfg.get("args", "hydra"))
        env = {**os.environ, **cfg.get("env", {}), "PATH": _path_with_python(),
               "SLURMKIT_SWEEP_DIR": self.sweep.root, "SLURMKIT_TRIAL_ID": self.id,
               "SLURMKIT_TRIAL_INDEX": str(self.row["index"]), "SLURMKIT_TRIAL_DIR": self.dir,
               "SLURMKIT_PARAMS": json.dumps(self.row["params"], ensure_ascii=False),
               "SLURMKIT_ATTEMPT": str(attempt["n"])}
        cwd = cfg.get("workdir") or cfg.get("submit_dir") or None
        with open(self.sweep.output(self.id), "ab") as log:
            header = (f"=== slurmkit: trial {self.id} (index {self.row['index']}) attempt "
                      f"{attempt['n']} on {attempt['host']}"
                      + (f" job {attempt['job_id']}" if "job_id" in attempt else "") + " ===\n")
            log.write(header.encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                             start_new_session=True)
            except OSError as exc:
                log.write(f"slurmkit: cannot start {argv[0]!r}: {exc}\n".encode())
                self.proc = None
                self._finish(127)

    def terminate(self, signum: int = signal.SIGTERM) -> None:
        """Forward ``signum`` to the command's process group (a flag-only-safe call)."""
        self.signal = signum
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        """Wait for the command; record the outcome; return a shell-style exit code."""
        if self.proc is None:
            return int(self.status.get("exit_code") or 127)
        while True:
            try:
                rc = self.proc.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
        code = 128 - rc if rc < 0 else rc
        self._finish(code)
        return code

    def _finish(self, code: int) -> None:
        if code == 0:
            state = states.COMPLETED
        elif self.signal is not None:
            state = states.TERMINATED
        else:
            state = states.FAILED
        attempt = self.status["attempts"][-1]
        attempt.update(state=state, exit_code=code, end=time.time())
        if self.signal is not None:
            attempt["signal"] = signal.Signals(self.signal).name
        self._record(state, code)

    def _record(self, state: str, code: int | None) -> None:
        self.status.update(state=state, exit_code=code, updated=time.time())
        atomic_write_json(self.status_path, self.status)
