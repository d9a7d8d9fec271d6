"""Requeue decisions (pure logic). The real sequences run in test_cluster_requeue.py; these
cover the branches a cluster cannot produce on demand (e.g. scontrol answering nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import datetime, timedelta

import pytest

from slurmkit.core.contract import REQUEUE_EXIT
from slurmkit.runtime import requeue

BUDGETS = {"preemption": None, "timeout": 3, "node_failure": 3, "error": 0}
NOW = datetime(2026, 11, 30, 12, 0, 0)


def info(**kw: str) -> dict[str, str]:
    base = {
        "JobState": "RUNNING",
        "Restarts": "0",
        "PreemptTime": "None",
        "EndTime": (NOW + timedelta(hours=1)).isoformat(),
        "TimeLimit": "01:00:00",
        "RunTime": "00:10:00",
    }
    return {**base, **kw}


@pytest.mark.parametrize(
    "signals,job,cause",
    [
        (["USR2"], info(EndTime=(NOW + timedelta(seconds=100)).isoformat()), "timeout"),
        (["USR2"], info(PreemptTime=NOW.isoformat()), "preemption"),
        (["USR2"], info(), "preemption"),  # scancel --batch --signal=USR2
        (["TERM"], info(JobState="COMPLETING", Restarts="1", EndTime="Unknown"), "preemption"),
        (["TERM"], info(JobState="COMPLETING", EndTime=NOW.isoformat()), None),  # scancel
        (["TERM"], info(JobState="COMPLETING", RunTime="01:00:00"), "timeout"),
        (["TERM"], info(JobState="NODE_FAIL"), "node_failure"),
        (["TERM"], info(JobState="IDLE", NodeState="DOWN+DRAIN"), "node_failure"),
        (["TERM"], info(JobState="PENDING", Restarts="1", NodeState="IDLE"), "node_failure"),
        (["TERM"], {}, "preemption"),  # scontrol unavailable
    ],
)
def test_classify(signals, job, cause):
    assert requeue.classify(signals, "USR2", job, 120, 0, now=NOW.timestamp()) == cause


def test_restart_count_at_start_is_the_baseline():
    job = info(JobState="COMPLETING", Restarts="2", EndTime=NOW.isoformat())
    assert requeue.classify(["TERM"], "USR2", job, 120, 2, now=NOW.timestamp()) is None


def test_decide_budgets_per_cause():
    assert requeue.decide(0, None, False, [], BUDGETS).state == "COMPLETED"
    out = requeue.decide(REQUEUE_EXIT, "timeout", True, [{"cause": "timeout"}] * 2, BUDGETS)
    assert (out.state, out.code, out.cause) == ("REQUEUED", REQUEUE_EXIT, "timeout")
    out = requeue.decide(REQUEUE_EXIT, "timeout", True, [{"cause": "timeout"}] * 3, BUDGETS)
    assert (out.state, out.cause) == ("FAILED", "timeout") and "budget exhausted (3" in out.reason
    assert out.code != REQUEUE_EXIT
    out = requeue.decide(REQUEUE_EXIT, "preemption", True, [{"cause": "preemption"}] * 50, BUDGETS)
    assert out.state == "REQUEUED"
    out = requeue.decide(3, None, False, [], BUDGETS)
    assert (out.state, out.code, out.cause, out.reason) == ("FAILED", 3, "error", "")
    out = requeue.decide(3, None, False, [], {**BUDGETS, "error": 1})
    assert (out.state, out.cause) == ("REQUEUED", "error")
    out = requeue.decide(143, None, True, [], BUDGETS)
    assert out.state == "CANCELLED" and out.code == 143


def test_a_cancelled_trial_that_checkpointed_is_not_requeued():
    """The trial handled SIGTERM, checkpointed and exited 75: the user cancelled, so the
    runtime must not pass 75 on (the batch shell would run `scontrol requeue`)."""
    out = requeue.decide(REQUEUE_EXIT, None, True, [], BUDGETS)
    assert out.state == "CANCELLED" and out.code != REQUEUE_EXIT and out.code == 143


def _sweep_with_vanished_attempt(tmp_path, spec_file, budget: int):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod
    from slurmkit.core.fsutil import atomic_write_json

    s = spec_mod.load(
        str(
            spec_file(
                f"command: [/bin/true]\nargs: none\nparams: {{a: [1]}}\n"
                f"requeue: {{budgets: {{node_failure: {budget}}}}}\n"
            )
        )
    )
    trials = plan.expand(s)
    import os

    sweep = store.create(plan.make(s, trials, os.getcwd()), str(tmp_path / "sweep"))
    os.makedirs(sweep.trial(trials[0].id))
    atomic_write_json(
        sweep.status(trials[0].id),
        {
            "id": trials[0].id,
            "index": 0,
            "state": "RUNNING",
            "attempts": [{"n": 1, "state": "RUNNING", "host": "n9", "start": 0}],
        },
    )
    return sweep, trials[0].id


def test_vanished_attempt_counts_as_node_failure(tmp_path, spec_file, monkeypatch):
    from slurmkit.core.fsutil import read_json
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    sweep, tid = _sweep_with_vanished_attempt(tmp_path, spec_file, budget=1)
    run = TrialRun(sweep, 0, under_slurm=True)
    run.start()
    assert run.wait() == 0
    status = read_json(sweep.status(tid))
    assert [(a["state"], a.get("cause")) for a in status["attempts"]] == [
        ("NODE_FAIL", "node_failure"),
        ("COMPLETED", None),
    ]


def test_node_failure_budget_spent_fails_without_running(tmp_path, spec_file, monkeypatch):
    from slurmkit.core.fsutil import read_json
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    sweep, tid = _sweep_with_vanished_attempt(tmp_path, spec_file, budget=0)
    run = TrialRun(sweep, 0, under_slurm=True)
    run.start()
    assert run.proc is None and run.wait() == 1
    status = read_json(sweep.status(tid))
    assert status["state"] == "FAILED" and status["cause"] == "node_failure"
    assert len(status["attempts"]) == 1


def test_preemption_flag_and_late_signals_are_ignored_at_exit():
    import subprocess
    import sys

    code = """
