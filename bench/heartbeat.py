"""The hang watchdog's costs, each against a baseline measured in the same run.

    python bench/heartbeat.py                  # slurmkit.heartbeat() per call, in a trial
    python bench/heartbeat.py --cluster        # a hang's cost on the test cluster (SLURM_CONF)

``heartbeat()`` (``--calls``, default 1,000,000 calls, best of 5 runs): a trial's call, its
rank file on this machine's disk, against an empty Python function call and ``time.time()``;
and the touch itself (the one call a second that writes), alone. Target: <= 50 us a call.

``--cluster``: two one-node trials that report 5 times and then stop, submitted together:
``requeue: {hang_timeout: T}`` (T = ``--timeout``, default 20) against no watchdog
(``hang_timeout: 0``) with a ``--limit`` minute time limit (default 3). Each one's cost is the
time its allocation was held after its last progress: sacct's End of the job minus the last
progress (its rank file's mtime: a trial killed at its time limit records no end of its own).
Target: the watchdog's <= T + 30 s, against the time limit's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _best(fn, calls: int, runs: int = 5) -> float:
    """Seconds per call of ``fn`` (a loop of ``calls``), the best of ``runs``."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def calls(n: int) -> None:
    with tempfile.TemporaryDirectory() as trial:
        os.environ["SLURMKIT_TRIAL_DIR"] = trial
        from slurmkit.runtime import progress

        def empty() -> None:
            pass

        progress.heartbeat()  # the first call makes the rank file and arms the dump
        rows = {
            "empty function call": _best(empty, n),
            "time.time()": _best(time.time, n),
            "slurmkit.heartbeat()": _best(progress.heartbeat, n),
        }
        path = os.path.join(trial, progress.DIRNAME, progress.rank())
        rows["the touch (os.utime, once a second)"] = _best(lambda: os.utime(path), n // 100)
    base = rows["empty function call"]
    print(f"{'':40} {'us/call':>9} {'x empty call':>13}")
    for name, sec in rows.items():
        print(f"{name:40} {sec * 1e6:9.3f} {sec / base:13.1f}")
    met = rows["slurmkit.heartbeat()"] <= 50e-6
    print(f"target: heartbeat() <= 50 us: {'met' if met else 'MISSED'}")


PAYLOAD = """
import time, slurmkit
for i in range(5):
    slurmkit.report(step=i)
    time.sleep(0.5)
time.sleep(3600)  # stops
"""


def _submit(work: Path, name: str, requeue: str, limit: int) -> Path:
    (work / "stop.py").write_text(PAYLOAD)
    spec = work / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\ncommand: [{sys.executable}, {work / 'stop.py'}]\n"
        f"resources: {{time: '{limit}:00'}}\nrequeue: {requeue}\n"
    )
    slurmkit = str(Path(sys.executable).with_name("slurmkit"))
    cli = [slurmkit, "submit", str(spec), "--backend", "slurm", "--json"]
    out = subprocess.run(
        [*cli, f"output_root={work / 'runs'}"], capture_output=True, text=True, check=True
    )
    return Path(json.loads(out.stdout)["sweep_dir"])


def _end(job: str) -> float | None:
    out = subprocess.run(
        ["sacct", "-j", job, "-X", "-n", "-P", "-o", "End,State"], capture_output=True, text=True
    )
    for line in out.stdout.splitlines():
        end, state = line.split("|")[:2]
        if end not in ("Unknown", "None", "") and not state.startswith(("RUNNING", "PENDING")):
            return datetime.fromisoformat(end).timestamp()
    return None


def cluster(timeout: int, limit: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-hang-", dir=os.environ.get("BENCH_DIR")))
    runs = {
        f"hang_timeout: {timeout}": _submit(
            work, "watched", f"{{hang_timeout: {timeout}, budgets: {{hang: 0}}}}", limit
        ),
        f"no watchdog ({limit} min limit)": _submit(
            work, "unwatched", "{enabled: false, hang_timeout: 0}", limit
        ),
    }
    results: dict[str, tuple[float, str]] = {}
    deadline = time.time() + limit * 60 + 180
    while len(results) < len(runs) and time.time() < deadline:
        time.sleep(5)
        for name, root in runs.items():
            if name in results:
                continue
            status = next((root / "trials").glob("*/status.json"), None)
            record = json.loads(status.read_text()) if status else {}
            job = (record.get("attempts") or [{}])[0].get("job_id")
            end = _end(job) if job else None
            # the last progress: the rank files' mtimes (a trial killed at its time limit
            # records no end of its own)
            files = [p for p in root.glob("trials/*/progress/*") if p.name.isdigit()]
            last = max((p.stat().st_mtime for p in files), default=None)
            if end is not None and last is not None:
                results[name] = (end - last, record.get("cause") or record.get("state", ""))
    print(f"{'':34} {'held after the last progress (s)':>34} cause")
    for name, (held, cause) in results.items():
        print(f"{name:34} {held:34.1f} {cause}")
    watched = results.get(f"hang_timeout: {timeout}")
    if watched:
        met = "met" if watched[0] <= timeout + 30 else "MISSED"
        print(f"target: <= hang_timeout + 30 s = {timeout + 30} s: {met}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--timeout", type=int, default=20)
    parser.add_argument("--limit", type=int, default=3)
    args = parser.parse_args()
    if args.cluster:
        cluster(args.timeout, args.limit)
    else:
        calls(args.calls)


if __name__ == "__main__":
    main()
