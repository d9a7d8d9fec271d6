"""slurmkit.executor: spec -> submitit parameters and batch script, bad input refused before
anything is submitted, the local fallback, and the in-job supervisor's requeue decisions
(python -m slurmkit.runtime.fnjob, against a fake scontrol)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, assert_shell_ok

import slurmkit
from slurmkit import executors
from slurmkit.errors import SpecError, UserError
from slurmkit.launch import SELF_CHECK_NAME
from slurmkit.spec import Requeue

PAYLOADS = ROOT / "tests" / "payloads"
sys.path.insert(0, str(PAYLOADS))
import fnjobs  # noqa: E402  (jobs import it by this name, from PYTHONPATH)


def config(spec: Any = None, overrides: tuple[str, ...] = (), **kw: Any) -> dict[str, Any]:
    return executors.executor_config(spec, overrides, **kw)


def script(spec: Any = None, overrides: tuple[str, ...] = (), array: int | None = None, **kw):
    """The batch script an executor of ``spec`` submits (an array of ``array`` calls)."""
    s = executors.setup(executors.load(spec, list(overrides), kw), None, None)
    params = {**s.parameters, **({"map_count": array} if array else {})}
    return executors.script(s, params, s.command(), s.folder)


def sbatch_lines(text: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")
    ]


@pytest.fixture
def slurm_here(monkeypatch):
    """SpecExecutor without a cluster: srun 'found' and the backend choice answered."""
    import submitit

    from slurmkit import backends
    from slurmkit.backends.slurm import SlurmBackend

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))

    class Answered:
        def __init__(self, name: str) -> None:
            self.why = ""

        def result(self):
            return SlurmBackend()

    monkeypatch.setattr(backends, "Choosing", Answered)
    monkeypatch.setattr(SlurmBackend, "check", lambda self, spec, trials: None)


# --- the mapping ------------------------------------------------------------------------------


def test_resources_map_to_submitit_parameters(tmp_path):
    spec = {
        "name": "train",
        "max_parallel": 6,
        "resources": {
            "partition": "high",
            "time": "0:15:30",
            "nodes": 2,
            "tasks_per_node": 4,
            "cpus_per_task": 3,
            "gpus": "h100:4",
            "mem": "16G",
            "account": "ml",
            "qos": "hi",
            "constraint": "a100",
            "exclusive": True,
            "switches": "1@10:00",
            "extra": {"comment": "run42", "hold": False, "x11": True},
        },
    }
    cfg = config(spec, (f"output_root={tmp_path}",))
    assert cfg["parameters"] == {
        "job_name": "train",
        "partition": "high",
        "time": 16,  # minutes: Slurm rounds 15:30 up too
        "nodes": 2,
        "ntasks_per_node": 4,
        "cpus_per_task": 3,
        "gpus_per_node": "h100:4",
        "mem": "16G",
        "account": "ml",
        "qos": "hi",
        "constraint": "a100",
        "exclusive": True,
        "additional_parameters": {"comment": "run42", "x11": True, "switches": "1@10:00"},
        "array_parallelism": 6,
        "signal_delay_s": 120,
        "wckey": None,
        "srun_args": ["--kill-on-bad-exit=1"],
    }
    assert cfg["folder"] == str(tmp_path / "train" / "submitit")
    assert cfg["sbatch"] == ["--requeue", "--signal=B:USR2@120"]
    assert cfg["supervise"]["tasks"] == 8


def test_every_setting_asked_for_is_in_the_script_and_nothing_else():
    text = script(
        {
            "resources": {
                "partition": "high",
                "time": 20,
                "nodes": 2,
                "tasks_per_node": 2,
                "cpus": 3,
                "gpus": 4,
                "mem": "8G",
                "account": "ml",
                "qos": "hi",
                "constraint": "a100",
                "exclusive": True,
                "switches": 1,
                "extra": {"comment": "x", "hold": False},
            }
        },
        array=10,
    )
    lines = sbatch_lines(text)
    for option in (
        "--partition=high",
        "--time=20",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--cpus-per-task=3",
        "--gpus-per-node=4",
        "--mem=8G",
        "--account=ml",
        "--qos=hi",
        "--constraint=a100",
        "--exclusive",
        "--switches=1",
        "--comment=x",
        "--requeue",
        "--signal=B:USR2@120",
        "--open-mode=append",
        "--array=0-9%10",
        "--job-name=submitit",
    ):
        assert option in lines, (option, lines)
    assert not [line for line in lines if line.startswith(("--hold", "--wckey"))]
    assert_shell_ok(text)


def test_the_defaults_ask_for_nothing():
    lines = sbatch_lines(script())
    names = {line.split("=")[0] for line in lines}
    assert names == {
        "--error",
        "--output",
        "--job-name",
        "--nodes",
        "--open-mode",
        "--requeue",
        "--signal",
    }, lines  # no --cpus-per-task, --time (the partition's), --mem, --gpus, --wckey


def test_the_step_runs_under_the_supervisor_and_requeues_on_the_host():
    text = script({"env": {"A": "$X y", "B": "1"}}, array=3)
    assert "export A='$X y'" in text and "export B=1" in text  # byte-exact
    assert "export SLURMKIT_REQUEUE_SIGNAL=USR2" in text
    assert "trap 'slurmkit_forward USR2' USR2" in text
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in text
    line = next(line for line in text.splitlines() if "-m slurmkit.runtime.fnjob sup" in line)
    assert line.startswith('"$PY" -m slurmkit.runtime.fnjob supervise --config ')
    assert "-- srun --unbuffered --output " in line and "%A_%a_%t_log.out" in line
    assert "--kill-on-bad-exit=1" in line
    assert line.endswith(
        " -u -m slurmkit.runtime.fnjob run "
        + executors.setup(executors.load(None), None, None).folder
        + " &"
    )
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script()


def test_requeue_signal_lead_and_off():
    text = script({"requeue": {"signal": "USR1", "lead": 300}})
    assert "--signal=B:USR1@300" in sbatch_lines(text)
    assert "trap 'slurmkit_forward USR1' USR1" in text
    assert "export SLURMKIT_REQUEUE_SIGNAL=USR1" in text
    off = script({"requeue": {"enabled": False}})
    lines = sbatch_lines(off)
    assert "--no-requeue" in lines and not [x for x in lines if x.startswith("--signal")]
    assert 'exec "$PY" -m slurmkit.runtime.fnjob supervise' in off and "trap" not in off
    assert_shell_ok(off)


def test_setup_and_teardown_lines():
    s = executors.setup(executors.load(None), None, None)
    params = {**s.parameters, "setup": ["module load x"], "teardown": ["echo bye"]}
    text = executors.script(s, params, s.command(), s.folder)
    assert text.index("module load x") < text.index("fnjob supervise") < text.index("echo bye")
    assert text.rstrip().endswith('exit "$rc"')
    assert_shell_ok(text)


def test_layers_profile_user_config_spec_overrides_keywords(tmp_path, monkeypatch):
    user = tmp_path / "config.yaml"
    user.write_text("resources: {partition: p1, account: a1, qos: q1}\nprofile: sunk\n")
    monkeypatch.setenv("SLURMKIT_CONFIG", str(user))
    spec = tmp_path / "job.yaml"
    spec.write_text("resources: {partition: p2, account: a2, cpus: 2}\nenv: {NCCL_DEBUG: WARN}\n")
    cfg = config(spec, ("resources.account=a3",), cpus_per_task=5)
    p = cfg["parameters"]
    assert (p["partition"], p["account"], p["qos"], p["cpus_per_task"]) == ("p2", "a3", "q1", 5)
    assert p["job_name"] == "job"  # the file's stem
    s = executors.setup(executors.load(spec), None, None)
    assert s.spec.env["NCCL_DEBUG"] == "WARN" and "NCCL_SOCKET_IFNAME" in s.spec.env  # sunk


@pytest.mark.parametrize("key", ["params", "num_samples", "seed", "args", "command", "logs"])
def test_sweep_keys_are_refused_naming_the_key(key, tmp_path):
    values = {
        "params": {"lr": [1, 2]},
        "num_samples": 2,
        "seed": 1,
        "args": "none",
        "command": "x",
        "logs": {"stderr": "separate"},
    }
    with pytest.raises(SpecError) as err:
        config({key: values[key]})
    assert err.value.key == key and err.value.file == executors.DICT_SOURCE
    assert "executor" in err.value.message
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({key: values[key]}))
    with pytest.raises(SpecError) as err:
        config(path)
    assert (err.value.key, err.value.file) == (key, str(path))
    with pytest.raises(SpecError) as err:
        config(
            None, ({"params": "params.lr=1,2", "logs": "logs.stderr=merged"}.get(key, f"{key}=1"),)
        )
    assert err.value.key == key and err.value.file == "command line"


def test_a_job_spec_without_its_command_loads(tmp_path):
    path = tmp_path / "ddp.yaml"
    path.write_text("command: python train.py\nresources: {nodes: 2}\n")
    assert config(path, ("~command",))["parameters"]["nodes"] == 2


def test_unknown_resource_key_is_an_error_before_anything(monkeypatch):
    from slurmkit import backends

    monkeypatch.setattr(backends, "Choosing", lambda name: pytest.fail("asked a backend"))
    with pytest.raises(SpecError) as err:
        slurmkit.executor(None, gpu=1)
    e = err.value
    assert e.key == "resources.gpu" and e.file == executors.KEYWORDS
    assert "did you mean 'gpus'" in e.message and "gpus_per_node" in (e.hint or "")
    with pytest.raises(SpecError, match="resources.nodes"):
        slurmkit.executor({"resources": {"nodes": 0}})
    with pytest.raises(SpecError) as err:
        slurmkit.executor({"resources": {"tasks": 2}})
    assert err.value.file == executors.DICT_SOURCE and err.value.key == "resources.tasks"


def test_torchrun_is_refused():
    with pytest.raises(SpecError) as err:
        config({"launcher": "torchrun"})
    assert err.value.key == "launcher" and "launcher: srun" in (err.value.hint or "")
    cfg = config({"launcher": "srun", "resources": {"gpus": 4}})
    assert cfg["parameters"]["ntasks_per_node"] == 4  # one task per GPU


def test_overrides_must_be_a_list():
    with pytest.raises(UserError, match="list of strings"):
        slurmkit.executor(None, "resources.nodes=2")


def test_a_dict_spec_keeps_strings_as_strings():
    cfg = config({"resources": {"time": "15:00"}, "env": {"LR": "1e-3", "ON": "true"}})
    assert cfg["parameters"]["time"] == 15  # 15 minutes, not 900 s
    s = executors.setup(executors.load({"env": {"LR": "1e-3", "ON": "true"}}), None, None)
    assert s.spec.env == {"LR": "1e-3", "ON": "true"}
    with pytest.raises(SpecError, match="float"):
        config({"env": {"LR": 1e-3}})


# --- containers -------------------------------------------------------------------------------

CONTAINER = {"container": {"image": "nvcr.io/nvidia/pytorch:24.01-py3", "mounts": ["/mnt/d:/d"]}}


def test_container_options_go_on_srun_and_the_self_check_runs_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config({**CONTAINER, "env_prepend": {"LD_LIBRARY_PATH": "/opt/x"}, "env": {"A": "1"}})
    srun = cfg["parameters"]["srun_args"]
    assert srun[0] == "--kill-on-bad-exit=1"
    assert "--container-image=nvcr.io#nvidia/pytorch:24.01-py3" in srun
    assert f"--container-mounts=/mnt/d:/d,{tmp_path}:{tmp_path}" in srun  # runs/ is under it
    assert "--container-env=MASTER_ADDR,MASTER_PORT,A" in srun
    assert cfg["srun"][-len(srun) :] == srun
    cmd = cfg["command"]
    assert cmd[:2] == ["sh", "-c"] and cmd[3] == SELF_CHECK_NAME
    assert cmd[4:6] == ["sh", "-c"] and cmd[7:9] == ["slurmkit-env", "/opt/x"]
    assert cmd[9:] == ["python3", "-u", "-m", executors.STEP, "run", cfg["folder"]]
    text = script({**CONTAINER})
    assert SELF_CHECK_NAME in text and "--container-image=" in text
    assert_shell_ok(text)
    off = config({**CONTAINER, "self_check": False})["command"]
    assert off[0] == "python3"


def test_the_folder_is_mounted_when_no_mount_holds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    srun = config(CONTAINER, ("output_root=/scratch/runs",))["parameters"]["srun_args"]
    mounts = next(a for a in srun if a.startswith("--container-mounts="))
    assert "/scratch/runs/submitit/submitit:/scratch/runs/submitit/submitit" in mounts.split(",")
    same = {"container": {**CONTAINER["container"], "mounts": ["/mnt/d"]}}  # at its own path
    held = config(same, folder="/mnt/d/x/%j")["parameters"]["srun_args"]
    assert "/mnt/d/x" not in next(a for a in held if a.startswith("--container-mounts="))
    moved = config(CONTAINER, folder="/mnt/d/x/%j")["parameters"]["srun_args"]  # /d inside
    assert "/mnt/d/x:/mnt/d/x" in next(a for a in moved if a.startswith("--container-mounts="))
    with pytest.raises(UserError) as err:
        config(CONTAINER, folder="/data/a,b")
    assert err.value.key == "folder"


def test_a_container_needs_pyxis_on_the_cluster(monkeypatch):
    """The slurm backend's own check (tests/test_cluster_jobs.py runs it for real)."""
    import submitit

    from slurmkit import backends
    from slurmkit.backends import slurm

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    monkeypatch.setattr(slurm, "has_pyxis", lambda: False)

    class Answered:
        why = ""

        def __init__(self, name: str) -> None:
            pass

        def result(self):
            return slurm.SlurmBackend()

    monkeypatch.setattr(backends, "Choosing", Answered)
    with pytest.raises(UserError, match="pyxis"):
        slurmkit.executor(CONTAINER)