import atexit, os, signal
from slurmkit.runtime import preemption
preemption.install()
os.kill(os.getpid(), signal.SIGUSR2)
assert preemption.should_stop() and preemption.received() == ["SIGUSR2"]
atexit._run_exitfuncs()
# Python restores SIG_DFL for its own handlers while it finalizes; a late USR2 must not kill
# a run that has finished, so the exit hook leaves it ignored
assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_second_stop_signal_inside_the_first_handler_does_not_deadlock():
    """Slurm signals the process group and the runtime forwards the same signal: a handler can
    run inside another. A trace hook sends a new SIGTERM at every line the handler runs."""
    import subprocess
    import sys

    code = """
import os, signal, sys
from slurmkit.runtime import preemption
preemption.install()
sent = 0
def lines(frame, event, arg):
    global sent
    if event == "line" and sent < 40:
        sent += 1
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next check, in this one
    return lines
def calls(frame, event, arg):
    return lines if event == "call" else None
sys.settrace(calls)
os.kill(os.getpid(), signal.SIGTERM)
for _ in range(1000):
    pass
sys.settrace(None)
assert preemption.should_stop()
assert set(preemption.received()) == {"SIGTERM"} and len(preemption.received()) > 1, sent
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_requeued_by_slurm_reads_restarts():
    assert requeue.requeued_by_slurm({"Restarts": "2"}, 1)
    assert not requeue.requeued_by_slurm({"Restarts": "1"}, 1)
    assert not requeue.requeued_by_slurm({}, 0) and not requeue.requeued_by_slurm(
        {"Restarts": "x"}, 0
    )


def test_a_time_limit_requeues_only_a_trial_that_asked_for_it():
    """A command that ignores the stop signal (killed at the limit, 143) is not rerun from
    scratch three times; one that checkpointed and exited 75 is requeued."""
    out = requeue.decide(143, "timeout", True, [], BUDGETS)
    assert (out.state, out.code, out.cause) == ("TIMEOUT", 143, "timeout")
    assert "not requeued" in out.reason
    out = requeue.decide(REQUEUE_EXIT, "timeout", True, [], BUDGETS)
    assert out.state == "REQUEUED"
    out = requeue.decide(143, "preemption", True, [], BUDGETS)  # not the trial's doing
    assert out.state == "REQUEUED"


# What pyxis 0.2x and srun print when a task's container does not start (message texts as in
# pyxis's pyxis_slurmstepd.c and Slurm's srun; the prefixes as slurmstepd and `srun -l` add them).
CONTAINER_DID_NOT_START = [
    "slurmstepd: error: pyxis: couldn't start container",
    "0: slurmstepd: error: pyxis: container start failed with error code: 1",
    "slurmstepd: error: pyxis: failed to import docker image",
    "slurmstepd: error: pyxis: failed to create container filesystem",
    "slurmstepd: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1",
    "srun: unrecognized option '--container-image=nvcr.io#nvidia/pytorch:24.01-py3'",
]
CONTAINER_STARTED = [
    "pyxis: importing docker image: nvcr.io#nvidia/pytorch:24.01-py3",
    "pyxis: creating container filesystem: pyxis_42.0",
    "pyxis: starting container ...",
    "RuntimeError: couldn't start container-side dataloader",  # the trial's own words
    "srun: error: n3: task 0: Exited with exit code 1",
]


@pytest.mark.parametrize("line", CONTAINER_DID_NOT_START)
def test_a_container_that_did_not_start_is_told_apart(line):
    assert requeue.container_failed(f"=== slurmkit: trial ===\n{line}\nsrun: error: x\n")


@pytest.mark.parametrize("line", CONTAINER_STARTED)
def test_a_container_that_started_is_not_blamed(line):
    assert not requeue.container_failed(line)


def test_container_is_a_cause_of_its_own_with_no_requeue_by_default():
    budgets = {**BUDGETS, "container": 0, "error": 5}
    out = requeue.decide(1, "container", False, [], budgets)
    assert (out.state, out.code, out.cause) == ("FAILED", 1, "container")
    assert out.reason == "its container did not start (see its output.log)"
    out = requeue.decide(1, "container", False, [], {**budgets, "container": 1})
    assert (out.state, out.code, out.cause) == ("REQUEUED", REQUEUE_EXIT, "container")
    out = requeue.decide(1, None, False, [{"cause": "container"}], {**budgets, "container": 1})
    assert (out.state, out.cause) == ("REQUEUED", "error")  # the error budget is its own


@pytest.mark.parametrize("requeue_on", [True, False])
def test_a_trial_whose_container_did_not_start_fails_at_once(
    tmp_path, spec_file, monkeypatch, requeue_on
):
    """The step printed pyxis's failure and exited 1: FAILED with cause `container`, not
    requeued under the `error` budget (3 here). Without the container block it is an error."""
    from slurmkit.core.fsutil import read_json
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    sweep, tid = _sweep_with_vanished_attempt(tmp_path, spec_file, budget=1)
    os.unlink(sweep.status(tid))
    config = read_json(sweep.sweep_json)
    say = f'echo "{CONTAINER_DID_NOT_START[0]}" >&2; exit 1'
    config.update(
        command=["sh", "-c", say],
        container={"image": "nvcr.io#nvidia/pytorch:24.01-py3"},
        requeue={"enabled": requeue_on, "budgets": {**BUDGETS, "error": 3, "container": 0}},
    )
    for container, cause, code in ((True, "container", 1), (False, "error", REQUEUE_EXIT)):
        if not container:
            config.pop("container")
            os.unlink(sweep.status(tid))
        run = TrialRun(sweep, 0, config=config, under_slurm=True)
        run.start()
        got = run.wait()
        status = read_json(sweep.status(tid))
        if requeue_on:
            assert (got, status["state"], status["cause"]) == (
                code,
                "FAILED" if container else "REQUEUED",
                cause,
            )
        elif container:
            assert (got, status["state"], status["cause"]) == (1, "FAILED", "container")
        else:
            assert (got, status["state"], status.get("cause")) == (1, "FAILED", None)


def test_handles_reads_whether_a_process_catches_or_ignores_a_signal():
    import signal
    import subprocess
    import sys

    from slurmkit.runtime.attempt import handles

    ready = "import signal, sys, time; {}; print(flush=True); time.sleep(30)"
    setups = {
        "default": "pass",
        "caught": "signal.signal(signal.SIGUSR2, lambda *a: None)",
        "ignored": "signal.signal(signal.SIGUSR2, signal.SIG_IGN)",
        "blocked": "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})",  # srun's way
    }
    found = {}
    for name, setup in setups.items():
        with subprocess.Popen(
            [sys.executable, "-c", ready.format(setup)], stdout=subprocess.PIPE, text=True
        ) as proc:
            proc.stdout.readline()
            found[name] = (handles(proc.pid, signal.SIGUSR2), handles(proc.pid, signal.SIGUSR1))
            proc.kill()
    assert found == {
        "default": (False, False),
        "caught": (True, False),
        "ignored": (True, False),
        "blocked": (True, False),
    }
    assert handles(2**22 + 1, signal.SIGUSR2)  # no such process: sent as it comes


def _signalled_sweep(tmp_path, spec_file, command: list[str]):
    from slurmkit.core.fsutil import read_json

    sweep, tid = _sweep_with_vanished_attempt(tmp_path, spec_file, budget=1)
    os.unlink(sweep.status(tid))
    config = read_json(sweep.sweep_json)
    config.update(command=command, requeue={"enabled": True, "budgets": BUDGETS, "lead": 120})
    return sweep, tid, config


def _near_the_limit(_run) -> dict[str, str]:
    """Slurm's view of a job 100 s before its time limit (a timeout; see test_classify)."""
    end = datetime.now() + timedelta(seconds=100)
    return info(EndTime=end.strftime("%Y-%m-%dT%H:%M:%S"))


