"""The search's costs (issue 25, Performance), each against a baseline measured in the same run.

    .venv/bin/python bench/asha_decision.py                 # local disk: a directory under /tmp
    .venv/bin/python bench/asha_decision.py --dir /shared   # another filesystem

1. A rung decision with N (default 10,000) trials' records at that rung: the rung's listing and
   the rule (``decision_ms``), and the whole step a trial takes at a rung (its record created
   first, its search.json written after: ``rung_step_ms``), the median of ``--decisions`` runs,
   each a new trial on the same rung; against reading N small files (one JSON value each: the
   layout the value-in-the-name avoids), page cache warm for both. Target: <= 20 ms.
2. ``report()`` between rungs under a search against today's ``report()`` (``--today FILE``, else
   the ``slurmkit/runtime/report.py`` of ``git show 459d2fb:...``, the last commit before the
   search, loaded as a module; else this tree's without a search): ``--reports`` reports each,
   alternated in ``--rounds``, in one trial directory each, wall and CPU time (the wall time is
   mostly the fsync of metrics.json, which both make); and the search's own part alone (its per-
   process state looked up, the step compared with the next rung). Target: no more than today's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEFORE = "459d2fb"  # main before the search (issue 25): report() as it was
sys.path.insert(0, ROOT)

from slurmkit.core import search  # noqa: E402
from slurmkit.runtime import pruning  # noqa: E402

SEARCH = {"metric": "val_loss", "max_resource": 10**9, "reduction_factor": 3}


def fill_rung(sweep: str, n: int) -> None:
    """N records at rung 0 (made directly: the bench times one decision, not N)."""
    directory = search.rung_dir(sweep, 0)
    os.makedirs(directory)
    for i in range(n):
        open(os.path.join(directory, search.record_name(f"t{i:06d}", math.sin(i))), "w").close()


def fill_files(where: str, n: int) -> None:
    os.makedirs(where)
    for i in range(n):
        with open(os.path.join(where, f"t{i:06d}.json"), "w") as fh:
            json.dump({"value": math.sin(i)}, fh)


def read_files(where: str) -> dict[str, float]:
    out = {}
    for name in os.listdir(where):
        with open(os.path.join(where, name), "rb") as fh:
            out[name] = json.load(fh)["value"]
    return out


def one_decision(
    sweep: str, s: search.Search, trial: str, value: float
) -> tuple[float, float, float]:
    """What pruning.TrialSearch._decide does at a rung (rank 0): the decision (the rung's listing
    and the rule) and the whole step (its record created first, its search.json written after;
    a "continue" is not flushed, a pruning is), in ms; and the decision's CPU time."""
    tdir = os.path.join(sweep, "trials", trial)
    os.makedirs(tdir)
    t0 = time.perf_counter()
    search.record(sweep, 0, trial, value)
    t1, c1 = time.perf_counter(), time.process_time()
    seen = search.rung_values(sweep, 0, (trial, value))
    entry = search.decide(s, 0, trial, value, 1, seen)
    t2, c2 = time.perf_counter(), time.process_time()
    search.write_decision(tdir, entry)
    t3 = time.perf_counter()
    assert entry["seen"] == len(seen)
    return (t2 - t1) * 1e3, (t3 - t0) * 1e3, (c2 - c1) * 1e3


def decisions(base: str, n: int, runs: int) -> dict[str, Any]:
    sweep, files = os.path.join(base, "sweep"), os.path.join(base, "files")
    fill_rung(sweep, n)
    fill_files(files, n)
    s = search.Search.from_dict(SEARCH, "bench")
    read_files(files)  # warm both
    search.rung_values(sweep, 0)
    decided, steps, cpu, theirs, their_cpu = [], [], [], [], []
    for i in range(runs):
        # values from the best to the worst: about a third of them pruned (flushed)
        took, step, used = one_decision(sweep, s, f"new{i:04d}", 0.5 - i / runs)
        decided.append(took)
        steps.append(step)
        cpu.append(used)
        t0, c0 = time.perf_counter(), time.process_time()
        got = read_files(files)
        theirs.append((time.perf_counter() - t0) * 1e3)
        their_cpu.append((time.process_time() - c0) * 1e3)
        assert len(got) == n
    return {
        "records": n,
        "decision_ms": statistics.median(decided),
        "decision_ms_max": max(decided),
        "rung_step_ms": statistics.median(steps),
        "rung_step_ms_max": max(steps),
        "read_files_ms": statistics.median(theirs),
        "decision_to_read_files": statistics.median(decided) / statistics.median(theirs),
        "decision_cpu_ms": statistics.median(cpu),
        "read_files_cpu_ms": statistics.median(their_cpu),
    }