# --- the executor -----------------------------------------------------------------------------


def test_executor_is_a_slurm_executor_with_the_spec_parameters(slurm_here, tmp_path):
    import submitit

    ex = slurmkit.executor({"resources": {"nodes": 2, "mem": "4G"}}, [f"output_root={tmp_path}"])
    assert isinstance(ex, submitit.SlurmExecutor)
    assert ex.parameters["nodes"] == 2 and ex.parameters["mem"] == "4G"
    assert ex.folder == tmp_path / "submitit" / "submitit"
    ex.update_parameters(
        slurm_partition="p", timeout_min=7, mem_gb=2, tasks_per_node=4, name="n", srun_args=["-l"]
    )
    p = ex.parameters
    assert (p["partition"], p["time"], p["mem"], p["ntasks_per_node"], p["job_name"]) == (
        "p",
        7,
        "2GB",
        4,
        "n",
    )
    assert p["srun_args"] == ["--kill-on-bad-exit=1", "-l"]  # the spec's stay first
    text = ex._make_submission_file_text(ex._submitit_command_str, "x")
    assert "#SBATCH --time=7" in text and "-- srun " in text and " -l " in text
    with pytest.raises(ValueError, match="Unavailable parameter"):
        ex.update_parameters(no_such_thing=1)


def test_an_unpicklable_function_is_refused_before_submission(slurm_here, tmp_path, monkeypatch):
    ex = slurmkit.executor(None, [f"output_root={tmp_path}"])
    monkeypatch.setattr(type(ex), "_submit_command", lambda self, c: pytest.fail("submitted"))
    with open(tmp_path / "f.txt", "w") as fh:
        with pytest.raises(UserError) as err:
            ex.submit(lambda: fh.write("x"))
        assert "cannot pickle" in err.value.message and "files" in err.value.message
        assert "nothing submitted" in err.value.message
        with pytest.raises(UserError, match="cannot pickle"):
            ex.map_array(fnjobs.square, [1, 2, fh])  # one bad argument: none goes
        with pytest.raises(UserError, match="cannot pickle"), ex.batch():
            ex.submit(fnjobs.square, 1)
            ex.submit(fnjobs.square, fh)
    assert not list((tmp_path / "submitit" / "submitit").glob("*.pkl"))


