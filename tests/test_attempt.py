"""The attempt supervisor (runtime/attempt.py) under both its users, and the job contract
(core/jobcontract.py) that the login side writes and every in-job entry point reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from slurmkit.core.contract import DEFAULT_SIGNAL, REQUEUE_EXIT
from slurmkit.core.fsutil import Damaged
from slurmkit.core.jobcontract import (
    DEFAULT_BUDGETS,
    DEFAULT_LEAD,
    NO_REQUEUE,
    JobContract,
    Policy,
)
from slurmkit.runtime import attempt as attempt_mod
from slurmkit.runtime.fnjob import Supervisor

# --- the job contract ---------------------------------------------------------------------------


def test_the_spec_and_the_contract_share_the_requeue_defaults():
    from slurmkit.spec.model import Requeue

    spec, job = Requeue(), Policy()
    assert (spec.signal, spec.lead, spec.budgets) == (job.signal, job.lead, dict(job.budgets))
    assert (job.signal, job.lead, dict(job.budgets)) == (
        DEFAULT_SIGNAL,
        DEFAULT_LEAD,
        dict(DEFAULT_BUDGETS),
    )


def test_a_contract_written_by_an_earlier_slurmkit_takes_the_defaults():
    """Keys that an earlier version did not write read as their defaults."""
    old = JobContract.from_dict({"command": ["python", "t.py"]}, "sweep.json")
    assert old.command == ("python", "t.py") and old.requeue == NO_REQUEUE
    assert (old.args, old.stderr, old.data, old.launch, old.tasks) == ("hydra", "merged", (), {}, 1)
    policy = JobContract.from_dict({"requeue": {"enabled": True}}, "x").requeue
    assert policy == Policy()
    some = JobContract.from_dict({"requeue": {"budgets": {"error": 2}}}, "x").requeue
    assert dict(some.budgets) == {**DEFAULT_BUDGETS, "error": 2}
    assert JobContract.from_dict({"requeue": {"signal": "sigusr1"}}, "x").requeue.signal == "USR1"


def test_what_the_login_side_writes_reads_back_as_the_contract(tmp_path, spec_file):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod

    s = spec_mod.load(
        str(
            spec_file(
                "command: [python, t.py]\nargs: argparse\nparams: {a: [1]}\n"
                "env_runtime: {SCRATCH: '/s/{job_id}'}\nlogs: {stderr: separate}\n"
                "requeue: {signal: USR1, lead: 60, budgets: {error: 1}}\n"
            )
        )
    )
    written = json.loads(json.dumps(store.sweep_config(plan.make(s, plan.expand(s), "/sub"))))
    got = JobContract.from_dict(written, "sweep.json")
    assert got.command == ("python", "t.py") and got.args == "argparse"
    assert got.env_runtime == {"SCRATCH": "/s/{job_id}"} and got.stderr == "separate"
    assert got.submit_dir == "/sub"
    assert got.requeue == Policy(True, "USR1", 60, {**DEFAULT_BUDGETS, "error": 1})
    assert JobContract.from_dict(json.loads(json.dumps(got.to_dict())), "x") == got


def test_the_function_supervisors_config_is_the_contract(tmp_path):
    from slurmkit import executors

    spec = {
        "name": "job",
        "resources": {"nodes": 2, "tasks_per_node": 4},
        "requeue": {"signal": "USR1", "lead": 90},
        "env_runtime": {"SCRATCH": "/s/{job_id}"},
    }
    cfg = executors.executor_config(spec, (f"output_root={tmp_path}",))
    got = JobContract.from_dict(json.loads(json.dumps(cfg["supervise"])), "--config")
    assert (got.tasks, got.folder, got.env_runtime) == (8, cfg["folder"], spec["env_runtime"])
    assert got.requeue == Policy(True, "USR1", 90, dict(DEFAULT_BUDGETS))


@pytest.mark.parametrize(
    "raw,words",
    [
        ([], "sweep.json: not a JSON object but list"),
        (None, "sweep.json: missing"),
        ({"requeue": "yes"}, "sweep.json: requeue: expected a mapping, got str 'yes'"),
        ({"requeue": {"signal": "KILL"}}, "sweep.json: requeue.signal: 'KILL' is not one of"),
        ({"requeue": {"lead": "2m"}}, "sweep.json: requeue.lead: expected seconds, got str '2m'"),
        ({"requeue": {"enabled": "no"}}, "sweep.json: requeue.enabled: expected true or false"),
        ({"requeue": {"budgets": {"error": "x"}}}, "sweep.json: requeue.budgets: expected counts"),
        ({"command": "python t.py"}, "sweep.json: command: expected a list of arguments"),
        ({"env": {"A": 1}}, "sweep.json: env: expected a mapping of names to strings"),
        ({"launch": {"step": "srun"}}, "sweep.json: command and launch: expected lists"),
        ({"data": [1]}, "sweep.json: data: expected a list of mappings"),
        ({"tasks": True}, "sweep.json: tasks: expected a task count, got bool True"),
    ],
)
def test_a_damaged_contract_names_the_file_and_the_key(raw, words):
    with pytest.raises(Damaged) as caught:
        JobContract.from_dict(raw, "sweep.json")
    assert str(caught.value).startswith(words)


def test_a_task_of_a_sweep_with_a_damaged_contract_says_why_and_exits_2(
    tmp_path, spec_file, capsys
):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod
    from slurmkit.runtime.__main__ import run_trial

    s = spec_mod.load(str(spec_file("command: [/bin/true]\nargs: none\nparams: {a: [1]}\n")))
    sweep = store.create(plan.make(s, plan.expand(s), os.getcwd()), str(tmp_path / "sweep"))
    config = json.loads(Path(sweep.sweep_json).read_text())
    Path(sweep.sweep_json).write_text(json.dumps({**config, "requeue": "yes"}))
    assert run_trial(sweep.root, 0) == 2
    assert "sweep.json: requeue: expected a mapping" in capsys.readouterr().err


def test_the_function_supervisor_refuses_a_damaged_config():
    from slurmkit.runtime import fnjob

    proc = subprocess.run(
        [sys.executable, "-m", "slurmkit.runtime.fnjob", "supervise", "--config", "[]", "--", "x"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "--config: not a JSON object but list" in proc.stderr
    assert "Traceback" not in proc.stderr and fnjob.main  # the module's entry point


# --- the attempt supervisor: what holds for both ------------------------------------------------

NOW = datetime.now()


def _near_the_limit(_self) -> dict[str, str]:
    """Slurm's view of a job 100 s before its time limit (a timeout)."""
    end = datetime.now() + timedelta(seconds=100)
    return {
        "JobState": "RUNNING",
        "Restarts": "0",
        "PreemptTime": "None",
        "EndTime": end.strftime("%Y-%m-%dT%H:%M:%S"),
        "TimeLimit": "01:00:00",
        "RunTime": "00:10:00",
    }


