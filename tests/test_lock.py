"""The sweep directory's lock: exclusive across processes, says who holds it, recovers from a
stale lock without ever letting two holders in, and `slurmkit unlock` breaks it by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PAYLOAD, local_sweep, run_cli

from slurmkit.core.lock import LOCK_NAME, Lock, LockBusy, read, unlock

# A process that takes the lock ROUNDS times and adds one to a counter file while holding it.
COUNTER = """
import sys, time
from slurmkit.core.lock import Lock
directory, rounds = sys.argv[1], int(sys.argv[2])
for _ in range(rounds):
    lock = Lock(directory, stale_after=30)
    lock.acquire("count", wait=60)
    path = directory + "/counter"
    n = int(open(path).read())
    time.sleep(0.001)
    open(path, "w").write(str(n + 1))
    lock.release()
"""


def test_second_holder_waits_then_hears_who_holds_it(tmp_path):
    first = Lock(str(tmp_path))
    first.acquire("resume")
    try:
        start = time.monotonic()
        with pytest.raises(LockBusy) as info:
            Lock(str(tmp_path)).acquire("cancel", wait=0.3)
        assert time.monotonic() - start >= 0.3
        assert info.value.holder["purpose"] == "resume"
        assert info.value.holder["pid"] == os.getpid()
        assert "resume by pid" in str(info.value)
    finally:
        first.release()
    again = Lock(str(tmp_path))
    again.acquire("cancel", wait=0)
    again.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_no_half_written_lock_and_no_leftovers(tmp_path):
    lock = Lock(str(tmp_path))
    with lock.held("submit"):
        holder, age = read(str(tmp_path / LOCK_NAME))
        assert holder["purpose"] == "submit" and age < 5
        assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_processes_under_the_lock_never_overlap(tmp_path):
    (tmp_path / "counter").write_text("0")
    procs = [
        subprocess.Popen([sys.executable, "-c", COUNTER, str(tmp_path), "40"]) for _ in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert (tmp_path / "counter").read_text() == "160"  # a lost update would show here


@pytest.mark.slow
def test_heartbeat_keeps_a_long_holder_fresh(tmp_path):
    lock = Lock(str(tmp_path), stale_after=0.5, heartbeat=0.05)
    with lock.held("resume"):
        time.sleep(1.0)
        assert read(str(tmp_path / LOCK_NAME))[1] < 0.5
        with pytest.raises(LockBusy):
            Lock(str(tmp_path), stale_after=0.5).acquire("cancel", wait=0.2)


def _stale(directory: Path, age: float = 120) -> None:
    path = directory / LOCK_NAME
    path.write_text(json.dumps({"purpose": "resume", "pid": 99999, "host": "gone", "time": 0}))
    old = time.time() - age
    os.utime(path, (old, old))


@pytest.mark.slow
def test_a_stale_lock_is_broken_once(tmp_path):
    """Waiters racing for a stale lock: exactly one holds it at a time (the counter proves it),
    and the lock left by a dead holder does not block anyone for ever."""
    for _ in range(5):
        _stale(tmp_path)
        (tmp_path / "counter").write_text("0")
        procs = [
            subprocess.Popen([sys.executable, "-c", COUNTER, str(tmp_path), "5"]) for _ in range(4)
        ]
        assert [p.wait(timeout=120) for p in procs] == [0] * 4
        assert (tmp_path / "counter").read_text() == "20"
        assert not any(p.name.startswith(LOCK_NAME) for p in tmp_path.iterdir())


def test_a_fresh_lock_is_never_broken(tmp_path):
    _stale(tmp_path, age=1)
    with pytest.raises(LockBusy):
        Lock(str(tmp_path), stale_after=60).acquire("cancel", wait=0.2)
    assert read(str(tmp_path / LOCK_NAME))[0]["pid"] == 99999


def test_release_after_a_break_leaves_the_new_holder_alone(tmp_path):
    first = Lock(str(tmp_path))
    first.acquire("resume")
    assert unlock(str(tmp_path))["purpose"] == "resume"
    second = Lock(str(tmp_path))
    second.acquire("cancel", wait=0)
    first.release()
    assert read(str(tmp_path / LOCK_NAME))[0]["purpose"] == "cancel"
    second.release()
    assert unlock(str(tmp_path)) is None


@pytest.mark.slow
def test_cli_says_who_holds_the_lock_and_unlock_breaks_it(tmp_path):
    root = local_sweep(tmp_path, f"command: [python, {PAYLOAD}]\nparams: {{x: [1]}}\n")[1][
        "sweep_dir"
    ]
    assert not (Path(root) / LOCK_NAME).exists()  # the submit let go of it
    held = Lock(root)
    held.acquire("resume")
    try:
        for args in (["cancel", root], ["sweep", "--resume", root, "--backend", "local"]):
            proc = run_cli(*args, env={"SLURMKIT_LOCK_WAIT": "0.2"})
            assert proc.returncode == 1, proc.stderr
            assert f"resume by pid {os.getpid()}" in proc.stderr
            assert f"slurmkit unlock {root}" in proc.stderr and "Traceback" not in proc.stderr
        assert run_cli("cancel", root, "--dry-run").returncode == 0  # a dry run reads only
        proc = run_cli("unlock", root)
        assert proc.returncode == 0 and "unlocked: it was held for resume" in proc.stdout
    finally:
        held.release()
    assert run_cli("unlock", root).stdout.strip() == "not locked"
    assert run_cli("cancel", root).returncode == 0
