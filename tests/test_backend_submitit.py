"""The submitit backend (`--backend submitit`): a sweep's trials as submitit job arrays whose
tasks run slurmkit's trial runtime, so the sweep directory, status files, requeue from the host
and `status/results/logs/cancel/resume` are those of the slurm backend."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import PAYLOAD, ROOT, assert_shell_ok, run_cli, run_spec, wait_sweep

import slurmkit
from slurmkit import backends
from slurmkit import spec as spec_mod
from slurmkit.backends.slurm import SlurmBackend
from slurmkit.backends.submitit import SubmititBackend, script, task_records
from slurmkit.errors import SchedulerError, UserError
from slurmkit.sweepstate import collect

SWEEP = f"""
name: same
command: [python, {PAYLOAD}]
params: {{x: 'range(0,4)', report: ['{{"extra": 1.5}}']}}
resources: {{time: "0:05:00", mem: 100M}}
max_parallel: 3
"""
MOMENTS = ("start", "end", "host", "job_id", "array_job_id", "array_task_id")
# Where an attempt ran and when it made progress, where it did (issue 24's records): kept apart
# like the moments above, each run on its own nodes at its own times.
PLACES_AND_PROGRESS = ("nodes", "first_progress", "last_progress", "last_checkpoint")


# --- without a cluster ----------------------------------------------------------------------


def test_registered_by_one_line_and_not_asked_by_auto():
    assert backends.backend_class("submitit") is SubmititBackend
    assert "submitit" in backends.NAMES and "submitit" not in backends.AUTO
    assert SubmititBackend.sticky and not SubmititBackend.runs_here
    assert backends.for_resume([{"backend": "submitit"}]) == "submitit"


def test_help_and_the_backend_module_import_nothing_of_submitit():
    """`slurmkit --help` (and `sweep --help`, which lists the backends) loads neither submitit
    nor this backend; the backend module itself loads submitit only to submit."""
    code = (
        "import json, sys\n"
        "from slurmkit import cli\n"
        "for argv in (['--help'], ['sweep', '--help']):\n"
        "    try:\n"
        "        cli.main(argv, standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "help_modules = sorted(sys.modules)\n"
        "import slurmkit.backends.submitit\n"
        "print(json.dumps([help_modules, sorted(sys.modules)]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    at_help, with_backend = json.loads(proc.stdout.splitlines()[-1])
    assert "slurmkit.cli" in at_help  # the help above did run
    assert not [m for m in at_help if m.split(".")[0] == "submitit"]
    assert "slurmkit.backends.submitit" not in at_help
    assert not [m for m in with_backend if m.split(".")[0] == "submitit"]


@pytest.mark.parametrize(
    ("indices", "runs"),
    [
        ([0, 1, 2, 3], [(0, "0-3")]),
        ([1, 3, 5], [(1, "0"), (2, "1"), (3, "2")]),
        ([1000, 1001, 1004, 1005, 1006, 1010], [(1000, "0-1"), (1002, "2-4"), (1005, "5")]),
    ],
)
def test_task_records_name_the_trial_of_every_array_task(indices, runs):
    """Array task t of a map_array runs trial indices[t]; the records say so in the slurm
    backend's form (trial = offset + task), which its reading and cancelling use."""
    records = task_records("77", indices, "/s.sh")
    assert [(r["offset"], r["array"]) for r in records] == runs
    assert SlurmBackend().indices({"jobs": records}) == indices
    assert {r["job_id"] for r in records} == {"77"} and {r["script"] for r in records} == {"/s.sh"}


def _script(spec_file, body: str, count: int = 5) -> str:
    from slurmkit.executors import parameters

    spec = spec_mod.load(spec_file(body))
    return script(spec, "/shared/sw", parameters(spec), count, '"$PY" -m task /shared/sw/submitit')


def test_the_batch_script_is_submitits_header_over_slurmkits_supervision(spec_file):
    text = _script(spec_file, "command: [x]\nparams: {i: [1]}\nmax_parallel: 2\n")
    assert_shell_ok(text)
    lines = text.splitlines()
    for option in (
        "--array=0-4%2",
        "--requeue",
        "--signal=B:USR2@120",
        "--open-mode=append",
        "--output=/shared/sw/logs/%A_%a.out",  # where `slurmkit logs --slurm` looks
    ):
        assert f"#SBATCH {option}" in lines, option
    assert not [ln for ln in lines if ln.startswith("#SBATCH --error")]  # merged by default
    assert "export SLURMKIT_SWEEP_DIR=/shared/sw" in lines
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in text
    assert "srun" not in text  # the runtime launches the trial's step itself