def test_map_array_submits_one_array_of_the_spec_script(slurm_here, tmp_path, monkeypatch):
    ex = slurmkit.executor({"max_parallel": 3}, [f"output_root={tmp_path}"])
    seen: list[str] = []

    def fake_sbatch(self, path):
        seen.append(Path(path).read_text())
        return ["echo", "Submitted batch job 4242"]

    monkeypatch.setattr(type(ex), "_make_submission_command", fake_sbatch)
    jobs = ex.map_array(fnjobs.square, range(5))
    assert [j.job_id for j in jobs] == [f"4242_{i}" for i in range(5)]
    assert len(seen) == 1 and "#SBATCH --array=0-4%3" in seen[0]
    assert "fnjob supervise" in seen[0]
    assert all(j.paths.submitted_pickle.exists() for j in jobs)


def test_unknown_backend():
    with pytest.raises(UserError) as err:
        slurmkit.executor(None, backend="k8s")
    assert err.value.key == "backend"


def test_import_slurmkit_stays_light():
    code = (
        "import json, sys, slurmkit, slurmkit.executors; slurmkit.executor; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "submitit" not in json.loads(out.stdout)


def test_slurmkit_executor_is_the_function_every_time():
    assert slurmkit.executor is slurmkit.executor is executors.executor


# --- no cluster: submitit's LocalExecutor -------------------------------------------------


@pytest.mark.slow
def test_without_a_cluster_the_local_executor_runs_the_jobs(tmp_path, monkeypatch, capsys):
    import submitit

    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    monkeypatch.setenv("PYTHONPATH", str(PAYLOADS))
    spec = {"env": {"A": "$X"}, "env_prepend": {"P": "/x"}, "resources": {"time": 5}}
    ex = slurmkit.executor(spec, [f"output_root={tmp_path}"])
    slurmkit.executor(spec, [f"output_root={tmp_path}"])
    assert isinstance(ex, submitit.LocalExecutor)
    notes = capsys.readouterr().err
    assert notes.count("LocalExecutor runs the jobs on this machine") == 1
    assert "no sbatch on PATH" in notes
    assert ex.parameters["timeout_min"] == 5
    job = ex.submit(fnjobs.env_of, "A", "P")
    assert job.result() == {"A": "$X", "P": "/x"}
    with open(tmp_path / "f.txt", "w") as fh, pytest.raises(UserError, match="cannot pickle"):
        ex.submit(fnjobs.square, fh)


def test_without_a_cluster_what_needs_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    for spec, key in (
        ({"resources": {"nodes": 2}}, "resources.nodes"),
        (CONTAINER, "container"),
        ({"env_runtime": {"TMPDIR": "/s/{job_id}"}}, "env_runtime"),
    ):
        with pytest.raises(UserError) as err:
            slurmkit.executor(spec, backend="local")
        assert err.value.key == key


# --- the supervisor (python -m slurmkit.runtime.fnjob) against a fake scontrol -----------------

FAKE_SCONTROL = """#!/bin/sh
# `scontrol show job -o ID` / `show node -o NODE` of a test: the job's state from the environment
if [ "$2" = node ]; then echo "NodeName=n1 State=IDLE"; exit 0; fi
end=$(date -d "+${FAKE_END_IN:-3600} sec" +%Y-%m-%dT%H:%M:%S)
echo "JobId=$SLURM_JOB_ID JobState=${FAKE_STATE:-RUNNING} Reason=None Restarts=${FAKE_RESTARTS:-0}\
 PreemptTime=None TimeLimit=01:00:00 RunTime=00:00:05 EndTime=$end"
"""


class Job:
    """One submitit job folder, run by the supervisor as the batch script would (no Slurm)."""

    def __init__(self, tmp_path: Path, fn: Any, *args: Any, budgets: dict | None = None) -> None:
        from submitit.core.utils import DelayedSubmission

        self.folder = tmp_path / "jobs"
        self.folder.mkdir()
        self.id = "4242"
        DelayedSubmission(fn, *args).dump(self.folder / f"{self.id}_submitted.pkl")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
        (bin_dir / "scontrol").chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHONPATH": str(PAYLOADS),
            "SUBMITIT_EXECUTOR": "slurm",
            "SLURM_JOB_ID": self.id,
            "SLURM_PROCID": "0",
            "SLURM_RESTART_COUNT": "0",
        }
        self.config = {
            "folder": str(self.folder),
            "tasks": 1,
            "requeue": {
                "enabled": True,
                "signal": "USR2",
                "lead": 120,
                "budgets": {**Requeue().budgets, **(budgets or {})},
            },
            "env_runtime": {"SCRATCH": "/s/{job_id}"},
            "workdir": None,
        }

    def start(self, **env: str) -> subprocess.Popen[str]:
        step = [sys.executable, "-m", executors.STEP, "run", str(self.folder)]
        argv = [sys.executable, "-m", executors.STEP, "supervise"]
        argv += ["--config", json.dumps(self.config), "--", *step]
        return subprocess.Popen(
            argv, env={**self.env, **env}, stderr=subprocess.PIPE, text=True, cwd=self.folder
        )

    def run(self, **env: str) -> tuple[int, str]:
        proc = self.start(**env)
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err

    def result(self) -> Any:
        import submitit

        return submitit.SlurmJob(self.folder, self.id)._get_outcome_and_result()

    def attempts(self) -> list[dict]:
        return json.loads((self.folder / f"{self.id}_attempts.json").read_text())["attempts"]

    def signal(self, proc: subprocess.Popen[str], signum: int, progress: Path, at: int) -> None:
        deadline = time.monotonic() + 30
        while not (
            progress.exists()
            and progress.read_text()
            and int(progress.read_text().split()[0]) >= at
        ):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
            time.sleep(0.05)
        proc.send_signal(signum)


