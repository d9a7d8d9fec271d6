"""Function sweeps (slurmkit.sweep_fn): a callable per trial, with the sweep directory, status
files, metrics and results of a command sweep, readable by the CLI."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli, wait_sweep

import slurmkit
from slurmkit.errors import UserError


@pytest.mark.slow
def test_a_function_sweep_runs_each_trial_and_keeps_its_result(tmp_path):
    scale = 10  # a closure: pickled by value, as a notebook's function is

    def train(lr: float, layers: int) -> dict:
        slurmkit.report(step=1, seen=lr)
        return {"loss": lr * scale + layers, "name": f"l{layers}"}

    sw = slurmkit.sweep_fn(
        train,
        {"lr": [0.1, 0.2], "layers": [1, 2]},
        backend="local",
        output_root=str(tmp_path / "runs"),
    )
    assert sw.status().counts == {"COMPLETED": 4}
    rows = sw.results(sort="loss")
    assert [(r["lr"], r["layers"], r["loss"]) for r in rows] == [
        (0.1, 1, 2.0),
        (0.1, 2, 3.0),
        (0.2, 1, 3.0),
        (0.2, 2, 4.0),
    ]
    assert rows[0]["seen"] == 0.1 and rows[0]["name"] == "l1"  # report() inside, and the result
    assert sw.result(0) == {"loss": 2.0, "name": "l1"}
    assert Path(sw.sweep_dir, "function.pkl").exists()
    shown = run_cli("results", sw.sweep_dir, "--json")  # the CLI reads it as any sweep
    assert shown.returncode == 0 and len(json.loads(shown.stdout)) == 4
    assert run_cli("status", sw.sweep_dir).returncode == 0


def test_any_return_value_is_kept_and_a_failure_is_a_failed_trial(tmp_path):
    def odd(x: int) -> object:
        if x == 3:
            raise ValueError("three")
        return {"pairs": [(x, x)]}  # not metrics: kept as the result only

    sw = slurmkit.sweep_fn(odd, {"x": [1, 3]}, backend="local", output_root=str(tmp_path))
    assert sw.status().counts == {"COMPLETED": 1, "FAILED": 1}
    assert sw.result(0) == {"pairs": [(1, 1)]}
    assert "ValueError: three" in sw.logs(1)
    with pytest.raises(UserError, match="has no result"):
        sw.result(1)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda root: slurmkit.sweep_fn(lambda: 0, {"x": [1]}, resources={"gpux": 1}), "gpux"),
        (lambda root: slurmkit.sweep_fn(lambda x: 0, {"a.b": [1]}), "keyword argument"),
        (lambda root: slurmkit.sweep_fn(lambda x: 0, {"x": [1]}, command=["x"]), "sets command"),
        (lambda root: slurmkit.sweep_fn(42, {"x": [1]}), "not callable"),
        (lambda root: slurmkit.sweep_fn(_over_open_file(root), {"x": [1]}), "cannot be sent"),
    ],
    ids=["unknown resource", "dotted param", "command", "not callable", "open file"],
)
def test_bad_input_is_refused_before_anything_is_created(tmp_path, monkeypatch, call, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as info:
        call(tmp_path)
    assert words in str(info.value)
    assert not (tmp_path / "runs").exists()


def _over_open_file(root: Path):
    fh = open(root / "data.txt", "w")  # noqa: SIM115 - a function that holds an open file

    def uses() -> None:
        fh.write("x")

    return uses


@pytest.mark.cluster
@pytest.mark.parametrize("how", ["scontrol requeue", "partition preemption"])
def test_a_checkpointable_function_interrupted_resumes_with_the_same_result(
    slurm_cluster, tmp_path, how
):
    """A submitit Checkpointable on the real cluster, interrupted while it runs by `scontrol
    requeue` or by a job of the higher partition: the trial checkpoints (its state is the
    object), is requeued, resumes from the checkpoint, and returns what an uninterrupted run
    returns."""
    from submitit.helpers import Checkpointable

    class Count(Checkpointable):
        def __init__(self) -> None:
            self.done = 0
            self.total = 0

        def __call__(self, steps: int) -> dict:
            while self.done < steps:
                self.total += self.done
                self.done += 1
                time.sleep(0.1)
            return {"total": self.total, "attempt": int(os.environ["SLURMKIT_ATTEMPT"])}

    pinned = {"partition": "low", "extra": {"nodelist": "n3", "exclusive": True}}
    sw = slurmkit.sweep_fn(
        Count(),
        {"steps": [120]},
        backend="slurm",
        output_root=str(tmp_path / "runs"),
        **({"resources": pinned} if how == "partition preemption" else {}),
    )
    root = sw.sweep_dir
    end = time.time() + 60
    while time.time() < end and sw.status().counts.get("RUNNING") != 1:
        time.sleep(0.3)
    time.sleep(3)
    status_file = next(Path(root, "trials").glob("*/status.json"))
    attempt = json.loads(status_file.read_text())["attempts"][0]
    if how == "scontrol requeue":
        ref = f"{attempt['array_job_id']}_{attempt['array_task_id']}"
        slurm_cluster.run("scontrol", "requeue", ref)
    else:
        slurm_cluster.sbatch(
            "--partition=high",
            "--nodelist=n3",
            "--exclusive",
            "--output=/dev/null",
            "--wrap",
            "sleep 3",
        )
    final = slurm_cluster.finish(root)
    assert final["counts"] == {"COMPLETED": 1}
    value = sw.result(0)
    assert value["total"] == sum(range(120)) and value["attempt"] == 2
    assert "resuming" in sw.logs(0) and not list(Path(root, "trials").glob("*/checkpoint.pkl"))
    status = json.loads(status_file.read_text())
    assert [a.get("cause") for a in status["attempts"]] == ["preemption", None]
    assert wait_sweep(root)["counts"] == {"COMPLETED": 1}
    shown = run_cli("results", root, "--json")  # the CLI reads the function sweep too
    assert shown.returncode == 0 and json.loads(shown.stdout)[0]["total"] == sum(range(120))


def test_without_a_cluster_a_function_sweep_runs_here_and_says_so(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch: auto falls back
    monkeypatch.setenv("SLURMKIT_PYTHON", sys.executable)

    def double(x: int) -> int:
        return 2 * x

    sw = slurmkit.sweep_fn(double, {"x": [1, 2]}, output_root=str(tmp_path), progress=False)
    assert sw.submission is not None and sw.submission.ran_here
    assert [sw.result(i) for i in (0, 1)] == [2, 4]
    assert "no sbatch on PATH: running the sweep on this machine" in capfd.readouterr().err
