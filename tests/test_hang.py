"""The hang watchdog: its decision (runtime/hang.py), the progress its trials leave
(runtime/progress.py: heartbeat(), report(), a committed checkpoint), a hung trial ended with
its stacks on the local backend, a trial that keeps reporting left alone, and `logs --hang`."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmkit.runtime import hang, progress

# --- the decision -------------------------------------------------------------------------------

times = st.lists(st.floats(0, 1e6, allow_nan=False), max_size=30).map(sorted)
settings = st.one_of(st.none(), st.integers(0, 10_000))


@given(settings, st.floats(0, 2e6, allow_nan=False))
def test_an_attempt_that_never_made_progress_is_never_hung(setting, now):
    assert not hang.hung(setting, [], now)


@given(times, st.floats(0, 2e6, allow_nan=False))
def test_hang_timeout_0_is_off(events, now):
    assert hang.limit(0, events) is None and not hang.hung(0, events, now)


@given(st.integers(1, 10_000), times.filter(bool), st.floats(0, 1e5, allow_nan=False))
def test_an_explicit_timeout_counts_from_the_last_progress(setting, events, wait):
    assert hang.hung(setting, events, events[-1] + wait) == (wait > setting)


@given(times, st.floats(0, 1e7, allow_nan=False))
def test_auto_waits_for_five_reports_then_takes_10_median_intervals_and_5_minutes(events, wait):
    seconds = hang.limit(None, events)
    if len(events) < hang.AUTO_AFTER:
        assert seconds is None
        assert not hang.hung(None, events, (events[-1] if events else 0) + wait)
        return
    gaps = sorted(b - a for a, b in itertools.pairwise(events))
    assert seconds is not None and seconds >= hang.AUTO_FLOOR
    assert seconds >= hang.AUTO_FACTOR * gaps[(len(gaps) - 1) // 2]  # the lower median or more
    assert seconds <= max(hang.AUTO_FACTOR * gaps[len(gaps) // 2], hang.AUTO_FLOOR)


@given(
    settings,
    st.floats(0.01, 1e4, allow_nan=False),
    st.integers(1, 40),
    st.floats(0, 1, allow_nan=False),
)
def test_a_trial_that_keeps_reporting_is_never_hung(setting, gap, count, late):
    """Reports every ``gap`` s (at most as far apart as an explicit timeout): at any moment
    before its next report is due, it is not hung, however slow it is."""
    if setting is not None and setting and gap > setting:
        gap = float(setting)
    events = [i * gap for i in range(count)]
    assert not hang.hung(setting, events, events[-1] + late * gap)


# --- the watchdog's view of the progress files --------------------------------------------------


def touch(path: Path, at: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.utime(path, (at, at))


def test_the_watchdog_reads_each_ranks_progress_since_the_attempt_started(tmp_path):
    where = tmp_path / progress.DIRNAME
    touch(where / "0", 90.0)  # an earlier attempt's
    dog = hang.Watchdog(str(tmp_path), 20, start=100.0)
    assert not dog.check(now=100.5) and dog.record() == {}  # no progress yet: never hung
    touch(where / "0", 101.0)
    touch(where / "1", 103.0)
    touch(where / progress.CHECKPOINT, 102.0)
    touch(where / "0-77.stacks", 103.0)  # not progress
    assert not dog.check(now=104.0)
    touch(where / "0", 110.0)
    assert not dog.check(now=104.5)  # looks once a second
    assert not dog.check(now=129.0)
    assert dog.events == [103.0, 110.0] and dog.declared is None
    assert dog.check(now=130.5) and dog.declared == 130.5
    assert not dog.check(now=140.0)  # declared once
    assert dog.record("hang-2.txt") == {
        "first_progress": 101.0,
        "last_progress": 110.0,
        "last_checkpoint": 102.0,
        "hang": {
            "last_progress": 110.0,
            "declared": 130.5,
            "timeout": 20.0,
            "file": "hang-2.txt",
            "ranks": {"0": 110.0, "1": 103.0},
        },
    }


def test_the_hang_file_labels_each_ranks_stacks(tmp_path):
    dog = hang.Watchdog(str(tmp_path), 20, start=0.0)
    dog.events, dog.declared, dog.timeout = [5.0], 30.0, 20.0
    dog.seen = progress.Progress(ranks={"0": 5.0, "1": 4.0})
    dumps = [
        progress.Dump("0", "n1", 11, 3, "  File 'a.py', line 1 in all_reduce\n"),
        progress.Dump("1", "n2", 12, 3, "  File 'a.py', line 2 in stuck\n"),
    ]
    out = tmp_path / "hang-1.txt"
    hang.write(str(out), dog, dumps, "noise\nFatal Python error: Aborted\n  File 'b.py'\n")
    text = out.read_text()
    assert "no progress for 20 s" in text and "rank 1: last progress" in text
    assert "=== rank 0 (node n1, pid 11) ===\n  File 'a.py', line 1 in all_reduce" in text
    assert "=== rank 1 (node n2, pid 12) ===" in text
    # a third rank left no stacks of its own: its faulthandler block from the output follows
    assert text.endswith("Fatal Python error: Aborted\n  File 'b.py'\n") and "noise" not in text
    hang.write(str(out), dog, [*dumps[:1], dataclasses.replace(dumps[1], world=2)], "")
    assert "from the output" not in out.read_text()


# --- what the trial leaves: heartbeat(), report(), a checkpoint ------------------------------


@pytest.fixture
def in_trial(tmp_path, monkeypatch):
    """This process as rank 3 of a trial in tmp_path (the module's state fresh, and restored)."""
    monkeypatch.setenv("SLURMKIT_TRIAL_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    for name, value in (("_next", 0.0), ("_path", None), ("_stacks", None)):
        monkeypatch.setattr(progress, name, value)
    yield tmp_path / progress.DIRNAME
    if progress._stacks is not None:
        import faulthandler

        faulthandler.unregister(progress.dump_signal(os.environ.get("SLURMKIT_REQUEUE_SIGNAL")))
        progress._stacks.close()


def test_heartbeat_touches_the_ranks_file_at_most_once_a_second(in_trial, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    progress.heartbeat()
    assert os.stat(in_trial / "3").st_mtime == 1000.0
    clock[0] = 1000.5
    progress.heartbeat()
    assert os.stat(in_trial / "3").st_mtime == 1000.0
    clock[0] = 1001.2
    progress.heartbeat()
    assert os.stat(in_trial / "3").st_mtime == 1001.2
    head = (in_trial / f"3-{os.getpid()}.stacks").read_text().split()
    assert head[-3:-1] == [os.uname().nodename, str(os.getpid())]


def test_report_and_a_committed_checkpoint_are_progress(in_trial):
    from slurmkit.runtime.checkpoint import CheckpointDir
    from slurmkit.runtime.report import report

    start = time.time() - 1
    report(loss=1.0)
    CheckpointDir(in_trial.parent / "ckpt").save(7, {"w": 1}, "pickle")
    seen = progress.read(str(in_trial), start)
    assert set(seen.ranks) == {"3"} and seen.checkpoint is not None
    assert seen.last == max(seen.checkpoint, seen.ranks["3"])


def test_the_dump_signal_leaves_a_requeue_signal_of_urg_alone():
    assert progress.dump_signal("USR2") == progress.dump_signal(None) == signal.SIGURG
    assert progress.dump_signal("URG") == signal.SIGWINCH  # both ignored by default


def test_outside_a_trial_heartbeat_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURMKIT_TRIAL_DIR", raising=False)
    monkeypatch.setattr(progress, "_next", 0.0)
    monkeypatch.setattr(progress, "_path", None)
    monkeypatch.chdir(tmp_path)
    import slurmkit

    slurmkit.heartbeat()
    progress.checkpointed()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["its step", "its pid on its node"])
def test_a_rank_that_armed_dumps_its_stacks_when_signalled(tmp_path, how):
    code = (
        "import sys, time, slurmkit\n"
        "def waiting_here():\n"
        "    print('ready', flush=True); time.sleep(30)\n"
        "waiting_here()\n"
    )
    env = {**os.environ, "SLURMKIT_TRIAL_DIR": str(tmp_path), "SLURM_PROCID": "5"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        if how == "its step":
            hang.signal_step(progress.DUMP_SIGNAL, proc.pid, None, group=False)
        else:  # what each node runs for the processes a step's signal did not reach
            where = tmp_path / progress.DIRNAME
            deadline = time.monotonic() + 10
            while not progress.dumps(str(where), 0):  # armed at import, before "ready"
                assert time.monotonic() < deadline
            env_node = {"SLURMD_NODENAME": progress.dumps(str(where), 0)[0].node}
            with pytest.MonkeyPatch.context() as mp:
                for k, v in env_node.items():
                    mp.setenv(k, v)
                assert hang.main([str(int(progress.DUMP_SIGNAL)), str(where), "0"]) == 0
        deadline = time.monotonic() + 10
        while not (found := progress.dumps(str(tmp_path / progress.DIRNAME), 0)[0].text):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "waiting_here" in found and proc.poll() is None  # it dumped, and runs on
    finally:
        proc.kill()
        proc.wait()
    dump = progress.dumps(str(tmp_path / progress.DIRNAME), 0)[0]
    assert (dump.rank, dump.pid) == ("5", proc.pid)


# --- a trial on the local backend ---------------------------------------------------------------

HUNG = """
import time, slurmkit
for i in range(3):
    slurmkit.report(step=i)
    time.sleep(0.1)
def stuck_here():
    time.sleep(60)
stuck_here()
"""


def trial_run(tmp_path: Path, spec_file, code: str, hang_timeout: int):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod
    from slurmkit.runtime.trial import TrialRun

    script = tmp_path / "t.py"
    script.write_text(code)
    s = spec_mod.load(
        str(spec_file(f"command: [{sys.executable}, {script}]\nparams: {{a: [1]}}\n"))
    )
    sweep = store.create(plan.make(s, plan.expand(s), os.getcwd()), str(tmp_path / "sweep"))
    run = TrialRun(sweep, 0)
    run.config = dataclasses.replace(
        run.config, requeue=dataclasses.replace(run.config.requeue, hang_timeout=hang_timeout)
    )
    run.policy = run.config.requeue
    return run


def test_a_hung_trial_ends_failed_with_its_stacks_outside_the_requeue_policy(tmp_path, spec_file):
    run = trial_run(tmp_path, spec_file, HUNG, hang_timeout=1)
    run.start()
    code = run.wait()
    attempt = run.status["attempts"][-1]
    assert (run.status["state"], run.status["cause"]) == ("FAILED", "hang")
    assert code == 128 + signal.SIGABRT and "no progress for 1 s" in run.status["reason"]
    assert attempt["hang"]["file"] == "hang-1.txt" and attempt["hang"]["ranks"].keys() == {"0"}
    assert attempt["hang"]["nodes"] == {os.uname().nodename: attempt["hang"]["ranks"]["0"]}
    assert attempt["first_progress"] <= attempt["last_progress"] == attempt["hang"]["last_progress"]
    text = (Path(run.dir) / "hang-1.txt").read_text()
    assert "=== rank 0 " in text and "stuck_here" in text

    from click.testing import CliRunner

    from slurmkit.cliops import logs

    shown = CliRunner().invoke(logs, [run.sweep.root, "0", "--hang"])
    assert shown.exit_code == 0 and "stuck_here" in shown.output


def test_logs_hang_of_a_trial_that_never_hung_says_so(tmp_path, spec_file):
    from click.testing import CliRunner

    from slurmkit.cliops import logs

    run = trial_run(tmp_path, spec_file, "", hang_timeout=0)
    shown = CliRunner().invoke(logs, [run.sweep.root, "0", "--hang"])
    assert shown.exit_code == 2 and "no attempt of it was declared hung" in shown.output


@pytest.mark.slow
def test_a_slow_trial_that_keeps_reporting_is_never_killed(tmp_path, spec_file):
    code = (
        "import time, slurmkit\nfor i in range(8):\n    slurmkit.heartbeat()\n    time.sleep(0.8)\n"
    )
    run = trial_run(tmp_path, spec_file, code, hang_timeout=3)
    run.start()
    assert run.wait() == 0 and run.status["state"] == "COMPLETED"
    assert "hang" not in run.status["attempts"][-1]


@pytest.mark.slow
def test_a_trial_that_never_reports_is_never_declared_hung(tmp_path, spec_file):
    run = trial_run(tmp_path, spec_file, "import time\ntime.sleep(4)\n", hang_timeout=1)
    run.start()
    assert run.wait() == 0 and run.status["state"] == "COMPLETED"
    attempt = run.status["attempts"][-1]
    assert not {"hang", "first_progress", "last_progress"} & attempt.keys()


def test_the_spec_reads_hang_timeout_as_seconds_or_a_slurm_time(spec_file):
    from slurmkit import spec as spec_mod
    from slurmkit.errors import SpecError

    def read(value: str) -> int | None:
        text = "command: [t]\nparams: {a: [1]}\n" + (f"requeue: {{hang_timeout: {value}}}\n")
        return spec_mod.load(str(spec_file(text))).requeue.hang_timeout

    assert [read("20"), read("'10:00'"), read("0"), read("null")] == [20, 600, 0, None]
    for bad, words in (("3", "at least 5 s"), ("-1", "expected seconds"), ("'x'", "Slurm time")):
        with pytest.raises(SpecError, match="requeue.hang_timeout") as err:
            read(bad)
        assert words in str(err.value) + (err.value.hint or "")
    contract = json.loads(json.dumps({"requeue": {"hang_timeout": 20}}))
    from slurmkit.core.jobcontract import JobContract

    assert JobContract.from_dict(contract, "x").requeue.hang_timeout == 20