def test_the_requeue_signal_waits_until_the_trial_handles_it(tmp_path, spec_file, monkeypatch):
    """Sent at once it would kill a trial still starting (exit 140, TIMEOUT, no requeue); held,
    it arrives once the trial has installed its handler, which checkpoints and asks for a
    requeue. Slurm's answer is a stand-in: the cluster cannot time the signal to that window."""
    import signal
    import sys

    from slurmkit.core.fsutil import read_json
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setattr(TrialRun, "_job_info", _near_the_limit)
    late = (
        "import signal, sys, time; time.sleep(0.3); got = []; "
        "signal.signal(signal.SIGUSR2, lambda *a: got.append(1)); "
        "[time.sleep(0.01) for _ in range(500) if not got]; sys.exit(75 if got else 9)"
    )
    sweep, tid, config = _signalled_sweep(tmp_path, spec_file, [sys.executable, "-c", late])
    run = TrialRun(sweep, 0, config=config, under_slurm=True)
    run.start()
    run.terminate(signal.SIGUSR2)
    assert run.wait() == REQUEUE_EXIT
    status = read_json(sweep.status(tid))
    assert (status["state"], status["cause"]) == ("REQUEUED", "timeout")
    assert status["attempts"][0]["signals"] == ["USR2"]


def test_a_stop_signal_before_the_command_starts_ends_the_attempt_unstarted(
    tmp_path, spec_file, monkeypatch
):
    import signal

    from slurmkit.core.fsutil import read_json
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setattr(TrialRun, "_job_info", _near_the_limit)
    marker = tmp_path / "ran"
    sweep, tid, config = _signalled_sweep(tmp_path, spec_file, ["touch", str(marker)])
    run = TrialRun(sweep, 0, config=config, under_slurm=True)
    run.terminate(signal.SIGUSR2)
    run.start()
    assert run.proc is None and run.wait() == REQUEUE_EXIT and not marker.exists()
    status = read_json(sweep.status(tid))
    assert (status["state"], status["cause"]) == ("REQUEUED", "timeout")
    with open(sweep.output(tid)) as log:
        assert "USR2 came before the command started" in log.read()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_signals_while_the_runtime_starts_are_kept_for_its_trial():
    """`python -m slurmkit.runtime` holds them from before its imports; once its trial is
    ready they reach the trial's handler, in order, and later ones go straight to it."""
    proc = _python("""
import os, signal
from slurmkit.runtime import early
early.hold()
os.kill(os.getpid(), signal.SIGTERM)  # as if sent while the runtime imports
os.kill(os.getpid(), signal.SIGUSR2)
got = []
early.release(got.append, {signal.SIGTERM, signal.SIGUSR2})
assert got == [signal.SIGTERM, signal.SIGUSR2], got
os.kill(os.getpid(), signal.SIGUSR2)
assert got[2:] == [signal.SIGUSR2], got
assert signal.getsignal(signal.SIGXCPU) == signal.SIG_DFL  # held, not asked for: as before
""")
    assert proc.returncode == 0, proc.stderr