def test_without_requeue_no_signal_and_separate_logs(spec_file):
    text = _script(
        spec_file,
        "command: [x]\nparams: {i: [1]}\nrequeue: {enabled: false}\nlogs: {stderr: separate}\n",
    )
    assert_shell_ok(text)
    lines = text.splitlines()
    assert "#SBATCH --no-requeue" in lines and "#SBATCH --error=/shared/sw/logs/%A_%a.err" in lines
    assert not [ln for ln in lines if ln.startswith(("#SBATCH --signal", "#SBATCH --requeue"))]
    assert not [ln for ln in lines if "scontrol" in ln and not ln.startswith("#")]
    assert 'exec "$PY" -m task /shared/sw/submitit' in lines


def test_without_submitit_the_backend_is_refused_before_anything_is_created(
    spec_file, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "submitit", None)  # what Python sees where it is missing
    assert "submitit is not installed" in SubmititBackend.absent()
    sw = slurmkit.Sweep.load(
        str(spec_file(f"command: [x]\nparams: {{i: [1]}}\noutput_root: {tmp_path}/runs\n"))
    )
    with pytest.raises(SchedulerError, match="submitit is not installed") as info:
        sw.submit(backend="submitit", progress=False)
    assert "slurmkit[submitit]" in (info.value.hint or "")
    assert not (tmp_path / "runs").exists()


# --- on the test cluster ----------------------------------------------------------------------


def _sweep(tmp_path: Path, body: str, backend: str, *args: str) -> dict[str, Any]:
    proc = run_spec(tmp_path, body, *args, backend=backend)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _trial_files(root: str) -> dict[str, tuple[Any, Any]]:
    """Every trial's status.json (without times, hosts and job ids) and metrics.json, by id."""
    out = {}
    for trial in sorted(Path(root, "trials").iterdir()):
        status = json.loads((trial / "status.json").read_text())
        status.pop("updated")
        for attempt in status["attempts"]:
            for key in MOMENTS:
                attempt.pop(key)
            for key in PLACES_AND_PROGRESS:
                attempt.pop(key, None)
        out[trial.name] = (status, json.loads((trial / "metrics.json").read_text()))
    return out