def main_report(path: str | None) -> tuple[ModuleType | None, str]:
    """Today's report.py (``path``, else the main branch's from git), loaded beside this tree's
    runtime package; None where neither can be read."""
    try:
        if path:
            with open(path, encoding="utf-8") as fh:
                src, name = fh.read(), path
        else:
            src = subprocess.run(
                ["git", "-C", ROOT, "show", f"{BEFORE}:slurmkit/runtime/report.py"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            name = f"{BEFORE}:slurmkit/runtime/report.py"
    except (OSError, subprocess.CalledProcessError):
        return None, "this tree, no search"
    spec = importlib.util.spec_from_loader("slurmkit.runtime._report_main", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "slurmkit.runtime"
    exec(compile(src, name, "exec"), module.__dict__)
    return module, name


def timed(fn: Callable[[int], None], count: int) -> tuple[float, float]:
    """Wall and CPU time per call of ``fn(step)``, in µs."""
    w0, c0 = time.perf_counter(), time.process_time()
    for step in range(count):
        fn(step)
    return (time.perf_counter() - w0) / count * 1e6, (time.process_time() - c0) / count * 1e6


def reports(base: str, count: int, rounds: int, today_path: str | None) -> dict[str, Any]:
    """Today's report() and ours between rungs, alternated ``rounds`` times; and the search's
    part of ours alone (its state looked up, the step compared with the next rung)."""
    ours = importlib.import_module("slurmkit.runtime.report")
    today, baseline = main_report(today_path)
    today = today or ours
    plain, judged = os.path.join(base, "plain"), os.path.join(base, "trials", "judged")
    os.makedirs(plain)
    os.makedirs(judged)
    spec = json.dumps({**SEARCH, "min_resource": 10**8})  # no rung within the bench's steps
    a: list[tuple[float, float]] = []
    b: list[tuple[float, float]] = []
    for _ in range(rounds):
        os.environ.pop(pruning.ENV, None)
        os.environ["SLURMKIT_TRIAL_DIR"] = plain
        a.append(timed(lambda step: today.report(step=step, val_loss=1.0 / (step + 1)), count))
        os.environ[pruning.ENV] = spec
        os.environ["SLURMKIT_TRIAL_DIR"] = judged
        b.append(timed(lambda step: ours.report(step=step, val_loss=1.0 / (step + 1)), count))
    check = timed(
        lambda step: pruning.trial(judged).check(step, {"val_loss": 1.0}),  # type: ignore[union-attr]
        count * 100,
    )
    wall_a, cpu_a = (statistics.median(x[i] for x in a) for i in (0, 1))
    wall_b, cpu_b = (statistics.median(x[i] for x in b) for i in (0, 1))
    return {
        "baseline": baseline,
        "reports": count * rounds,
        "today_wall_us": wall_a,
        "with_search_wall_us": wall_b,
        "wall_ratio": wall_b / wall_a,
        "today_cpu_us": cpu_a,
        "with_search_cpu_us": cpu_b,
        "cpu_ratio": cpu_b / cpu_a,
        "search_part_cpu_us": check[1],
        "search_part_share_of_today_cpu": check[1] / cpu_a,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="where to work (default: a new dir under /tmp)")
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--decisions", type=int, default=21)
    p.add_argument("--reports", type=int, default=500)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--today", help=f"today's report.py (default: git show {BEFORE}:...)")
    args = p.parse_args()
    base = tempfile.mkdtemp(prefix="slurmkit-asha-bench-", dir=args.dir or "/tmp")
    try:
        out = {
            "python": sys.version.split()[0],
            "dir": base,
            "decision": decisions(base, args.records, args.decisions),
            "report": reports(base, args.reports, args.rounds, args.today),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