LATE_HANDLER = (
    "import signal, sys, time; time.sleep(0.3); got = []; "
    "signal.signal(signal.SIGUSR2, lambda *a: got.append(1)); "
    "[time.sleep(0.01) for _ in range(500) if not got]; sys.exit(75 if got else 9)"
)


@pytest.fixture
def supervisor(tmp_path, monkeypatch):
    """A function job's supervisor under the requeue policy, Slurm's answer a stand-in."""
    pytest.importorskip("submitit")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.setattr(Supervisor, "_job_info", _near_the_limit)

    def make(argv: list[str]) -> Supervisor:
        config = JobContract(requeue=Policy(), folder=str(tmp_path / "jobs"))
        return Supervisor(config, argv)

    return make


def test_the_function_supervisor_holds_the_requeue_signal_until_the_step_handles_it(supervisor):
    """As the trial runtime does (test_the_requeue_signal_waits_until_the_trial_handles_it):
    sent at once, USR2 would kill the step while it starts (exit 140, no requeue)."""
    sup = supervisor([sys.executable, "-c", LATE_HANDLER])
    assert sup.begin() is None and sup.start()
    sup.terminate(signal.SIGUSR2)
    assert sup.finish(sup.wait_step()) == REQUEUE_EXIT
    [done] = sup.record["attempts"]
    assert (done["state"], done["cause"], done["exit_code"]) == ("REQUEUED", "timeout", 75)
    assert done["signals"] == ["USR2"] and "EndTime" in done["slurm"]  # the evidence, as a trial's