@pytest.mark.slow
def test_supervisor_completes_and_does_not_run_a_finished_job_again(tmp_path):
    job = Job(tmp_path, fnjobs.env_of, "SCRATCH", "MASTER_ADDR", "SLURMKIT_REQUEUE_SIGNAL")
    code, err = job.run()
    assert code == 0, err
    assert job.result() == (
        "success",
        {"SCRATCH": "/s/4242", "MASTER_ADDR": "localhost", "SLURMKIT_REQUEUE_SIGNAL": "USR2"},
    )
    code, err = job.run()
    assert code == 0 and "not running it again" in err
    assert [a["state"] for a in job.attempts()] == ["COMPLETED"]


@pytest.mark.slow
def test_supervisor_asks_for_a_requeue_when_the_step_checkpointed(tmp_path):
    where = tmp_path / "progress"
    job = Job(tmp_path, fnjobs.SumOfSquares(str(where)), 10_000)
    proc = job.start()
    job.signal(proc, signal.SIGUSR2, where, 5)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert (job.folder / f"{job.id}_requeue").exists()
    assert not (job.folder / f"{job.id}_0_result.pkl").exists()
    [attempt] = job.attempts()
    assert (attempt["state"], attempt["cause"], attempt["signals"]) == (
        "REQUEUED",
        "preemption",
        ["USR2"],
    )
    from submitit.core.utils import DelayedSubmission

    saved = DelayedSubmission.load(job.folder / f"{job.id}_submitted.pkl")
    assert saved.function.state[0] >= 5  # the checkpoint replaced the submitted call


