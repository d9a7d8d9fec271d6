"""Shared fixtures. Cluster fixtures come from slurm_fixtures.py (tests/cluster/ starts Slurm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from slurmkit.core.values import Choice

# pytest-xdist's workers (make unit: -n 2) start with COLUMNS and LINES set (80x24): without
# them, as under plain pytest, the commands the tests run see a pipe and print whole tables.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
sys.path.insert(0, os.path.dirname(__file__))
pytest_plugins = ["slurm_fixtures", "cluster_shards"]

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = ROOT / "tests" / "payloads" / "trial.py"
SLURMKIT = [sys.executable, "-m", "slurmkit.cli"]


def run_cli(
    *args: str, cwd: str | os.PathLike | None = None, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the real ``slurmkit`` command in a subprocess."""
    return subprocess.run(
        [*SLURMKIT, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def first_fast(*values: Any) -> list[Any]:
    """Parameters where only the first runs in `make unit`; the rest are marked slow (make test)."""
    return [values[0], *(pytest.param(v, marks=pytest.mark.slow) for v in values[1:])]


def typed(value: Any) -> Any:
    """Exact structural form: tells 1, 1.0 and True apart and makes nan comparable."""
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, Choice):
        return ("sweep", [typed(v) for v in value.values])
    return (type(value).__name__, value)


def write_spec(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path_factory):
    """Tests never see the developer's ~/.config/slurmkit/config.yaml, nor their poll cache
    (~/.cache/slurmkit); a poll answer is at most 1 s old (10 s by default), so that tests
    that wait for a sweep do not wait for the cache, and submit limits are asked every time."""
    if "SLURMKIT_CONFIG" not in os.environ:
        monkeypatch.setenv("SLURMKIT_CONFIG", os.devnull)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))
    if "SLURMKIT_POLL_INTERVAL" not in os.environ:
        monkeypatch.setenv("SLURMKIT_POLL_INTERVAL", "1")
    if "SLURMKIT_LIMITS_TTL" not in os.environ:  # tests that shim sacctmgr see their own
        monkeypatch.setenv("SLURMKIT_LIMITS_TTL", "0")


@pytest.fixture
def spec_file(tmp_path: Path):
    """``spec_file(body)`` writes a sweep spec into tmp_path and returns its path."""

    def make(body: str, name: str = "spec.yaml") -> Path:
        return write_spec(tmp_path / name, body)

    return make


def assert_shell_ok(text: str) -> None:
    """A rendered script parses (``bash -n``) and passes ``shellcheck`` when it is installed
    (``make lint`` installs it; ``test_render`` fails under ``make test`` without it)."""
    parsed = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert parsed.returncode == 0, parsed.stderr
    if shutil.which("shellcheck") is not None:
        checked = subprocess.run(
            ["shellcheck", "-s", "bash", "-"], input=text, text=True, capture_output=True
        )
        assert checked.returncode == 0, checked.stdout


def wait_sweep(root: str, timeout: float = 240) -> dict:
    """Poll the sweep's status until every trial has finished; its status as a dict."""
    from slurmkit.errors import SchedulerError
    from slurmkit.sweepstate import collect

    end = time.time() + timeout
    counts: dict = {}
    while time.time() < end:
        try:
            current = collect(root)
        except SchedulerError:  # the controller is briefly unreachable: ask again
            time.sleep(1)
            continue
        if current.finished:
            return current.as_dict()
        counts = current.counts
        time.sleep(1)
    raise AssertionError(f"sweep not finished after {timeout} s: {counts}")


def run_spec(
    tmp_path: Path,
    body: str,
    *args: str,
    command: str = "sweep",
    backend: str = "local",
    name: str = "s.yaml",
) -> subprocess.CompletedProcess[str]:
    """``slurmkit COMMAND`` (sweep or submit) of ``body`` written to tmp_path/NAME, on
    ``backend``, under tmp_path/runs, with --json."""
    spec = tmp_path / name
    spec.write_text(body)
    return run_cli(
        command,
        str(spec),
        f"output_root={tmp_path / 'runs'}",
        "--backend",
        backend,
        "--json",
        *args,
        cwd=tmp_path,
    )


def local_sweep(
    tmp_path: Path, body: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict | None]:
    """A sweep of ``body`` on the local backend: the process, and its --json outcome (None
    when it printed none)."""
    import json

    proc = run_spec(tmp_path, body, *args)
    result = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc, result


def slurm_submit(
    tmp_path: Path, body: str, *args: str, command: str = "sweep", expect: int = 0
) -> dict:
    """``body`` submitted to the test cluster; its --json outcome (with ``expect`` != 0: the
    stderr of the refusal, as ``{"stderr": ...}``)."""
    import json

    proc = run_spec(
        tmp_path,
        body,
        *args,
        command=command,
        backend="slurm",
        name="job.yaml" if command == "submit" else "spec.yaml",
    )
    assert proc.returncode == expect, proc.stderr
    return json.loads(proc.stdout) if expect == 0 else {"stderr": proc.stderr}


_COUNTING = """#!/bin/sh
echo "$(basename "$0") $*" >> {log}
exec {real} "$@"
"""


def counted_queries(tmp_path: Path, interval: float) -> tuple[Path, dict[str, str]]:
    """PATH shims that log every squeue and sacct call (one line each) to the returned file,
    and the environment that puts them first, with its own poll cache and ``interval``."""
    log, bin_dir = tmp_path / "calls.log", tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "sacct"):
        real = shutil.which(tool)
        if real:
            (bin_dir / tool).write_text(_COUNTING.format(log=log, real=real))
            (bin_dir / tool).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURMKIT_POLL_INTERVAL": str(interval),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    return log, env


def sbatch_plain(tmp_path: Path, script: Path, name: str, timeout: float = 120) -> tuple[str, Path]:
    """``sbatch`` a standalone script (``sweep --dry-run --plain``) from ``tmp_path``, as a user
    would; its job id and the sweep directory its first task builds (once it exists)."""
    job = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        cwd=tmp_path,
        env={**os.environ, "SLURMKIT_PYTHON": str(ROOT / ".venv" / "bin" / "python")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    root = tmp_path / "runs" / name / f"sbatch-{job}"
    end = time.time() + timeout
    while not (root / "trials.jsonl").exists() and time.time() < end:
        time.sleep(0.5)
    return job, root


def attempts(job: Any, timeout: float = 20) -> dict:
    """An executor job's host-side record of its attempts, once it has recorded the last one's
    end (the result pickle, which makes job.done() true, is written before the step ends)."""
    path = job.paths.folder / f"{job.job_id}_attempts.json"
    deadline = time.monotonic() + timeout
    while True:
        try:
            record = json.loads(path.read_text())
            if record.get("state") != "RUNNING":
                return record
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, f"{path} still says RUNNING after {timeout} s"
        time.sleep(0.2)