@pytest.mark.cluster
@pytest.mark.slow
def test_a_command_sweep_completes_as_on_the_slurm_backend(slurm_cluster, tmp_path):
    for name in ("slurm", "submitit"):
        (tmp_path / name).mkdir()
    on_slurm = _sweep(tmp_path / "slurm", SWEEP, "slurm")
    ours = _sweep(tmp_path / "submitit", SWEEP, "submitit")
    assert ours["backend"] == "submitit" and len({j["job_id"] for j in ours["jobs"]}) == 1
    root = ours["sweep_dir"]
    assert wait_sweep(root)["counts"] == {"COMPLETED": 4}
    assert wait_sweep(on_slurm["sweep_dir"])["counts"] == {"COMPLETED": 4}
    files = _trial_files(root)
    assert files == _trial_files(on_slurm["sweep_dir"])
    assert {m["score"] for _, m in files.values()} == {0.0, 2.0, 4.0, 6.0}
    # submitit made the array: its pickles, its batch script
    array = ours["jobs"][0]["job_id"]
    script_text = Path(ours["jobs"][0]["script"]).read_text()
    assert (
        "#SBATCH --array=0-3%3" in script_text and "export SUBMITIT_EXECUTOR=slurm" in script_text
    )
    assert len(list(Path(root, "submitit").glob(f"{array}_*_submitted.pkl"))) == 4
    # the CLI reads it as any sweep
    status = run_cli("status", root, "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert {t["job"] for t in shown["trials"]} == {f"{array}_{i}" for i in range(4)}
    rows = json.loads(run_cli("results", root, "--sort", "score", "--json").stdout)
    assert [(r["x"], r["score"], r["extra"]) for r in rows] == [(i, 2.0 * i, 1.5) for i in range(4)]
    log = run_cli("logs", root, "2")
    assert log.returncode == 0 and "hello from trial 2" in log.stdout
    slurm_log = run_cli("logs", root, "2", "--slurm")
    assert slurm_log.returncode == 0, slurm_log.stderr
    assert "Job completed successfully" in slurm_log.stdout  # submitit's own job code ran it


@pytest.mark.cluster
@pytest.mark.slow
def test_resume_after_failures_resubmits_only_them_through_submitit(slurm_cluster, tmp_path):
    """Odd trials fail on their first attempt; `sweep --resume` (no --backend: the backend
    sticks) submits them as one array whose tasks run trials 1, 3, 5, 7."""
    body = f"command: [python, {PAYLOAD}]\nparams: {{x: 'range(0,4)', flaky: [false, true]}}\n"
    root = _sweep(tmp_path, body, "submitit")["sweep_dir"]
    final = wait_sweep(root)
    assert final["counts"] == {"COMPLETED": 4, "FAILED": 4}
    failed = sorted(t["index"] for t in final["trials"] if t["state"] == "FAILED")
    assert failed == [1, 3, 5, 7]
    assert run_cli("status", root).returncode == 1
    again = run_cli("sweep", "--resume", root, "--json")
    assert again.returncode == 0, again.stderr
    resumed = json.loads(again.stdout)
    assert resumed["backend"] == "submitit" and resumed["indices"] == failed
    assert len({j["job_id"] for j in resumed["jobs"]}) == 1  # one map_array
    twice = json.loads(run_cli("sweep", "--resume", root, "--json").stdout)
    assert twice["indices"] == []  # they are queued or running: nothing to submit
    final = wait_sweep(root)
    assert final["counts"] == {"COMPLETED": 8}
    array = resumed["jobs"][0]["job_id"]
    for t in final["trials"]:
        assert t["attempts"] == (2 if t["index"] in failed else 1), t
        if t["index"] in failed:  # array task k of the resume ran the k-th failed trial
            assert t["job"] == f"{array}_{failed.index(t['index'])}"


@pytest.mark.cluster
@pytest.mark.slow
def test_cancel_stops_its_running_and_pending_trials(slurm_cluster, tmp_path):
    body = "command: [sleep, '300']\nargs: none\nparams: {i: 'range(0,5)'}\nmax_parallel: 2\n"
    ours = _sweep(tmp_path, body, "submitit")
    root, array = ours["sweep_dir"], ours["jobs"][0]["job_id"]
    end = time.time() + 60
    while collect(root).counts.get("RUNNING", 0) < 2 and time.time() < end:
        time.sleep(0.3)
    assert collect(root).counts == {"RUNNING": 2, "PENDING": 3}
    done = run_cli("cancel", root, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"] == [array]
    final = wait_sweep(root, timeout=60)
    assert set(final["counts"]) == {"CANCELLED"}, final["counts"]
    assert set(slurm_cluster.wait_for_jobs([array], timeout=30).values()) == {"CANCELLED"}


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("how", ["scontrol requeue", "requeue signal"])
def test_a_checkpointable_function_sweep_requeued_resumes(slurm_cluster, tmp_path, how):
    """`sweep_fn(..., backend="submitit")`: a Checkpointable trial interrupted by an external
    `scontrol requeue`, or by the requeue signal sent to the batch shell (as preemption sends
    it; the runtime then exits 75 and the batch shell requeues the task on the host), resumes
    from its checkpoint and returns what an uninterrupted run returns."""
    from submitit.helpers import Checkpointable

    class Count(Checkpointable):
        def __init__(self) -> None:
            self.done = 0
            self.total = 0

        def __call__(self, steps: int) -> dict:
            import os

            while self.done < steps:
                self.total += self.done
                self.done += 1
                time.sleep(0.1)
            return {"total": self.total, "attempt": int(os.environ["SLURMKIT_ATTEMPT"])}

    sw = slurmkit.sweep_fn(
        Count(),
        {"steps": [150]},
        backend="submitit",
        output_root=str(tmp_path / "runs"),
        progress=False,
    )
    root = sw.sweep_dir
    assert sw.submission is not None and sw.submission.backend == "submitit"
    end = time.time() + 60
    while time.time() < end and sw.status().counts.get("RUNNING") != 1:
        time.sleep(0.3)
    time.sleep(3)  # the function runs (its handler is installed)
    [job] = [t.job for t in sw.status().trials]
    assert job is not None
    if how == "scontrol requeue":
        slurm_cluster.run("scontrol", "requeue", job)
    else:
        slurm_cluster.run("scancel", "--batch", "--signal=USR2", job)
    slurm_cluster.release_requeued(job)
    assert sw.wait(progress=False, interval=1).counts == {"COMPLETED": 1}
    value = sw.result(0)
    assert value == {"total": sum(range(150)), "attempt": 2}
    assert "resuming" in sw.logs(0)
    status = json.loads(next(Path(root, "trials").glob("*/status.json")).read_text())
    assert [(a["state"], a.get("cause")) for a in status["attempts"]] == [
        ("REQUEUED", "preemption"),
        ("COMPLETED", None),
    ]
    assert status["attempts"][1]["restart_count"] == "1"  # the same array task, run again
    assert slurm_cluster.jobs(job)[0]["Restarts"] == "1"
    shown = run_cli("results", root, "--json")  # the CLI reads the function sweep too
    assert shown.returncode == 0 and json.loads(shown.stdout)[0]["total"] == sum(range(150))


@pytest.mark.cluster
@pytest.mark.slow
def test_a_function_sweep_gives_the_results_of_the_slurm_backend(slurm_cluster, tmp_path):
    scale = 10  # a closure: pickled by value, as a notebook's function is

    def train(lr: float, layers: int) -> dict:
        slurmkit.report(step=1, seen=lr)
        return {"loss": lr * scale + layers}

    space = {"lr": [0.1, 0.2], "layers": [1, 2]}
    sweeps = {
        name: slurmkit.sweep_fn(
            train, space, backend=name, output_root=str(tmp_path / name), progress=False
        )
        for name in ("slurm", "submitit")
    }
    for sw in sweeps.values():
        assert sw.wait(progress=False, interval=1).counts == {"COMPLETED": 4}
    ours, theirs = (sweeps[n] for n in ("submitit", "slurm"))
    assert _trial_files(ours.sweep_dir) == _trial_files(theirs.sweep_dir)
    assert [ours.result(i) for i in range(4)] == [theirs.result(i) for i in range(4)]
    assert ours.results(sort="loss") == theirs.results(sort="loss")
    records = json.loads(next(Path(ours.sweep_dir, "submissions").glob("*.json")).read_text())
    assert records["backend"] == "submitit"


@pytest.mark.cluster
@pytest.mark.slow
def test_sweep_submit_through_submitit_and_bad_input_is_refused_first(slurm_cluster, tmp_path):
    """Sweep.submit(backend="submitit") runs; an unknown partition, an unknown resource key
    and a function that cannot be pickled are refused before anything is created."""
    spec = tmp_path / "s.yaml"
    spec.write_text(f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2]}}\n")
    sw = slurmkit.Sweep.load(str(spec), [f"output_root={tmp_path}/ok"])
    sw.submit(backend="submitit", progress=False)
    assert sw.wait(progress=False, interval=1).counts == {"COMPLETED": 2}

    bad = run_spec(
        tmp_path, SWEEP, "resources.partition=nosuch", backend="submitit", name="bad.yaml"
    )
    assert bad.returncode == 2, bad.stderr
    assert "Slurm refused the job" in bad.stderr and "partitions on this cluster" in bad.stderr
    assert bad.stderr.count("invalid partition specified") == 1  # said once, in the error
    assert "Traceback" not in bad.stderr and not any((tmp_path / "runs").iterdir())
    unknown = run_spec(tmp_path, SWEEP, "+resources.gpux=1", backend="submitit", name="u.yaml")
    assert unknown.returncode == 2 and "gpux" in unknown.stderr
    assert not any((tmp_path / "runs").iterdir())
    with open(tmp_path / "data.txt", "w") as fh:

        def holds_a_file(x: int) -> None:
            fh.write("x")

        with pytest.raises(UserError, match="cannot be sent"):
            slurmkit.sweep_fn(
                holds_a_file, {"x": [1]}, backend="submitit", output_root=str(tmp_path / "fn")
            )
    assert not (tmp_path / "fn").exists()