def test_a_held_signal_that_is_no_stop_signal_acts_as_it_would_have():
    proc = _python("""
import os, signal
from slurmkit.runtime import early
early.hold()
os.kill(os.getpid(), signal.SIGHUP)
early.release(print, {signal.SIGTERM})
print("still here")
""")
    assert proc.returncode == -signal.SIGHUP and "still here" not in proc.stdout


def test_release_without_hold_leaves_the_processes_other_handlers_alone():
    """The submitit backend's task calls run_trial in submitit's process: its own handlers stay."""
    proc = _python("""
import signal
from slurmkit.runtime import early
mine = lambda *a: None
signal.signal(signal.SIGUSR1, mine)
early.release(print, {signal.SIGTERM})
assert signal.getsignal(signal.SIGUSR1) is mine
""")
    assert proc.returncode == 0, proc.stderr


def test_a_signal_inside_the_start_up_handler_is_kept_too():
    """Slurm and the batch shell may both send one: a handler can run inside itself."""
    proc = _python("""
import os, signal, sys
from slurmkit.runtime import early
early.hold()
sent = 0
def lines(frame, event, arg):
    global sent
    if event == "line" and sent < 40:
        sent += 1
        os.kill(os.getpid(), signal.SIGTERM)
    return lines
sys.settrace(lambda frame, event, arg: lines if event == "call" else None)
os.kill(os.getpid(), signal.SIGTERM)
for _ in range(1000):
    pass
sys.settrace(None)
got = []
early.release(got.append, {signal.SIGTERM})
assert len(got) > 1 and set(got) == {signal.SIGTERM}, got
""")
    assert proc.returncode == 0, proc.stderr


