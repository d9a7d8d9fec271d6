"""Requeue turnaround: from the stop signal to the resumed trial's first step, slurmkit's
requeue (its releaser starts the job again in place) against a plain batch script that runs
``scontrol requeue`` (Slurm's requeue hold: ``cred_expire`` + 1 s, 121 s by default), all in
one run on one cluster.

    SLURM_CONF=... python bench/turnaround.py          # a cluster of yours (SLURM_CONF set)
    python bench/turnaround.py                          # else it starts the test cluster

The cases run side by side (each its own job, so the same run and the same idle cluster):

- slurmkit, requeue signal: ``slurmkit sweep`` of a trial that checkpoints on USR2 and exits
  75; the bench sends ``scancel --batch --signal=USR2`` (preemption's way);
- slurmkit, time limit: the same trial with ``time: 1`` and ``requeue: {lead: 50}``: Slurm sends
  the signal before the limit;
- baseline: a plain ``sbatch`` script that forwards USR2 to the same trial and runs
  ``scontrol requeue $SLURM_JOB_ID`` on its exit 75 (the same signal, sent the same way).

The trial writes the time of its first step of each attempt (after reading its checkpoint, a
few bytes) and of the stop signal; turnaround = resumed first step - stop. Public tools only
(the slurmkit CLI, sbatch, scancel, scontrol). Target: <= 10 s against ~121 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# The trial: events.jsonl in its directory (SLURMKIT_TRIAL_DIR, or BENCH_DIR for the plain
# script): its first step of each attempt and its stop; a checkpoint of its step on a stop.
TRIAL = """
import json, os, signal, sys, time
where = os.environ.get("SLURMKIT_TRIAL_DIR") or os.environ["BENCH_DIR"]
stop = []
signal.signal(signal.SIGUSR2, lambda *_: stop.append(time.time()))
signal.signal(signal.SIGTERM, lambda *_: stop.append(time.time()))
ckpt = os.path.join(where, "ckpt.json")
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
def event(**kw):
    with open(os.path.join(where, "events.jsonl"), "a") as fh:
        fh.write(json.dumps({"t": time.time(), **kw}) + "\\n")
event(ev="step", step=step)
first = step == 0
while first or step < int(sys.argv[1]):
    if stop:
        json.dump({"step": step}, open(ckpt, "w"))
        event(ev="stop", step=step, signalled=stop[0])
        sys.exit(75)
    time.sleep(0.1)
    step += 1
event(ev="done", step=step)
"""

PLAIN = """#!/bin/bash
#SBATCH --job-name=bench-plain
#SBATCH --requeue
#SBATCH --output={dir}/slurm.out
#SBATCH --open-mode=append
export BENCH_DIR={dir}
trap 'kill -USR2 $pid' USR2
{py} {trial} 20 &
pid=$!
while :; do wait $pid; rc=$?; kill -0 $pid 2>/dev/null || break; done
if [ $rc -eq 75 ]; then scontrol requeue $SLURM_JOB_ID; fi
exit $rc
"""


def spec(trial: Path, name: str, extra: str = "") -> str:
    return (
        f"name: {name}\noutput_root: {trial.parent / 'runs'}\n"
        f"command: [{PY}, {trial}, '20']\nparams: {{x: [1]}}\n{extra}"
    )


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def events(where: Path) -> list[dict]:
    path = where / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def trial_dir(root: str) -> Path:
    row = json.loads((Path(root) / "trials.jsonl").read_text().splitlines()[0])
    return Path(root) / "trials" / row["id"]


def sweep(tmp: Path, trial: Path, name: str, extra: str = "") -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(spec(trial, name, extra))
    out = run(PY, "-m", "slurmkit.cli", "sweep", str(path), "--json", "--backend", "slurm")
    return json.loads(out)["sweep_dir"]


def turnaround(where: Path) -> float | None:
    """Resumed first step - stop, once the second attempt has stepped."""
    evs = events(where)
    stops = [e for e in evs if e["ev"] == "stop"]
    steps = [e for e in evs if e["ev"] == "step"]
    if stops and len(steps) >= 2:
        return steps[1]["t"] - stops[0]["signalled"]
    return None


def wait_for(ready, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while not ready():
        if time.time() > end:
            raise SystemExit(f"turnaround: timed out waiting for {what}")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=400, help="seconds for all cases")
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF"):
        conf = run(str(ROOT / "tests/cluster/up.sh")).strip().splitlines()[-1]
        os.environ["SLURM_CONF"] = conf
    tmp = Path(tempfile.mkdtemp(prefix="turnaround-"))
    trial = tmp / "trial.py"
    trial.write_text(TRIAL)
    plain = tmp / "plain"
    plain.mkdir()
    script = tmp / "plain.sbatch"
    script.write_text(PLAIN.format(dir=plain, py=PY, trial=trial))
    signalled = sweep(tmp, trial, "signal")
    timed = sweep(tmp, trial, "timelimit", "resources: {time: 1}\nrequeue: {lead: 50}\n")
    job = run("sbatch", "--parsable", str(script)).strip().split(";")[0]
    cases = {
        "slurmkit, requeue signal": trial_dir(signalled),
        "slurmkit, time limit": trial_dir(timed),
        "plain scontrol requeue (baseline)": plain,
    }
    wait_for(lambda: events(cases["slurmkit, requeue signal"]) and events(plain), 120, "starts")
    time.sleep(1)
    task = json.loads((Path(signalled) / "submissions/0000.json").read_text())["jobs"][0]
    run("scancel", "--batch", "--signal=USR2", f"{task['job_id']}_0")
    run("scancel", "--batch", "--signal=USR2", job)
    wait_for(lambda: all(turnaround(w) is not None for w in cases.values()), args.timeout, "all")
    base = turnaround(plain) or 1.0
    print("| case | stop -> resumed first step | against the baseline |")
    print("| --- | --- | --- |")
    for name, where in cases.items():
        t = turnaround(where) or 0.0
        print(f"| {name} | {t:.2f} s | {t / base:.3f}x |")
    hold = run("scontrol", "show", "config")
    expire = next((x for x in hold.split(",") if "cred_expire" in x), "cred_expire=120 (default)")
    print(f"\ncluster: {expire.strip()}; target: <= 10 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
