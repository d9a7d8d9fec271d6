"""Hundreds of trials reaching one rung at once: no record is lost, and each decision is the
rule's for the records it saw, with its own among them; of any two trials, one saw the other's
record (each records before it lists: the decisions are right for some order of the records)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import slurmkit
from slurmkit.core import search
from slurmkit.runtime import pruning

SEARCH = {"metric": "loss", "max_resource": 27, "reduction_factor": 3}

# One trial's process: it keeps the listing its decision read (seen.json), waits for the start
# file, then reports once at rung 0.
WORKER = r"""
import json, os, sys, time
from slurmkit.core import search
here = os.environ["SLURMKIT_TRIAL_DIR"]
listing = search.rung_values
def spy(root, k, own=None):
    out = listing(root, k, own)
    with open(os.path.join(here, "seen.json"), "w") as fh:
        json.dump(out, fh)
    return out
search.rung_values = spy
import slurmkit
go = sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.005)
try:
    slurmkit.report(step=1, loss=float(sys.argv[1]))
except slurmkit.Pruned:
    pass
"""


def check(root: Path, values: dict[str, float]) -> None:
    """Every record kept; each decision is the rule's for what it saw, its own included; of any
    two trials one saw the other."""
    s = search.Search.from_dict(SEARCH, "x")
    assert search.rung_values(str(root), 0) == values
    seen: dict[str, set[str]] = {}
    for trial, value in values.items():
        tdir = root / "trials" / trial
        saw = json.loads((tdir / "seen.json").read_text())
        assert saw.get(trial) == value and set(saw) <= set(values)
        entry = search.decisions(str(tdir))["rungs"][0]
        keep = search.keep_asha(value, list(saw.values()), s.reduction_factor, s.mode)
        assert entry["decision"] == ("continue" if keep else "pruned"), (trial, entry)
        assert entry["seen"] == len(saw)
        seen[trial] = set(saw)
    names = sorted(values)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert a in seen[b] or b in seen[a], (a, b)
    # the last to list saw everything: its decision is the rule's over all the records
    assert any(len(saw) == len(values) for saw in seen.values())


def _values(n: int) -> dict[str, float]:
    rng = random.Random(n)
    return {f"t{i:03d}": float(rng.randint(0, 30)) for i in range(n)}  # ties included


@pytest.mark.slow
def test_200_processes_at_one_rung(tmp_path):
    values = _values(200)
    go = tmp_path / "go"
    env = {**os.environ, pruning.ENV: json.dumps(SEARCH)}
    procs = []
    for trial, value in values.items():
        tdir = tmp_path / "trials" / trial
        tdir.mkdir(parents=True)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, repr(value), str(go)],
                env={**env, "SLURMKIT_TRIAL_DIR": str(tdir)},
            )
        )
    time.sleep(1.0)  # most of them are waiting for the start file by now
    go.touch()
    assert [p.wait(300) for p in procs] == [0] * len(procs)  # Pruned ends a process with 0
    check(tmp_path, values)


def test_50_threads_at_one_rung(tmp_path, monkeypatch):
    """Fast twin: threads of one process, each its own trial."""
    values = _values(50)
    s = search.Search.from_dict(SEARCH, "x")
    listing = search.rung_values
    local = threading.local()

    def spy(root: str, k: int, own: tuple[str, float] | None = None) -> dict[str, float]:
        out = listing(root, k, own)
        (Path(local.dir) / "seen.json").write_text(json.dumps(out))
        return out

    monkeypatch.setattr(search, "rung_values", spy)
    start = threading.Barrier(len(values))

    def trial(name: str, value: float) -> None:
        local.dir = tmp_path / "trials" / name
        local.dir.mkdir(parents=True)
        state = pruning.TrialSearch(s, str(local.dir), 0)
        start.wait()
        try:
            state.check(1, {"loss": value})
        except slurmkit.Pruned:
            pass

    threads = [threading.Thread(target=trial, args=item) for item in values.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    monkeypatch.undo()
    check(tmp_path, values)
