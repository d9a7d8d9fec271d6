"""Sweeps on the real 4-node Slurm test cluster (tests/cluster/up.sh), through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PAYLOAD, SLURMKIT, run_cli, sbatch_plain, slurm_submit, wait_sweep
from spec_examples import TRICKY

from slurmkit.sweepstate import collect

pytestmark = pytest.mark.cluster


def submit(tmp_path: Path, body: str, *overrides: str, expect: int = 0) -> dict:
    return slurm_submit(tmp_path, body, *overrides, expect=expect)


def received(root: str, trial: dict) -> dict:
    return json.loads((Path(root) / "trials" / trial["id"] / "received.json").read_text())


def wait_running(root: str, n: int, timeout: float = 60) -> None:
    """Until ``n`` trials of the sweep are RUNNING (or ``timeout`` s pass: the test's asserts
    then say what is wrong)."""
    end = time.time() + timeout
    while collect(root).counts.get("RUNNING", 0) < n and time.time() < end:
        time.sleep(0.3)


def test_sweep_of_20_completes_with_metrics(slurm_cluster, tmp_path):
    result = submit(
        tmp_path,
        f"""
name: twenty
command: [python, {PAYLOAD}]
params: {{x: 'range(0,20)'}}
resources: {{time: "0:05:00", mem: 100M}}
""",
    )
    assert result["backend"] == "slurm" and len(result["jobs"]) == 1
    assert result["jobs"][0]["array"] == "0-19"
    final = wait_sweep(result["sweep_dir"])
    assert final["counts"] == {"COMPLETED": 20}
    hosts = set()
    for t in final["trials"]:
        metrics = json.loads(
            (Path(result["sweep_dir"]) / "trials" / t["id"] / "metrics.json").read_text()
        )
        assert metrics["score"] == t["params"]["x"] * 2
        assert t["job"] == f"{result['jobs'][0]['job_id']}_{t['index']}"
        hosts.add(received(result["sweep_dir"], t)["host"])
    assert hosts <= {"n1", "n2", "n3", "n4"} and len(hosts) >= 2
    rows = json.loads(
        run_cli("results", result["sweep_dir"], "--sort", "score", "--desc", "--json").stdout
    )
    assert rows[0]["x"] == 19 and len(rows) == 20


def test_failed_trials_keep_exit_code_and_resume_reruns_only_them(slurm_cluster, tmp_path):
    result = submit(
        tmp_path,
        f"""
name: flaky
command: [python, {PAYLOAD}]
params: {{x: 'range(0,10)', flaky: [false, true]}}
max_parallel: 8
""",
    )
    root = result["sweep_dir"]
    final = wait_sweep(root)
    assert final["counts"] == {"COMPLETED": 10, "FAILED": 10}
    failed = {t["index"] for t in final["trials"] if t["state"] == "FAILED"}
    assert all(
        t["exit_code"] == 3 and t["params"]["flaky"]
        for t in final["trials"]
        if t["index"] in failed
    )
    status = run_cli("status", root)
    assert status.returncode == 1 and "FAILED" in status.stdout
    again = run_cli("sweep", "--resume", root, "--json")
    assert again.returncode == 0, again.stderr
    resumed = json.loads(again.stdout)
    assert set(resumed["indices"]) == failed and resumed["backend"] == "slurm"
    # a second resume right away submits nothing: the failed trials are queued or running
    twice = json.loads(run_cli("sweep", "--resume", root, "--json").stdout)
    assert twice["indices"] == []
    final = wait_sweep(root)
    assert final["counts"] == {"COMPLETED": 20}
    for t in final["trials"]:
        assert t["attempts"] == (2 if t["index"] in failed else 1), t
    assert json.loads(run_cli("sweep", "--resume", root, "--json").stdout)["indices"] == []


def test_split_under_small_max_array_size(slurm_cluster, tmp_path):
    with slurm_cluster.max_array_size(5):
        result = submit(
            tmp_path,
            f"""
