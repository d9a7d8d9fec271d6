"""The local backend end to end through the real CLI: environment contract, status, failures,
resume, results and logs, with no Slurm involved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PAYLOAD, local_sweep, run_cli
from spec_examples import TRICKY


def _sweep(tmp_path: Path, body: str, *args: str):
    return local_sweep(tmp_path, body, *args)


def test_local_sweep_runs_every_trial_with_the_contract(tmp_path):
    proc, result = _sweep(
        tmp_path,
        f"""
command: [python, {PAYLOAD}]
params: {{x: [1, 2, 3], y: [a, b]}}
max_parallel: 3
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert result["backend"] == "local" and result["submitted"] == 6
    root = Path(result["sweep_dir"])
    rows = [json.loads(line) for line in (root / "trials.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(6))
    for row in rows:
        tdir = root / "trials" / row["id"]
        got = json.loads((tdir / "received.json").read_text())
        assert json.loads(got["params_env"]) == row["params"]
        assert got["argv"] == [f"x={row['params']['x']}", f"y={row['params']['y']}"]
        assert got["trial_dir"] == str(tdir) and got["attempt"] == "1"
        assert got["cwd"] == str(tmp_path)
        status = json.loads((tdir / "status.json").read_text())
        assert status["state"] == "COMPLETED" and status["exit_code"] == 0
        assert json.loads((tdir / "metrics.json").read_text())["score"] == row["params"]["x"] * 2
        assert f"hello from trial {row['index']}" in (tdir / "output.log").read_text()
    st = run_cli("status", str(root), "--json")
    assert st.returncode == 0
    assert json.loads(st.stdout)["counts"] == {"COMPLETED": 6}


@pytest.mark.slow
def test_failure_is_recorded_and_resume_reruns_only_failed(tmp_path):
    # the four trials with flaky=true fail on their first attempt (exit 3)
    proc, result = _sweep(
        tmp_path,
        f"""
command: [python, {PAYLOAD}]
params: {{x: [1, 2, 3, 4]}}
""",
        "params.flaky=false,true",
    )
    assert proc.returncode == 1  # some trial failed
    root = result["sweep_dir"]
    st = json.loads(run_cli("status", root, "--json").stdout)
    failed = [t for t in st["trials"] if t["state"] == "FAILED"]
    assert len(failed) == 4 and all(
        t["params"]["flaky"] is True and t["exit_code"] == 3 for t in failed
    )
    assert run_cli("status", root).returncode == 1
    again = run_cli("sweep", "--resume", root, "--backend", "local", "--json")
    assert again.returncode == 0, again.stderr
    assert sorted(json.loads(again.stdout)["indices"]) == sorted(t["index"] for t in failed)
    st = json.loads(run_cli("status", root, "--json").stdout)
    assert st["counts"] == {"COMPLETED": 8}
    attempts = {t["index"]: t["attempts"] for t in st["trials"]}
    assert all(attempts[i] == (2 if st["trials"][i]["params"]["flaky"] else 1) for i in attempts)
    # resuming a finished sweep submits nothing
    third = run_cli("sweep", "--resume", root, "--backend", "local", "--json")
    assert third.returncode == 0 and json.loads(third.stdout)["indices"] == []


@pytest.mark.slow
def test_tricky_values_arrive_byte_exact(tmp_path):
    values = json.dumps(TRICKY)
    for style in ("hydra", "argparse"):
        proc, result = _sweep(
            tmp_path,
            f"""
command: [python, {PAYLOAD}]
args: {style}
params: {{text: {values}}}
""",
        )
        assert proc.returncode == 0, proc.stderr
        root = Path(result["sweep_dir"])
        seen = []
        for row in map(json.loads, (root / "trials.jsonl").read_text().splitlines()):
            got = json.loads((root / "trials" / row["id"] / "received.json").read_text())
            assert json.loads(got["params_env"])["text"] == row["params"]["text"]
            if style == "argparse":
                assert got["argv"] == ["--text", row["params"]["text"]]
            seen.append(row["params"]["text"])
        assert seen == TRICKY
    assert not Path("/tmp/pwned-slurmkit").exists()


@pytest.mark.slow
def test_hydra_style_args_parse_back_with_hydra(tmp_path):
    parser_mod = __import__("pytest").importorskip("hydra.core.override_parser.overrides_parser")
    proc, result = _sweep(
        tmp_path,
        f"""
command: [python, {PAYLOAD}]
params: {{text: {json.dumps(TRICKY)}, n: [1], f: [0.5], b: [true], z: [null]}}
""",
    )
    assert proc.returncode == 0, proc.stderr
    root = Path(result["sweep_dir"])
    parser = parser_mod.OverridesParser.create()
    for row in map(json.loads, (root / "trials.jsonl").read_text().splitlines()):
        got = json.loads((root / "trials" / row["id"] / "received.json").read_text())
        parsed = {o.key_or_group: o.value() for o in parser.parse_overrides(got["argv"])}
        assert parsed == row["params"]


@pytest.mark.slow
def test_results_logs_and_sorting(tmp_path):
    _, result = _sweep(tmp_path, f"command: [python, {PAYLOAD}]\nparams: {{x: [3, 1, 2]}}\n")
    root = result["sweep_dir"]
    rows = json.loads(run_cli("results", root, "--sort", "score", "--json").stdout)
    assert [r["score"] for r in rows] == [2.0, 4.0, 6.0]
    rows = json.loads(run_cli("results", root, "--sort", "score", "--desc", "--json").stdout)
    assert [r["x"] for r in rows] == [3, 2, 1]
    csv = run_cli("results", root, "--csv").stdout.splitlines()
    assert csv[0] == "index,id,state,x,score" and len(csv) == 4
    bad = run_cli("results", root, "--sort", "nope")
    assert bad.returncode == 2 and "known: x, score" in bad.stderr
    log = run_cli("logs", root, "1")
    assert log.returncode == 0 and "hello from trial 1" in log.stdout
    assert "attempt 1" in log.stdout
    assert run_cli("logs", root, "99").returncode == 2


def test_missing_program_fails_cleanly(tmp_path):
    proc, result = _sweep(tmp_path, "command: [/nonexistent/prog]\nparams: {x: [1]}\n")
    assert proc.returncode == 1
    st = json.loads(run_cli("status", result["sweep_dir"], "--json").stdout)
    assert st["trials"][0]["state"] == "FAILED" and st["trials"][0]["exit_code"] == 127


@pytest.mark.slow
def test_stopping_a_local_sweep_loses_nothing(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    spec = tmp_path / "s.yaml"
    # a trial sleeps t seconds, unless FAST is set (the resume below sets it through env)
    code = "import os,sys,time; time.sleep(0 if os.environ.get('FAST') else float(sys.argv[1][2:]))"
    spec.write_text(
        f"command: [python, -c, {json.dumps(code)}]\n"
        f"params: {{t: [30, 31, 0.1, 0.2]}}\nmax_parallel: 2\noutput_root: {tmp_path / 'runs'}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmkit.cli", "sweep", str(spec), "--backend", "local", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    end = time.time() + 30
    while time.time() < end and not list((tmp_path / "runs").glob("*/trials/*/status.json")):
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    root = str(next((tmp_path / "runs").iterdir()))
    st = json.loads(run_cli("status", root, "--json").stdout)
    stopped = [t for t in st["trials"] if t["state"] == "TERMINATED"]
    assert len(stopped) == 2 and {t["params"]["t"] for t in stopped} == {30, 31}
    assert all(t["state"] in ("TERMINATED", "NOT_SUBMITTED", "COMPLETED") for t in st["trials"])
    again = run_cli(
        "sweep", "--resume", root, "--backend", "local", "--json", "env.FAST=1", timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert sorted(json.loads(again.stdout)["indices"]) == sorted(
        t["index"] for t in st["trials"] if t["state"] != "COMPLETED"
    )
    assert json.loads(run_cli("status", root, "--json").stdout)["counts"] == {"COMPLETED": 4}


def _record(root: str, **fields) -> None:
    subs = sorted((Path(root) / "submissions").glob("*.json"))
    number = len(subs)
    (Path(root) / "submissions" / f"{number:04d}.json").write_text(
        json.dumps({"number": number, "backend": "local", "indices": "0", **fields})
    )


@pytest.mark.slow
def test_cancel_never_signals_a_process_that_is_not_ours(tmp_path):
    """A finished local run's pid now belongs to another process: cancel leaves it alone (and
    pid 1, and records without the process's start time); the very process is stopped."""
    import signal
    import subprocess

    from slurmkit.core.pids import identity

    _, result = _sweep(tmp_path, f"command: [python, {PAYLOAD}]\nparams: {{x: [1]}}\n")
    root = result["sweep_dir"]
    other = subprocess.Popen(["sleep", "60"])
    try:
        ours = identity(other.pid)
        _record(root, **{**ours, "pid_start": ours["pid_start"] - 1})  # the pid was reused
        _record(root, **{**ours, "pid": 1, "pid_start": identity(1)["pid_start"]})
        _record(root, pid=other.pid)  # an older record: no start time to check
        _record(root, **{**ours, "boot_id": "another-boot"})
        for args in ([], ["--dry-run"]):
            done = json.loads(run_cli("cancel", root, "--json", *args).stdout)
            assert done["local_pids"] == []
        assert other.poll() is None, "an unrelated process was signalled"
        status = json.loads(run_cli("status", root, "--json").stdout)
        assert status["trials"][0]["state"] == "COMPLETED"
        _record(root, **ours)  # the same process: it is ours
        would = json.loads(run_cli("cancel", root, "--json", "--dry-run").stdout)
        assert would["local_pids"] == [other.pid] and other.poll() is None
        done = json.loads(run_cli("cancel", root, "--json").stdout)
        assert done["local_pids"] == [other.pid]
        assert other.wait(timeout=10) == -signal.SIGTERM
    finally:
        other.kill()
        other.wait()


@pytest.mark.slow
def test_standalone_bootstrap_new_and_old_script_forms(tmp_path):
    """A standalone script's task builds the sweep directory from the spec on first use, then
    runs its trial: `python -m slurmkit.standalone` (rendered now) and the form scripts of older
    slurmkit versions run, `python -m slurmkit.runtime task --spec` (kept working)."""
    import os
    import subprocess
    import sys

    spec = tmp_path / "s.yaml"
    spec.write_text(f"command: [python, {PAYLOAD}]\nparams: {{x: [5, 6]}}\n")
    for n, module in enumerate((["slurmkit.standalone"], ["slurmkit.runtime", "task"])):
        root = tmp_path / f"sweep{n}"
        env = {
            **os.environ,
            "SLURMKIT_SWEEP_DIR": str(root),
            "SLURM_ARRAY_TASK_ID": "1",
            "SLURM_ARRAY_JOB_ID": "77",
        }
        env.pop("SLURM_JOB_ID", None)
        argv = [sys.executable, "-m", *module, "--offset", "0", "--spec", str(spec)]
        proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        rows = [json.loads(line) for line in (root / "trials.jsonl").read_text().splitlines()]
        assert [r["params"]["x"] for r in rows] == [5, 6]
        assert not (root / "trials" / rows[0]["id"]).exists()  # only task 1 ran, its trial
        status = json.loads((root / "trials" / rows[1]["id"] / "status.json").read_text())
        assert status["state"] == "COMPLETED"
        record = json.loads((root / "submissions" / "0000.json").read_text())
        assert record["jobs"][0]["job_id"] == "77"


def test_python_api_names_survive_submodule_imports(tmp_path):
    """`slurmkit.status(dir)` works every time: no submodule shares a name with the API (an
    imported submodule would shadow the lazy name)."""
    import importlib
    import pkgutil

    import slurmkit

    _, result = _sweep(tmp_path, f"command: [python, {PAYLOAD}]\nparams: {{x: [1]}}\n")
    first = slurmkit.status(result["sweep_dir"])
    for mod in pkgutil.iter_modules(slurmkit.__path__):
        if mod.name != "cli":
            importlib.import_module(f"slurmkit.{mod.name}")
    again = slurmkit.status(result["sweep_dir"])
    assert first.counts == again.counts == {"COMPLETED": 1}
    for name in slurmkit.__all__:
        assert not isinstance(getattr(slurmkit, name), type(slurmkit)), name


@pytest.mark.slow
def test_logs_follow_ends_with_the_trial_and_interval_must_be_positive(tmp_path):
    _, result = _sweep(tmp_path, f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2]}}\n")
    root = result["sweep_dir"]
    proc = run_cli("logs", root, "1", "-f", timeout=30)  # the trial has ended: so does -f
    assert proc.returncode == 0 and "hello from trial 1" in proc.stdout
    for bad in ("0", "-1", "nan", "inf"):
        proc = run_cli("status", root, "--watch", "--interval", bad, timeout=30)
        assert proc.returncode == 2 and "--interval" in proc.stderr, (bad, proc.stderr)