def test_a_request_for_requeue_reaches_the_runtime_through_a_launcher_that_exits_1(
    tmp_path, spec_file, monkeypatch
):
    """torchrun exits 1 when a worker exits 75: `preemption.exit_for_requeue()` also leaves a
    mark for the attempt, which the runtime reads (and removes)."""
    import sys

    from slurmkit.core.contract import requeue_mark
    from slurmkit.core.fsutil import read_json
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    worker = "from slurmkit.runtime import preemption; preemption.exit_for_requeue()"
    launcher = ["sh", "-c", '"$@"; exit 1', "torchrun", sys.executable, "-c", worker]
    sweep, tid, config = _signalled_sweep(tmp_path, spec_file, launcher)
    run = TrialRun(sweep, 0, config=config, under_slurm=True)
    run.start()
    assert run.wait() == REQUEUE_EXIT
    status = read_json(sweep.status(tid))
    assert status["state"] == "REQUEUED" and not os.path.exists(requeue_mark(run.dir, 1))
    config["command"] = ["sh", "-c", "exit 1"]  # the next attempt fails of its own: no mark
    run = TrialRun(sweep, 0, config=config, under_slurm=True)
    run.start()
    assert run.wait() == 1 and read_json(sweep.status(tid))["state"] == "FAILED"


def test_signals_held_before_an_exec_are_handed_to_the_runtime():
    """`python -m slurmkit.standalone` holds signals while it builds the sweep directory, then
    execs the runtime: what came by then goes on through SLURMKIT_HELD_SIGNALS."""
    proc = _python("""
import os, signal, subprocess, sys
from slurmkit.runtime import early
early.hold()
os.kill(os.getpid(), signal.SIGUSR2)
env = {**os.environ, early.ENV_HELD: early.handover()}
after = '''
import os, signal
from slurmkit.runtime import early
early.hold()
assert early.ENV_HELD not in os.environ
got = []
early.release(got.append, {signal.SIGTERM, signal.SIGUSR2})
assert got == [signal.SIGUSR2], got
'''
sys.exit(subprocess.run([sys.executable, "-c", after], env=env).returncode)
""")
    assert proc.returncode == 0, proc.stderr