def test_the_function_supervisor_ends_an_attempt_unstarted_when_a_stop_came_first(
    supervisor, tmp_path
):
    """As the trial runtime does (test_a_stop_signal_before_the_command_starts_ends_...)."""
    ran = tmp_path / "ran"
    sup = supervisor(["touch", str(ran)])
    assert sup.begin() is None
    sup.terminate(signal.SIGUSR2)
    assert not sup.start() and sup.proc is None
    assert sup.finish(REQUEUE_EXIT) == REQUEUE_EXIT and not ran.exists()
    assert sup.record["attempts"][0]["cause"] == "timeout"


def test_signals_while_the_function_supervisor_starts_are_kept_for_its_attempt(tmp_path):
    """`python -m slurmkit.runtime.fnjob supervise` holds them from its start (early.hold), as
    `python -m slurmkit.runtime` does; here a TERM before the step: it never starts."""
    pytest.importorskip("submitit")
    ran = tmp_path / "ran"
    code = textwrap.dedent(f"""
        import os, signal, sys
        from slurmkit.runtime import early
        early.hold()
        os.kill(os.getpid(), signal.SIGTERM)
        from slurmkit.core.jobcontract import JobContract, Policy
        from slurmkit.runtime import fnjob
        fnjob.Supervisor._job_info = lambda self: {{"JobState": "RUNNING", "PreemptTime": "x"}}
        config = JobContract(requeue=Policy(), folder={str(tmp_path / "jobs")!r})
        sys.exit(fnjob.supervise(config, ["touch", {str(ran)!r}]))
    """)
    env = {**os.environ, "SLURM_JOB_ID": "4242"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == REQUEUE_EXIT, proc.stderr  # preemption: requeued, unstarted
    assert "TERM came before the command started" in proc.stderr and not ran.exists()


@pytest.mark.parametrize("user", ["trial", "function"])
def test_a_stop_signal_while_the_step_starts_follows_it(tmp_path, monkeypatch, user, spec_file):
    """A TERM that comes while Popen runs (the step has no pid yet) reaches the step after."""
    real = subprocess.Popen
    if user == "function":
        pytest.importorskip("submitit")
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        config = JobContract(folder=str(tmp_path / "jobs"))
        run: attempt_mod.Attempt = Supervisor(config, ["sleep", "30"])
        assert run.begin() is None  # type: ignore[attr-defined]
    else:
        from slurmkit import plan, store
        from slurmkit import spec as spec_mod
        from slurmkit.runtime.trial import TrialRun

        s = spec_mod.load(str(spec_file("command: [sleep, '30']\nargs: none\nparams: {a: [1]}\n")))
        sweep = store.create(plan.make(s, plan.expand(s), os.getcwd()), str(tmp_path / "sweep"))
        run = TrialRun(sweep, 0)

    def popen(*args, **kwargs):
        run.terminate(signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(attempt_mod.subprocess, "Popen", popen)
    run.start()
    monkeypatch.setattr(attempt_mod.subprocess, "Popen", real)
    start = time.monotonic()
    assert run.wait_step() == 128 + signal.SIGTERM and time.monotonic() - start < 20


# --- the function step: fncall's exit ------------------------------------------------------------

STUBBORN = """
import time
class Stubborn:
    def __init__(self, ready):
        self.ready = ready
    def checkpoint(self, **kwargs):
        return (Stubborn(self.ready), (), kwargs)
    def __call__(self, **kwargs):
        open(self.ready, "w").close()
        while True:
            try:
                time.sleep(0.02)
            except BaseException:  # a retry loop that swallows everything
                pass
"""


def test_a_function_trial_that_swallows_every_exception_still_exits_for_its_requeue(tmp_path):
    """Why fncall's handler ends the process with os._exit: a SystemExit raised inside the
    callable is the callable's to catch."""
    import pickle

    (tmp_path / "stubborn.py").write_text(STUBBORN)
    sys.path.insert(0, str(tmp_path))
    try:
        import stubborn  # type: ignore[import-not-found]

        sweep, trial = tmp_path / "sweep", tmp_path / "trial"
        sweep.mkdir()
        trial.mkdir()
        ready = tmp_path / "ready"
        (sweep / "function.pkl").write_bytes(pickle.dumps(stubborn.Stubborn(str(ready))))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("stubborn", None)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "SLURMKIT_SWEEP_DIR": str(sweep),
        "SLURMKIT_TRIAL_DIR": str(trial),
        "SLURMKIT_PARAMS": "{}",
    }
    with subprocess.Popen([sys.executable, "-m", "slurmkit.runtime.fncall"], env=env) as proc:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        proc.send_signal(signal.SIGUSR2)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == REQUEUE_EXIT and (trial / "checkpoint.pkl").exists()


# --- the attempt supervisor: deliberately different -------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("user", ["trial", "function"])
def test_outside_slurm_a_trials_stop_reaches_its_tree_a_function_jobs_step_its_process(
    tmp_path, monkeypatch, spec_file, user
):
    """The trial's command has a process group of its own there (stopping it stops what it
    started); the function job's step is signalled as one process (under Slurm it is srun,
    which passes the signal on to its tasks)."""
    pidfile = tmp_path / "pid"
    step = ["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"]
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    if user == "function":
        pytest.importorskip("submitit")
        run: attempt_mod.Attempt = Supervisor(JobContract(folder=str(tmp_path / "jobs")), step)
        assert run.begin() is None  # type: ignore[attr-defined]
    else:
        from slurmkit import plan, store
        from slurmkit import spec as spec_mod
        from slurmkit.runtime.trial import TrialRun

        text = f"command: [sh, -c, 'sleep 30 & echo $! > {pidfile}; wait']\nargs: none\n"
        s = spec_mod.load(str(spec_file(text + "params: {a: [1]}\n")))
        sweep = store.create(plan.make(s, plan.expand(s), os.getcwd()), str(tmp_path / "sweep"))
        run = TrialRun(sweep, 0)
    run.start()
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sleeper = int(pidfile.read_text())
    run.terminate(signal.SIGTERM)
    assert run.wait_step() == 128 + signal.SIGTERM
    try:
        deadline = time.monotonic() + 5
        while _alive(sleeper) and user == "trial" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _alive(sleeper) == (user == "function")
    finally:
        if _alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


def test_outside_the_policy_a_function_job_whose_container_did_not_start_says_so(
    tmp_path, monkeypatch
):
    """As a trial does (test_a_trial_whose_container_did_not_start_fails_at_once, requeue off):
    FAILED with cause `container`, where the function supervisor said FAILED with none."""
    pytest.importorskip("submitit")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    folder = tmp_path / "jobs"
    folder.mkdir()
    log = folder / "0_0_log.err"
    say = f"echo 'pyxis: couldn'\\''t start container' >> {log}; exit 1"
    sup = Supervisor(JobContract(folder=str(folder)), ["sh", "-c", say])
    assert sup.begin() is None and sup.start()
    assert sup.finish(sup.wait_step()) == 1
    [done] = sup.record["attempts"]
    assert (done["state"], done["cause"]) == ("FAILED", "container")