name: split
command: [python, {PAYLOAD}]
params: {{x: 'range(0,12)'}}
max_parallel: 3
""",
        )
        final = wait_sweep(result["sweep_dir"])
    assert [(j["offset"], j["array"]) for j in result["jobs"]] == [
        (0, "0-4"),
        (5, "0-4"),
        (10, "0-1"),
    ]
    assert final["counts"] == {"COMPLETED": 12}
    for t in final["trials"]:
        job, task = t["job"].split("_")
        chunk = next(j for j in result["jobs"] if j["job_id"] == job)
        assert chunk["offset"] + int(task) == t["index"] and int(task) < 5
    scripts = sorted((Path(result["sweep_dir"]) / "scripts").glob("*.sbatch"))
    assert len(scripts) == 3 and "--array=0-1%3" in scripts[2].read_text()


def test_tricky_values_arrive_byte_exact_on_slurm(slurm_cluster, tmp_path):
    result = submit(
        tmp_path,
        f"""
name: tricky
command: [python, {PAYLOAD}]
args: argparse
params: {{text: {json.dumps(TRICKY)}}}
""",
    )
    final = wait_sweep(result["sweep_dir"])
    assert final["counts"] == {"COMPLETED": len(TRICKY)}
    for t in final["trials"]:
        got = received(result["sweep_dir"], t)
        assert json.loads(got["params_env"])["text"] == TRICKY[t["index"]]
        assert got["argv"] == ["--text", TRICKY[t["index"]]]
    assert not Path("/tmp/pwned-slurmkit").exists()


def test_unknown_partition_is_a_clear_usage_error(slurm_cluster, tmp_path):
    out = submit(
        tmp_path,
        f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2]}}\n",
        "resources.partition=nosuch",
        expect=2,
    )
    assert "Slurm refused the job" in out["stderr"] and "invalid partition" in out["stderr"].lower()
    assert "partitions on this cluster: high, low" in out["stderr"]
    assert "Traceback" not in out["stderr"]
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_cancel_stops_running_and_pending_trials(slurm_cluster, tmp_path):
    result = submit(
        tmp_path,
        "command: [sleep, '300']\nargs: none\nparams: {i: 'range(0,6)'}\nmax_parallel: 2\n",
    )
    root = result["sweep_dir"]
    wait_running(root, 2)
    would = json.loads(run_cli("cancel", root, "--dry-run", "--json").stdout)
    assert would["jobs"] == [result["jobs"][0]["job_id"]] and would["dry_run"]
    assert collect(root).counts.get("RUNNING", 0) == 2  # nothing was cancelled
    done = json.loads(run_cli("cancel", root, "--json").stdout)
    assert done["jobs"] == [result["jobs"][0]["job_id"]]
    final = wait_sweep(root, timeout=60)
    assert set(final["counts"]) == {"CANCELLED"}, final["counts"]


def test_plain_sbatch_script_runs_as_rendered(slurm_cluster, tmp_path):
    spec = tmp_path / "plain.yaml"
    spec.write_text(
        f"name: plain\ncommand: [python, {PAYLOAD}]\nparams: {{x: [1, 2, 3]}}\noutput_root: runs\n"
    )
    script = tmp_path / "plain.sbatch"
    proc = run_cli("sweep", "plain.yaml", "--dry-run", "--plain", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    script.write_text(proc.stdout)
    job, root = sbatch_plain(tmp_path, script, "plain")
    end = time.time() + 120
    # no submission records: completion comes from the status files alone
    while time.time() < end and collect(str(root)).counts != {"COMPLETED": 3}:
        time.sleep(1)
    assert collect(str(root)).counts == {"COMPLETED": 3}
    # Slurm's own log of a standalone script's task is where that script put it
    log = run_cli("logs", str(root), "1", "--slurm", cwd=tmp_path)
    assert log.returncode == 0, log.stderr
    assert log.stdout == (tmp_path / f"plain-{job}_1.out").read_text()


def test_status_makes_one_scheduler_query(slurm_cluster, tmp_path):
    result = submit(
        tmp_path,
        "command: [sleep, '30']\nargs: none\nparams: {i: 'range(0,40)'}\nmax_parallel: 4\n",
    )
    # count calls with shims that log, then run the real tools
    shims = tmp_path / "shims"
    shims.mkdir()
    calls = tmp_path / "calls.log"
    for tool in ("squeue", "sacct", "scontrol", "sinfo"):
        real = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if real:
            (shims / tool).write_text(f'#!/bin/sh\necho {tool} "$@" >> {calls}\nexec {real} "$@"\n')
            (shims / tool).chmod(0o755)
    env = {"PATH": f"{shims}:{os.environ['PATH']}"}
    proc = run_cli("status", result["sweep_dir"], "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)["counts"]
    assert sum(counts.values()) == 40 and set(counts) <= {"PENDING", "RUNNING"}
    assert len(calls.read_text().splitlines()) == 1, calls.read_text()
    run_cli("cancel", result["sweep_dir"])


def test_wait_follows_the_sweep_to_its_end(slurm_cluster, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"command: [python, {PAYLOAD}]\nparams: {{exit: [0, 5], x: [1, 2]}}\n")
    proc = run_cli(
        "sweep",
        str(spec),
        f"output_root={tmp_path / 'runs'}",
        "--backend",
        "slurm",
        "--wait",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr  # two trials failed
    root = json.loads(proc.stdout)["sweep_dir"]
    assert collect(root).counts == {"COMPLETED": 2, "FAILED": 2}  # finished when --wait returned
    people = run_cli(
        "sweep",
        str(spec),
        f"output_root={tmp_path / 'runs2'}",
        "--backend",
        "slurm",
        "--wait",
        cwd=tmp_path,
    )
    assert people.returncode == 1
    assert people.stdout.splitlines()[-1] == "spec: 4 trials: 2 completed, 2 failed"


def _resume_twice(root: str, *overrides: str) -> list[dict]:
    """Two `sweep --resume` at once; what each submitted."""
    argv = [*SLURMKIT, "sweep", "--resume", root, "--backend", "slurm", "--json", *overrides]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    return [json.loads(out) for out, _ in outs]


def _overlap(attempts: list[dict]) -> int:
    """The most attempts that ran at the same time."""
    edges = sorted([(a["start"], 1) for a in attempts] + [(a["end"], -1) for a in attempts])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_concurrent_resumes_submit_every_trial_once(slurm_cluster, tmp_path):
    """20 rounds of two resumes racing: one submits the 4 trials, the other nothing (they are
    queued by then); in the last round they run: each once, never more than max_parallel."""
    result = submit(
        tmp_path,
        "command: [sleep, '1']\nargs: none\nparams: {i: 'range(0,4)'}\nmax_parallel: 2\n"
        "resources: {extra: {hold: true}}\n",
    )
    root = result["sweep_dir"]
    arrays = {result["jobs"][0]["job_id"]}
    assert run_cli("cancel", root).returncode == 0
    for _ in range(20):
        wait_sweep(root, timeout=60)
        both = _resume_twice(root)
        assert sorted(len(r["indices"]) for r in both) == [0, 4], both
        arrays |= {j["job_id"] for r in both for j in r["jobs"]}
        done = json.loads(run_cli("cancel", root, "--json").stdout)
        assert len(done["jobs"]) == 1
    wait_sweep(root, timeout=60)
    both = _resume_twice(root, "resources.extra.hold=false")
    assert sorted(len(r["indices"]) for r in both) == [0, 4]
    final = wait_sweep(root, timeout=120)
    assert final["counts"] == {"COMPLETED": 4}
    attempts = []
    for trial in final["trials"]:
        status = json.loads((Path(root) / "trials" / trial["id"] / "status.json").read_text())
        assert [a["state"] for a in status["attempts"]] == ["COMPLETED"], status["attempts"]
        attempts += status["attempts"]
    assert _overlap(attempts) <= 2
    assert len(arrays) == 21  # the first array and one new one a round, never two


def test_resume_racing_a_running_array_submits_nothing(slurm_cluster, tmp_path):
    result = submit(
        tmp_path,
        "command: [sleep, '4']\nargs: none\nparams: {i: 'range(0,4)'}\nmax_parallel: 2\n",
    )
    root = result["sweep_dir"]
    wait_running(root, 1)
    for r in _resume_twice(root):
        assert r["indices"] == [] and r["jobs"] == []
    final = wait_sweep(root, timeout=120)
    assert final["counts"] == {"COMPLETED": 4}
    attempts = []
    for trial in final["trials"]:
        status = json.loads((Path(root) / "trials" / trial["id"] / "status.json").read_text())
        assert len(status["attempts"]) == 1
        attempts += status["attempts"]
    assert _overlap(attempts) <= 2


def test_a_second_array_of_the_same_trials_never_runs_them_twice(slurm_cluster, tmp_path):
    """The rendered script submitted again by hand, past the lock, while the first array runs:
    each task of the second array finds its trial claimed by a live job and leaves it be."""
    result = submit(tmp_path, "command: [sleep, '30']\nargs: none\nparams: {i: 'range(0,2)'}\n")
    root = result["sweep_dir"]
    first = result["jobs"][0]["job_id"]
    wait_running(root, 2)
    script = next((Path(root) / "scripts").iterdir())
    again = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True
    ).stdout.strip()
    logs = [Path(root) / "logs" / f"{again}_{task}.out" for task in (0, 1)]
    end = time.time() + 60
    while time.time() < end and not all(
        p.exists() and "leaves it be" in p.read_text() for p in logs
    ):
        time.sleep(0.5)
    for log in logs:
        assert "is running in job" in log.read_text(), log.read_text()
    assert collect(root).counts == {"RUNNING": 2}  # the second array took nothing over
    final = wait_sweep(root, timeout=120)
    assert final["counts"] == {"COMPLETED": 2}
    for trial in final["trials"]:
        status = json.loads((Path(root) / "trials" / trial["id"] / "status.json").read_text())
        assert [(a["state"], a["array_job_id"]) for a in status["attempts"]] == [
            ("COMPLETED", first)
        ]


def test_a_sweep_larger_than_max_job_count_is_refused_before_expanding(slurm_cluster, tmp_path):
    limit = int(slurm_cluster.config()["MaxJobCount"])
    spec = tmp_path / "big.yaml"
    spec.write_text(f"command: x\nparams: {{i: 'range(0,{limit + 1})'}}\n")
    argv = ["sweep", str(spec), f"output_root={tmp_path / 'runs'}", "--backend", "slurm"]
    proc = run_cli(*argv, cwd=tmp_path)
    assert proc.returncode == 2 and "--yes" in proc.stderr  # over 100,000: confirm first
    proc = run_cli(*argv, "--yes", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"at most {limit} jobs" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_missing_batch_host_python_is_named(slurm_cluster, tmp_path):
    """The runtime runs on the batch host: a Python that is not there fails the task at once,
    with a line that names it and SLURMKIT_PYTHON (and the trial shows FAILED)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("command: [/bin/true]\nargs: none\nparams: {i: [1]}\n")
    proc = run_cli(
        "sweep",
        str(spec),
        f"output_root={tmp_path / 'runs'}",
        "--backend",
        "slurm",
        "--json",
        cwd=tmp_path,
        env={"SLURMKIT_PYTHON": "/nonexistent/python3"},
    )
    assert proc.returncode == 0, proc.stderr
    root = json.loads(proc.stdout)["sweep_dir"]
    final = wait_sweep(root, timeout=120)
    assert final["counts"] == {"FAILED": 1}  # its exit code (2) is known to accounting only
    log = next((Path(root) / "logs").glob("*.out")).read_text()
    assert "no Python /nonexistent/python3 on" in log and "SLURMKIT_PYTHON" in log