@pytest.mark.slow
def test_supervisor_fails_a_timeout_whose_budget_is_spent(tmp_path):
    where = tmp_path / "progress"
    job = Job(tmp_path, fnjobs.SumOfSquares(str(where)), 10_000, budgets={"timeout": 0})
    proc = job.start(FAKE_END_IN="60")  # the signal came `lead` s before the limit
    job.signal(proc, signal.SIGUSR2, where, 2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    outcome, text = job.result()
    assert outcome == "error" and "timeout budget exhausted (0 requeues)" in text
    assert job.attempts()[0]["cause"] == "timeout"


@pytest.mark.slow
def test_supervisor_keeps_a_cancel_cancelled(tmp_path):
    where = tmp_path / "progress"
    job = Job(tmp_path, fnjobs.SumOfSquares(str(where)), 10_000)
    proc = job.start(FAKE_STATE="CANCELLED")
    job.signal(proc, signal.SIGTERM, where, 2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err  # never 75: the batch shell does not requeue it
    assert job.result() == ("error", "slurmkit: the job was cancelled")
    assert job.attempts()[0]["state"] == "CANCELLED"


@pytest.mark.slow
def test_supervisor_stops_a_plain_function_and_requeues_it_on_preemption(tmp_path):
    job = Job(tmp_path, fnjobs.sleeper, 30)
    proc = job.start()
    time.sleep(1.5)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err  # preemption requeues any job: it starts over
    assert not (job.folder / f"{job.id}_requeue").exists()  # no checkpoint
    assert job.attempts()[0]["exit_code"] == 128 + signal.SIGUSR2


@pytest.mark.slow
def test_supervisor_counts_a_vanished_attempt_as_a_node_failure(tmp_path):
    job = Job(tmp_path, fnjobs.square, 3, budgets={"node_failure": 0})
    record = {"attempts": [{"n": 1, "state": "RUNNING", "start": 1.0}], "state": "RUNNING"}
    (job.folder / f"{job.id}_attempts.json").write_text(json.dumps(record))
    code, err = job.run()
    assert code == 1, err
    outcome, text = job.result()
    assert outcome == "error" and "node_failure budget exhausted" in text
    assert job.attempts()[0]["state"] == "NODE_FAIL"


@pytest.mark.slow
def test_supervisor_reports_a_step_that_died_without_a_result(tmp_path):
    job = Job(tmp_path, fnjobs.square, 3)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            executors.STEP,
            "supervise",
            "--config",
            json.dumps(job.config),
            "--",
            "sh",
            "-c",
            "exit 9",
        ],
        env=job.env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 9, proc.stderr
    outcome, text = job.result()
    assert outcome == "error" and "the step exited 9 without a result" in text


def test_render_submitit_shows_the_executor_of_a_job_spec(tmp_path):
    """`slurmkit render SPEC --submitit`: what slurmkit.executor() makes of a job spec, as
    JSON; the spec's own command is left out (the submitted function is the command)."""
    import json

    from conftest import run_cli

    spec = tmp_path / "job.yaml"
    spec.write_text("name: job\ncommand: x\nresources: {nodes: 2, gpus_per_node: 4}\n")
    proc = run_cli("render", str(spec), "--submitit", "resources.time=1:00:00", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["parameters"]["nodes"] == 2 and shown["parameters"]["gpus_per_node"] == 4
    assert shown["parameters"]["time"] == 60 and "cpus_per_task" not in shown["parameters"]
    assert shown["command"][-3:-1] == ["slurmkit.runtime.fnjob", "run"]
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("command: x\nparams: {a: [1, 2]}\n")
    refused = run_cli("render", str(sweep), "--submitit", cwd=tmp_path)
    assert refused.returncode == 2 and "params: not a setting of an executor" in refused.stderr
    both = run_cli("render", str(spec), "--submitit", "--plain", cwd=tmp_path)
    assert both.returncode == 2 and "do not go together" in both.stderr


@pytest.mark.slow
def test_supervisor_tells_a_container_that_did_not_start(tmp_path):
    job = Job(tmp_path, fnjobs.square, 3)
    log = job.folder / f"{job.id}_0_log.err"
    log.write_text("an earlier attempt's line: pyxis: couldn't start container\n")
    step = f"echo 'pyxis: couldn'\\''t start container' >> {log}; exit 1"
    argv = [sys.executable, "-m", executors.STEP, "supervise", "--config", json.dumps(job.config)]
    proc = subprocess.run([*argv, "--", "sh", "-c", step], env=job.env, capture_output=True)
    assert proc.returncode == 1, proc.stderr
    outcome, text = job.result()
    assert outcome == "error" and "its container did not start" in text
    assert job.attempts()[0]["cause"] == "container"
